"""Downstream tasks: the fine-tuning loop, classification, GLUE, SQuAD, tasks made from a corpus."""
