"""Data: corpus readers, tokenisation, pre-training instances and their records, the input
pipeline."""
