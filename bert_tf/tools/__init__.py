"""The cost model: the planner (days and price of a run), per-rank memory, the model's FLOP counts.
Arithmetic only, no TensorFlow (tests/test_no_tensorflow.py)."""
