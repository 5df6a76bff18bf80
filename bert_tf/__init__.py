"""bert_tf: BERT pre-training on ordinary clusters (TensorFlow 2 + Horovod)."""

__version__ = "0.1.0"
