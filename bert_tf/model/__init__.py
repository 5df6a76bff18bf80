"""The model: BertConfig and BERT top to bottom (modeling.py)."""
