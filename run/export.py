"""Exports the encoder of a pre-training run, the layout google-research/bert users know:

    python run/export.py --checkpoint=runs/demo --vocab_file=data/demo/vocab.txt --output_dir=runs/demo_export

writes  <output_dir>/bert_model.ckpt.*   encoder only (heads dropped); run/finetune.py --init_checkpoint reads it
        <output_dir>/bert_config.json
        <output_dir>/vocab.txt
        <output_dir>/saved_model/        serve(input_ids, input_mask, segment_ids) -> sequence_output, pooled_output
"""
import os
import shutil

from absl import app, flags

flags.DEFINE_string("checkpoint", None, "Pre-training checkpoint, or its folder (the latest is used).")
flags.DEFINE_string("bert_config_file", "", "Default: bert_config.json beside the checkpoint.")
flags.DEFINE_string("vocab_file", None, "The vocab.txt the model was pre-trained with.")
flags.DEFINE_string("output_dir", None, "Export folder.")
flags.mark_flags_as_required(["checkpoint", "vocab_file", "output_dir"])
FLAGS = flags.FLAGS


def main(_):
    import tensorflow as tf

    from bert_tf import classification, modeling, tokenization
    checkpoint = tf.train.latest_checkpoint(FLAGS.checkpoint) if os.path.isdir(FLAGS.checkpoint) else FLAGS.checkpoint
    if not checkpoint or not tf.io.gfile.exists(checkpoint + ".index"):
        raise SystemExit(f"error: --checkpoint={FLAGS.checkpoint}: no checkpoint found")
    config_file = FLAGS.bert_config_file or os.path.join(os.path.dirname(checkpoint), "bert_config.json")
    config = modeling.BertConfig.from_json_file(config_file)
    vocab = tokenization.load_vocab(FLAGS.vocab_file)
    encoder = modeling.BertEncoder(config)
    try:
        classification.load_encoder(encoder, checkpoint, len(vocab))
    except ValueError as e:
        raise SystemExit(f"error: {e}")
    os.makedirs(FLAGS.output_dir, exist_ok=True)
    classification.save_encoder(encoder, os.path.join(FLAGS.output_dir, "bert_model.ckpt"))
    config.to_json_file(os.path.join(FLAGS.output_dir, "bert_config.json"))
    shutil.copyfile(FLAGS.vocab_file, os.path.join(FLAGS.output_dir, "vocab.txt"))
    tf.saved_model.save(classification.ServingEncoder(encoder), os.path.join(FLAGS.output_dir, "saved_model"))
    print(f"exported {checkpoint} -> {FLAGS.output_dir} (bert_model.ckpt, bert_config.json, vocab.txt, saved_model/)")


if __name__ == "__main__":
    app.run(main)
