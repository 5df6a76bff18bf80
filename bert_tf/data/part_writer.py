"""Writing one part's shards (bert_tf.data.pretraining_data): a window of tokenised documents at a
time becomes instances (instances), config.dupe_factor passes with different masks, written as
TFRecords (records) as they come and counted per split."""

from __future__ import annotations

import dataclasses
import os

from bert_tf.data.instances import (
    Counts,
    create_instances,
    document_rng,
    pack_full_sentences,
    pack_instances,
)
from bert_tf.data.records import ShardWriter, serialize, serialize_packed


class PartWriter:
    """A part's train and eval shards (opened at their first record) and their Counts: a window's
    documents become instances, pass by pass, written as they come."""

    def __init__(self, tokenizer, output_dir, name, config):
        self.output_dir, self.name, self.config = output_dir, name, config
        self.vocab_size = len(tokenizer)
        self.special = {"CLS": tokenizer.cls_id, "SEP": tokenizer.sep_id, "MASK": tokenizer.mask_id}
        self.word_starts = [not t.startswith("##") for t in tokenizer.vocab]
        self.counts = {"train": Counts(), "eval": Counts()}
        self.writers = {}
        # full_sentences: (split, dupe) -> the sequence that runs into the next window
        self.running = {}

    def add(self, split, members):
        """One window's documents of `split` ([(document seed, token-id lists)]), config.dupe_factor
        passes."""
        config = self.config
        if split not in self.writers:
            self.writers[split] = ShardWriter(
                os.path.join(self.output_dir, f"{split}-{self.name}.tfrecord")
            )
        pool = [tokens for _, tokens in members]
        for dupe in range(config.dupe_factor):
            if config.full_sentences:
                self._write_full_sentences(split, members, dupe)
                continue
            instances = [
                inst
                for j, (seed, _) in enumerate(members)
                for inst in create_instances(
                    j,
                    pool,
                    config,
                    self.special,
                    self.vocab_size,
                    self.word_starts,
                    dupe=dupe,
                    doc_id=seed,
                    counts=self.counts[split],
                )
            ]
            # a window's instances packed together; rows shuffled per window and pass
            if config.pack:
                rows = pack_instances(
                    instances, config, document_rng(config.random_seed, dupe, members[0][0], "pack")
                )
                self._write(split, (serialize_packed(row, config) for row in rows))
            else:
                self._write(split, (serialize(inst, config) for inst in instances))

    def flush(self):
        """Ends the FULL-SENTENCES streams: their unfinished sequences written."""
        for split, dupe in sorted(self.running):
            self._write_full_sentences(split, [], dupe, flush=True)

    def close(self, part):
        for split, writer in self.writers.items():
            part["files"][split] = writer.close()
            part[split] = dataclasses.asdict(self.counts[split])

    def abort(self):
        for writer in self.writers.values():
            writer.abort()

    def _write(self, split, records):
        for record in records:
            self.writers[split].write(record)
            self.counts[split].rows += 1

    def _write_full_sentences(self, split, members, dupe, flush=False):
        self._write(
            split,
            (
                serialize(inst, self.config)
                for inst in pack_full_sentences(
                    members,
                    self.running.setdefault((split, dupe), {}),
                    self.config,
                    self.special,
                    self.vocab_size,
                    self.word_starts,
                    dupe,
                    self.counts[split],
                    flush,
                )
            ),
        )
