"""The shape rules of the code base (docs/design.md): modules and functions small enough to read,
and the training path free of data creation and tooling. Static (no TensorFlow import here), but for
one subprocess that imports the trainer and checks that doing so ran no TensorFlow op."""
import ast
import os
import subprocess
import sys

from conftest import REPO

MAX_MODULE_LINES = 450
MAX_FUNCTION_LINES = 60


def python_files(*folders):
    return sorted(p for folder in folders for p in (REPO / folder).rglob("*.py"))


def test_no_module_over_450_lines_and_no_function_over_60():
    too_long = []
    for path in python_files("bert_tf", "run"):
        source = path.read_text()
        lines = source.count("\n")
        if lines > MAX_MODULE_LINES:
            too_long.append(f"{path.relative_to(REPO)}: {lines} lines")
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    too_long.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name}: {length} lines")
    assert not too_long, "\n".join(too_long)


def imported_modules(path):
    """Every bert_tf module a file imports, at any depth (lazy imports too)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("bert_tf"):
            found |= {f"{node.module}.{alias.name}" for alias in node.names}
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.startswith("bert_tf")}
    return found


def test_training_imports_neither_data_creation_nor_tooling():
    """The training path (bert_tf/train, bert_tf/parallel, bert_tf/model) reads records; it does not make them,
    and measurement tools are not imported for its log lines. The exceptions ask the cost planner, lazily: a
    time-budgeted run how long its updates take (train/budget.py), --exchange=auto which exchange is
    fastest (parallel/auto_exchange.py), both with the gradient shapes the planner takes."""
    creation = {"bert_tf.data.pretraining_data", "bert_tf.data.instances", "bert_tf.data.corpus",
                "bert_tf.data.dedup"}
    offenders = []
    for path in python_files("bert_tf/train", "bert_tf/parallel", "bert_tf/model"):
        for module in imported_modules(path):
            allowed = path.name in ("budget.py", "auto_exchange.py") and module in (
                "bert_tf.tools.planner", "bert_tf.tools.model_shapes")
            made = any(module == c or module.startswith(c + ".") for c in creation)
            if (made or module.startswith("bert_tf.tools.")) and not allowed:
                offenders.append(f"{path.relative_to(REPO)} imports {module}")
    assert not offenders, "\n".join(offenders)


def module_name(path):
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph():
    """bert_tf module -> the bert_tf modules it imports (`from bert_tf.a import b`: module a.b if it is one,
    else a), lazy imports included: a cycle through a function-level import is still a cycle."""
    modules = {module_name(p): p for p in python_files("bert_tf")}
    graph = {}
    for name, path in modules.items():
        targets = set()
        for imported in imported_modules(path):
            while imported and imported not in modules:
                imported = imported.rpartition(".")[0]
            if imported and imported != name and imported != "bert_tf":
                targets.add(imported)
        graph[name] = targets
    return graph


def test_no_import_cycles():
    """No two modules of bert_tf import each other, directly or around a loop (no exceptions)."""
    graph, cycles = import_graph(), []
    state = {}

    def visit(node, stack):
        state[node] = "open"
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                cycles.append(" -> ".join(stack[stack.index(nxt):] + [nxt]))
            elif nxt not in state:
                visit(nxt, stack + [nxt])
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    assert not cycles, "\n".join(cycles)


def test_the_library_never_imports_the_studies():
    """bert_tf/studies/ (emulated cluster, communication study, recipe race, speed ladder, op profiles, the
    spot-cluster run) is apparatus for docs/results.md: no module outside it imports it, lazily or not."""
    offenders = [f"{path.relative_to(REPO)} imports {module}"
                 for path in python_files("bert_tf") if "studies" not in path.parts
                 for module in imported_modules(path) if module.startswith("bert_tf.studies")]
    assert not offenders, "\n".join(offenders)


def test_importing_the_trainer_runs_no_tensorflow_op():
    """distributed.init sets each rank's thread pools, which TensorFlow refuses once any op has run (it then
    keeps its own and the start-up line says 0 / 0). So importing what run/pretrain.py imports runs none:
    a module-level tf.constant in a module the optimizer imported did, and every rank lost its settings."""
    code = ("import bert_tf.train.pretraining, bert_tf.train.training, bert_tf.train.optimization\n"
            "import tensorflow as tf\n"
            "tf.config.threading.set_intra_op_parallelism_threads(1)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr[-2000:]
