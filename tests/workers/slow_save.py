"""run/pretrain.py with rank 0's first checkpoint save made slow on purpose (SLOW_SAVE_SECONDS, default 25):
for tests/test_distributed.py's test that the other ranks wait for a save under --save_timeout_minutes, not
the collective timeout. Arguments: run/pretrain.py's flags."""
import os
import runpy
import sys
import time

from bert_tf.artifacts import checkpointing

PRETRAIN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "run", "pretrain.py")
_save = checkpointing.Checkpoints.save
slept = []


def slow_save(self, step, extra=None):
    if self.is_writer and not slept:          # rank 0 (the writer), first save only: the next one is timed short
        slept.append(step)
        time.sleep(float(os.environ.get("SLOW_SAVE_SECONDS", "25")))
    return _save(self, step, extra)


checkpointing.Checkpoints.save = slow_save
sys.argv[0] = PRETRAIN
runpy.run_path(PRETRAIN, run_name="__main__")
