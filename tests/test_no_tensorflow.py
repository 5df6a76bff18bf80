"""The settings and the cost model are arithmetic: PretrainConfig, BertConfig, the planner, the FLOP counts
and run/plan.py work in a Python where TensorFlow, Horovod and tensorflow-text cannot be imported (a login
node, a laptop planning a cluster run)."""
import subprocess
import sys

from conftest import REPO

# Every later `import tensorflow` (or horovod, tensorflow_text, keras) raises, as on a machine without them.
BLOCK = """
import importlib.abc, sys
class _Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("tensorflow", "horovod", "tensorflow_text", "keras"):
            raise ImportError(f"{name} is not importable here (the test blocks it)")
sys.meta_path.insert(0, _Block())
"""


def run_blocked(code, *args):
    return subprocess.run([sys.executable, "-c", BLOCK + code, *args], capture_output=True, text=True, cwd=REPO,
                          timeout=120)


def test_the_block_works():
    proc = run_blocked("import tensorflow")
    assert proc.returncode != 0 and "not importable here" in proc.stderr


def test_configs_planner_and_flop_counts_import_no_tensorflow():
    proc = run_blocked("""
from bert_tf.train.pretrain_config import PretrainConfig
from bert_tf.model.config import BertConfig
from bert_tf.tools import flops, memory, model_shapes, planner
from bert_tf.parallel import auto_exchange, comm
from bert_tf.studies import arm_size, race_launch, race_seeds, race_sweep, recipe_race
cfg = PretrainConfig(model_preset="mini", checkpoint_dir="ckpt", vocab_file="vocab.txt")
print(cfg.micro_batch_size, round(flops.training_flops_per_sequence(BertConfig.preset("base"), 128, 20) / 1e9, 1))
print(sorted(m for m in sys.modules if m.split(".")[0] in ("tensorflow", "horovod")))
""")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split("\n")[1] == "[]"


def test_run_plan_plans_without_tensorflow():
    run_plan = "import runpy; sys.argv = sys.argv[1:]; runpy.run_path('run/plan.py', run_name='__main__')"
    helped = run_blocked(run_plan, "run/plan.py", "--helpfull")
    # absl's --helpfull exits 1 after printing; an import error would leave a traceback and no flags
    assert "--model_preset" in helped.stdout and "Traceback" not in helped.stderr, helped.stderr[-3000:]
    planned = run_blocked(run_plan, "run/plan.py", "--model_preset=base", "--exchange_memory=16,64")
    assert planned.returncode == 0, planned.stderr[-3000:]
    assert "gradient exchange state per rank" in planned.stdout and "64 ranks  powersgd rank 8" in planned.stdout, \
        planned.stdout[-2000:]
