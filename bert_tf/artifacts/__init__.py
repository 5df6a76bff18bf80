"""What a run leaves behind: checkpoints (own and foreign formats), metrics, the model card."""
