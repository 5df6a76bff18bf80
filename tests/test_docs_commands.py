"""Every shell command that README.md and the guides in DOCS show in a code block is run by some
test, verbatim or with only step counts shortened; or, when it needs what this machine lacks (16
ranks on 4 nodes, GPUs), parsed by the tool that would run it; or listed with the reason it cannot
run here. COMMANDS is that register. A command the docs show and COMMANDS does not list fails
test_every_documented_command_is_registered, so the docs cannot grow untested commands.

The commands run here take their argument lists from the register's keys (the docs' text), so
what runs is what the docs say. They run in one work directory laid out like the checkout (code
linked, data made small; tests/services.py) and build on each other as a reader would: the demo
pre-training, its export, continued pre-training and fine-tuning from it, the recipes' dry runs."""
import ast
import concurrent.futures
import dataclasses
import json
import os
import re
import shlex
import shutil
import subprocess
import sys

import pytest

from conftest import REPO
import services

# README.md and the guides that show commands (the README's how-to moved into docs/*.md guides; the
# register is the same, only the files scanned for it grew). docs/results.md and docs/design.md are not
# scanned: their code blocks record how figures were measured, not commands for the reader to run.
DOCS = ("README.md", "docs/operations.md", "docs/pretraining.md", "docs/elastic.md", "docs/gpu.md",
        "docs/data.md", "docs/finetuning.md", "docs/measuring.md", "docs/testing.md")
THIS = "test_docs_commands.py"


@dataclasses.dataclass(frozen=True)
class Coverage:
    kind: str     # "test": a named test runs it; "here"/"parsed": this file runs/parses it; "not_here"
    test: str     # "test_file.py::function" (for not_here, the test that checks the reason still holds)
    note: str     # what differs from the docs' text, or why it cannot run here
    uses: str = ""   # kind "test": text the named test (or a fixture/helper it uses) must contain; default:
                     # the script the command runs (test_the_register_names_tests_that_use_their_commands)


def by(test, note="", uses=""):
    return Coverage("test", test, note, uses)


def here(test, note=""):
    return Coverage("here", f"{THIS}::{test}", note)


def parsed(test, note):
    return Coverage("parsed", f"{THIS}::{test}", note)


def not_here(reason):
    return Coverage("not_here", f"{THIS}::test_what_cannot_run_here_still_cannot", reason)


NO_GPU = "no GPU here (no /dev/nvidia0, no nvidia-smi)"
NO_APPTAINER = ("apptainer is not installed and Debian 12 has no package for it (apt-cache policy apptainer: "
                "nothing; singularity-container: Candidate: (none))")
TWO_CONTAINERS = ("two containers on one machine: a user-defined network instead of --network host, 1 slot each, "
                  "the key, data and checkpoint folders mounted, 30 updates of configs/demo.flags instead of "
                  "the base recipe")

COMMANDS = {
    # ---------------------- README.md and the guides: pretraining, elastic, gpu, data, finetuning, measuring
    "bash scripts/demo.sh": by("test_docker.py::test_demo_in_the_image",
                               "in the image, with --total_steps=30 --warmup_steps=3 --log_interval=10",
                               uses='"scripts/demo.sh"'),
    "bash scripts/test.sh": Coverage("suite", "", "the command that runs this suite (.ci/run runs exactly it)"),
    "source scripts/env.sh": here("test_env_sh_puts_the_venv_on_path"),
    "mpirun -np 2 --oversubscribe --bind-to none -x PATH python run/pretrain.py --flagfile=configs/demo.flags":
        here("test_demo_pretraining_with_mpirun", "--total_steps=10 --warmup_steps=3 --log_interval=5"),
    "horovodrun -np 2 -H localhost:2 python run/pretrain.py --flagfile=configs/demo.flags":
        here("test_demo_pretraining_resumes_with_horovodrun", "--total_steps=20 --warmup_steps=3 --log_interval=5"),
    "python run/pretrain.py --flagfile=configs/base_phase1.flags --dry_run":
        here("test_recipe_dry_runs", "data/wiki is the demo's records (same 128/20 shapes)"),
    "horovodrun -np 16 -hostfile hostfiles/hosts --network-interface eth0 python run/pretrain.py "
    "--flagfile=configs/base_phase1.flags":
        parsed("test_horovodrun_on_16_ranks_parses_and_maps_4_per_node",
               "horovodrun's own parser and the mpirun command it would start, mapped by mpirun --do-not-launch; "
               "the ranks' command dry-run"),
    "mpirun -np 16 --hostfile hostfiles/hosts --bind-to none --map-by slot -x PATH -x LD_LIBRARY_PATH "
    "-x TF_CPP_MIN_LOG_LEVEL -mca btl_tcp_if_include eth0 -mca pml ob1 -mca btl ^openib python run/pretrain.py "
    "--flagfile=configs/base_phase1.flags":
        parsed("test_mpirun_on_16_ranks_maps_4_per_node", "mpirun --display-map --do-not-launch; the ranks' command "
               "dry-run"),
    "horovodrun -np 16 -hostfile hostfiles/hosts --network-interface eth0 python run/pretrain.py "
    "--flagfile=configs/base_phase2.flags":
        parsed("test_horovodrun_on_16_ranks_parses_and_maps_4_per_node",
               "as phase 1; the dry run starts from a stand-in for phase 1's checkpoint (the demo's, tiny)"),
    "horovodrun -np 2 -hostfile hostfiles/localhost python run/pretrain.py --flagfile=configs/demo.flags":
        by("test_hostfiles.py::test_readme_command_horovodrun_with_the_localhost_hostfile",
           "--total_steps=20, checkpoints in a temporary folder", uses='"hostfiles/localhost"'),
    "sbatch --ntasks=2 run/slurm/pretrain.sbatch --flagfile=configs/demo.flags":
        by("test_slurm.py::test_job_completes_scancel_keeps_the_checkpoint_and_a_resubmission_resumes",
           "30 updates, checkpoints in a temporary folder, on a one-machine Slurm"),
    "sbatch --nodes=4 --ntasks-per-node=4 --gpus-per-task=1 run/slurm/pretrain.sbatch "
    "--flagfile=configs/base_phase1.flags":
        parsed("test_sbatch_on_4_gpu_nodes_would_start_16_tasks",
               "sbatch --test-only on a Slurm controller with 4 idle 4-GPU nodes (no slurmd behind them)"),
    "docker build -t bert_tf:cpu .":
        by("test_docker.py::test_the_image_runs_as_non_root_and_holds_no_build_input",
           "services.ensure_image builds a copy of the files the Dockerfile copies, tagged bert_tf:cpu and by "
           "their hash", uses="services.ensure_image()"),
    "docker run bert_tf:cpu run bash scripts/demo.sh --total_steps=30 --warmup_steps=3":
        by("test_docker.py::test_demo_in_the_image", "--network none, the data folder mounted, "
           "--log_interval=10 as well", uses='"run", "bash", "scripts/demo.sh", *SHORT'),
    "docker run -d --network host -v ~/.ssh/id_ed25519.pub:/keys/authorized_keys:ro -v /shared:/shared "
    "bert_tf:cpu worker": by("test_docker.py::test_two_containers_pretrain_with_horovodrun", TWO_CONTAINERS,
                             uses='image, "worker")'),
    "docker run --rm --network host -v ~/.ssh/id_ed25519:/keys/id_ed25519:ro -v /shared:/shared bert_tf:cpu "
    "launch /shared/hosts --flagfile=/shared/base_phase1.flags --checkpoint_dir=/shared/ckpt":
        by("test_docker.py::test_two_containers_pretrain_with_horovodrun", TWO_CONTAINERS, uses='"launch", "/hosts"'),
    "python run/learn_vocab.py --input_files='dump/*.xml.bz2' --vocab_size=30522 --output_file=data/wiki/vocab.txt":
        here("test_data_commands_on_the_bundled_wikipedia_excerpt",
             "dump/ holds the bundled 1.7 MB excerpt of an English Wikipedia dump"),
    "mpirun -np 8 python run/create_pretraining_data.py --input_files='dump/*.xml.bz2' "
    "--vocab_file=data/wiki/vocab.txt --output_dir=data/wiki/seq128 --max_seq_length=128 "
    "--max_predictions_per_seq=20 --dupe_factor=5 --shards_per_rank=16":
        here("test_data_commands_on_the_bundled_wikipedia_excerpt", "--dupe_factor=1; 8 ranks on 2 cores with "
             "OMPI_MCA_rmaps_base_oversubscribe=1 in the environment (one .bz2: one rank reads it, seven get an "
             "empty share; the per-rank documents must add up to the excerpt's, read in one process)"),
    "python run/finetune_proof.py --init_checkpoint=runs/demo --vocab_file=data/demo/vocab.txt "
    "--seeds=1,2,3 --learning_rate=1e-3 --epochs=5 --train_examples=1600 --output_json=runs/finetune_proof.json":
        by("test_finetune.py::test_finetune_proof_runs_every_task_from_both_starts",
           "a tiny random checkpoint instead of the demo's, 1 seed, 32 training and 16 dev examples, 1 epoch "
           "(the README's figures took 15-25 min per checkpoint)"),
    "python run/finetune_proof.py --init_checkpoint=runs/demo8k --vocab_file=data/demo/vocab.txt "
    "--tasks=same_document,odd_word --seeds=1,2,3 --learning_rate=1e-3 --epochs=5 --train_examples=1600":
        by("test_finetune.py::test_finetune_proof_runs_every_task_from_both_starts",
           "every task (these two among them) from a tiny random checkpoint, 1 seed, 32 training and 16 dev "
           "examples, 1 epoch (the README's figures took 13 min)"),
    "mpirun -np 8 python run/create_pretraining_data.py "
    "--input_files='wikipedia/20231101.en/train-*-of-00041.parquet' --title_field=title "
    "--vocab_file=data/wiki/vocab.txt --output_dir=data/wiki/seq128 --shards_per_rank=16":
        by("test_data.py::test_parquet_arrow_and_zst_corpora_made_by_two_ranks_killed_and_resumed",
           "2 ranks on a Parquet shard written by pyarrow (with an Arrow folder and a .jsonl.zst) instead of the "
           "41 wikimedia/wikipedia shards, which cannot be downloaded here; the title column is read in "
           "test_parquet_arrow_and_zst_give_the_documents_and_split_by_row_group_and_batch"),
    "python run/export.py --checkpoint=runs/demo --vocab_file=data/demo/vocab.txt --output_dir=runs/demo_export "
    "--format=google,huggingface,saved_model": here("test_export_of_the_demo_run"),
    "python run/pretrain.py --flagfile=configs/continue_base.flags --init_checkpoint=checkpoints/bert-base-uncased "
    "--vocab_file=checkpoints/bert-base-uncased/vocab.txt":
        here("test_continue_base_from_both_formats", "--total_steps=3 --warmup_steps=1 --log_interval=1 "
             "--eval_interval=3 --eval_batches=2 --micro_batch_size=4 (the recipe's mixed_float16 is emulated on this CPU, "
             "~60x float32's time: its 100 held-out batches of 32 were most of the test); checkpoints/ holds the "
             "demo's export (tiny BERT, 2 layers), not the published BERT-base (no download); the recipe's other "
             "flags (AdamW, mixed_float16 with loss scaling, data, schedule shape) run as written"),
    "python run/pretrain.py --flagfile=configs/continue_base.flags "
    "--init_checkpoint=checkpoints/uncased_L-12_H-768_A-12/bert_model.ckpt":
        here("test_continue_base_from_both_formats", "as the line above; run at the same time as it, in a copy of "
             "the work directory (symlinks, its own runs/)"),
    "python run/finetune.py --train_file=data/corpus/pang_lee_polarity.cor --vocab_file=data/demo/vocab.txt "
    "--init_checkpoint=runs/demo --kfold=5 --output_json=runs/finetune_pre.json":
        here("test_finetune_commands", "--epochs=0.25"),
    "python run/finetune.py --train_file=data/corpus/pang_lee_polarity.cor --vocab_file=data/demo/vocab.txt "
    "--random_init --bert_config_file=runs/demo/bert_config.json --kfold=5": here("test_finetune_commands", "--epochs=0.25"),
    "python run/finetune.py --train_file=data/corpus/pang_lee_polarity.cor --vocab_file=data/demo/vocab.txt "
    "--probe_checkpoint_dir=runs/demo": here("test_finetune_commands", "--epochs=0.25"),
    "python run/glue.py --tasks=all --data_dir=glue_data --init_checkpoint=runs/base_phase2 "
    "--vocab_file=data/wiki/vocab.txt --output_dir=runs/glue":
        by("test_glue.py::test_every_task_trains_predicts_scores_and_writes_its_submission_under_mpirun",
           "NOT verbatim: no GLUE download and no BERT-base here: the nine tasks' files in the download's exact layout (a few rows each), a tiny random-init BERT, sequence 32, batch 8, 1 epoch, 2 ranks under mpirun", uses='"glue.py", "--tasks=all"'),
    "python run/glue.py --tasks=cola,mrpc,stsb,rte --data_dir=glue_data --init_checkpoint=runs/base_phase2 "
    "--vocab_file=data/wiki/vocab.txt --learning_rates=5e-5,4e-5,3e-5,2e-5 --seeds=1,2,3,4,5 "
    "--output_dir=runs/glue_small":
        by("test_glue.py::test_a_sweep_with_seeds_summarises_each_setting_and_selects_on_dev",
           "NOT verbatim: the sweep and seeds through glue_sweep.sweep and glue_sweep.run_task (what run/glue.py calls), on "
           "MRPC's layout, 2 settings x 2 seeds, a tiny BERT", uses="glue_sweep.sweep("),
    "python run/squad.py --version=1.1 --train_file=squad/train-v1.1.json --predict_file=squad/dev-v1.1.json "
    "--init_checkpoint=runs/base_phase2 --vocab_file=data/wiki/vocab.txt --output_dir=runs/squad11":
        by("test_squad.py::test_both_versions_train_predict_and_score_end_to_end",
           "NOT verbatim: no SQuAD download here: questions in the official JSON layout, a tiny random-init BERT, "
           "windows of 48, 2 ranks under mpirun", uses='"squad.py"'),
    "python run/squad.py --version=2.0 --train_file=squad/train-v2.0.json --predict_file=squad/dev-v2.0.json "
    "--init_checkpoint=runs/base_phase2 --vocab_file=data/wiki/vocab.txt --output_dir=runs/squad20":
        by("test_squad.py::test_both_versions_train_predict_and_score_end_to_end",
           "NOT verbatim: as the line above, v2.0 with an unanswerable question, one process", uses='"2.0"'),
    "python run/benchmark.py --model_preset=base --max_seq_length=128 --micro_batch_size=8 --output_dir=runs/bench_base":
        by("test_benchmark.py::test_the_self_tuned_flagfile_is_taken_by_pretrain_after_the_recipe",
           "NOT verbatim: BERT-tiny, a few rungs and updates (every rung of BERT-base takes well over the suite's "
           "budget on 2 cores)"),
    "python run/plan.py --model_preset=large --nodes=4 --devices_per_node=4 --inter_gbps=10 "
    "--price_per_device_hour=2.5": here("test_plan"),
    "python run/plan.py --model_preset=large --price_per_device_hour=2.48 --spot_price_per_device_hour=0.74 "
    "--mtbp_hours=24": here("test_plan_preemptible"),
    "python run/elastic_recovery.py":
        parsed("test_elastic_recovery_benchmark_dry_run",
               "NOT run: a benchmark (~5 min on a 4-node emulated cluster). Its --dry_run (no root, no cluster) "
               "checks the two jobs' run/pretrain.py flags with --dry_run; the events it times (a node killed, a node "
               "joining) run on an emulated cluster in test_elastic.py::test_elastic_job_loses_a_node_takes_it_back_and_loses_a_link"),
    "horovodrun -np 16 --min-np 8 --max-np 16 --gloo --network-interface eth0 --host-discovery-script "
    "\"scripts/discover_hosts.sh /shared/hosts.live\" --blacklist-cooldown-range 120 600 "
    "python run/pretrain.py --flagfile=configs/large_phase1.flags "
    "--accumulation_steps=1 --elastic --global_batch_size=61440 --elastic_commit_interval=10":
        parsed("test_elastic_horovodrun_on_16_ranks_parses_and_discovers_4_nodes",
               "horovodrun's own parser and elastic set-up up to the Gloo driver (not started), its discovery of "
               "/shared/hosts.live written in a temporary folder with 4 nodes x 4 slots; the ranks' command "
               "dry-run. An elastic job that loses and regains nodes runs small in "
               "test_elastic.py::test_elastic_job_loses_a_node_takes_it_back_and_loses_a_link"),
    "BERT_TF_GPU=1 bash scripts/setup.sh":
        by("test_gpu.py::test_gpu_node_without_a_driver_is_refused_before_anything_is_installed",
           f"{NO_GPU}: it stops at the driver check, as it must", uses='"BERT_TF_GPU": "1"'),
    "BERT_TF_GPU=build bash scripts/setup.sh":
        by("test_gpu.py::test_gpu_horovod_loads_every_symbol_and_reports_cuda_and_nccl",
           "through the module's gpu_install fixture", uses="gpu_install"),
    "bash scripts/gpu_check.sh runs/gpu_check":
        by("test_gpu.py::test_the_gpu_node_check_says_what_is_missing_on_a_machine_without_a_gpu",
           f"{NO_GPU}: it stops with its message, writing nothing"),
    "python run/plan.py --model_preset=base --device_figures=runs/gpu_check/gpu_check.json --nodes=4 "
    "--devices_per_node=4":
        by("test_planner.py::test_measured_device_figures_are_recorded_per_phase_checked_and_taken_by_the_plan",
           "NOT verbatim: a figures JSON the test writes (no GPU to measure), --phase2_device_seq_s given too",
           uses="--device_figures="),
    "python run/emulated_cluster.py up --nodes=2 --rate_gbit=1": here("test_emulated_cluster_up_and_down"),
    "python run/emulated_cluster.py down": here("test_emulated_cluster_up_and_down"),
    "python run/comm_study.py --output_dir=runs/comm_study":
        by("test_comm_study.py::test_planner_predicts_the_emulated_study_within_25_percent",
           "NOT verbatim: the study's BERT-small with the tiny test vocabulary at sequence 64, 4 x 4 sequences per "
           "update, 3 rungs, 1 Gbit/s, 3 updates after 1 warm-up, without XLA (the full study takes ~45 min)"),
    "python run/validate_planner.py --study=runs/comm_study/study.json":
        by("test_comm_study.py::test_planner_predicts_the_emulated_study_within_25_percent",
           "--study= the small study that test makes"),
    # ------------------------------------------------------------------------- docs/operations.md
    "docker build -t bert_tf:gpu --build-arg GPU=build .":
        by("test_docker.py::test_gpu_image_loads_tensorflow_with_cuda_and_horovod_with_nccl_and_holds_no_compiler",
           "built from a copy of the checkout with the cached wheels as build inputs (tests/services.py)",
           uses="ensure_image(gpu=True)"),
    "docker run -d --gpus all --network host --ipc host -v ~/.ssh/id_ed25519.pub:/keys/authorized_keys:ro "
    "-v /shared:/shared bert_tf:gpu worker": not_here(f"{NO_GPU} (--gpus all needs one); the GPU image is built and "
                                                      "loaded in test_docker.py, its CPU twin runs in "
                                                      "test_docker.py::test_two_containers_pretrain_with_horovodrun"),
    "docker run --rm --gpus all --network host --ipc host -v ~/.ssh/id_ed25519:/keys/id_ed25519:ro "
    "-v /shared:/shared bert_tf:gpu launch /shared/hosts --flagfile=/shared/base_phase1.flags "
    "--checkpoint_dir=/shared/ckpt": not_here(f"{NO_GPU} (--gpus all needs one); the GPU image is built and loaded "
                                              "in test_docker.py, its CPU twin runs in "
                                              "test_docker.py::test_two_containers_pretrain_with_horovodrun"),
    "horovodrun -np 16 -hostfile hostfiles/hosts python run/pretrain.py --flagfile=configs/base_phase1.flags":
        parsed("test_horovodrun_on_16_ranks_parses_and_maps_4_per_node", "as the README's, without an interface"),
    "mpirun -np 16 --hostfile hostfiles/hosts --bind-to none --map-by slot -x PATH -x LD_LIBRARY_PATH "
    "-mca pml ob1 -mca btl ^openib python run/pretrain.py --flagfile=configs/base_phase1.flags":
        parsed("test_mpirun_on_16_ranks_maps_4_per_node", "as the README's"),
    "apptainer build bert_tf.sif docker-daemon://bert_tf:cpu": not_here(NO_APPTAINER),
    'mpirun --bind-to none --map-by slot apptainer exec --nv bert_tf.sif python /opt/bert_tf/src/run/pretrain.py '
    '"$@"': not_here(f"{NO_APPTAINER}; a line of an sbatch script, not a command to type"),
}


# ------------------------------------------------------------------------------ the register itself

FENCE = re.compile(r"^(?P<indent> *)```(?P<lang>[\w-]*)\n(?P<body>.*?)^(?P=indent)```", re.S | re.M)


def documented_commands():
    """{command: [docs]} for every line of the docs' shell code blocks: backslash continuations
    joined, comment-only lines and trailing comments dropped, white space collapsed."""
    found = {}
    for doc in DOCS:
        for block in FENCE.finditer((REPO / doc).read_text()):
            if block["lang"] not in ("", "bash", "sh", "shell", "console"):
                continue
            for line in re.sub(r"\\\n", " ", block["body"]).splitlines():
                command = " ".join(re.sub(r"(^|\s)#.*$", "", line).split())
                if command:
                    found.setdefault(command, []).append(doc)
    return found


def test_every_documented_command_is_registered():
    found = documented_commands()
    missing = {c: d for c, d in found.items() if c not in COMMANDS}
    assert not missing, (
        "these commands in the docs are run by no test:\n" + "\n".join(f"  {d[0]}: {c}" for c, d in missing.items())
        + f"\nadd each to COMMANDS in tests/{THIS}: by('test_x.py::test_that_runs_it', 'what differs'), a test here "
          "that runs it (here/parsed), or not_here('why it cannot run on this machine')")
    stale = [c for c in COMMANDS if c not in found]
    assert not stale, "registered but no longer in the docs (remove them from COMMANDS):\n" + "\n".join(stale)
    assert len(found) >= 30       # the extraction itself works (a broken fence regex would find nothing)


def test_the_register_names_tests_that_use_their_commands():
    """A renamed or deleted test cannot leave a command covered on paper only, and neither can a test
    that no longer runs the command: a test here must take it from the register (commands_of(its own
    name), itself or through a fixture it uses); a test elsewhere must contain `uses` (by default the
    script the command runs), itself or in a fixture, helper or constant of its module it refers to."""
    for command, entry in COMMANDS.items():
        assert entry.kind in ("test", "here", "parsed", "not_here", "suite"), command
        assert entry.kind in ("test", "here") or entry.note, f"say why for {command}"
        if not entry.test:
            continue
        module, _, name = entry.test.partition("::")
        code = code_of_test(module, name)
        assert code is not None, f"COMMANDS names {entry.test}, which does not exist"
        if entry.kind == "not_here":       # that test checks the reason still holds
            continue
        if module == THIS:
            assert re.search(rf"""commands_of\(["']{name}["']\)""", code), \
                f"{entry.test} does not take its commands from the register (commands_of({name!r}))"
        else:
            evidence = entry.uses or script_of(command)
            assert evidence, f"say with uses= what in {entry.test} runs: {command}"
            assert evidence in code, f"{entry.test} does not contain {evidence!r}: does it still run {command}?"


def script_of(command):
    """The script a command runs (run/x.py, scripts/x.sh, ...), by its file name."""
    found = re.search(r"(?:^|\s)(?:\S*/)?([\w.-]+\.(?:py|sh|sbatch))(?:\s|$)", command)
    return found[1] if found else ""


_MODULES = {}


def code_of_test(module, name):
    """The source of test `name` in tests/`module` with its decorators, plus every module-level
    function (fixtures, helpers) and assignment it refers to, followed transitively; None if the
    module has no such function."""
    if module not in _MODULES:
        text = (REPO / "tests" / module).read_text()
        defs = {}
        for node in ast.parse(text).body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                defs[node.name] = node
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                for target in (node.targets if isinstance(node, ast.Assign) else [node.target]):
                    for n in ast.walk(target):
                        if isinstance(n, ast.Name):
                            defs.setdefault(n.id, node)
        _MODULES[module] = text, defs
    text, defs = _MODULES[module]
    if not isinstance(defs.get(name), ast.FunctionDef):
        return None
    seen, todo, parts = set(), [name], []
    while todo:
        node = defs[todo.pop()]
        if id(node) in seen:
            continue
        seen.add(id(node))
        parts += [ast.get_source_segment(text, d) for d in getattr(node, "decorator_list", [])]
        parts.append(ast.get_source_segment(text, node))
        referred = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
        referred |= {a.arg for n in ast.walk(node) if isinstance(n, ast.arguments) for a in n.args}  # fixtures
        todo += [r for r in referred if r in defs]
    return "\n".join(parts)


def commands_of(test_name):
    return [c for c, e in COMMANDS.items() if e.test == f"{THIS}::{test_name}"]


def test_what_cannot_run_here_still_cannot():
    """The reasons given for not_here hold; when one stops holding, the command belongs in a test."""
    assert not os.path.exists("/dev/nvidia0") and not shutil.which("nvidia-smi"), NO_GPU + " no longer holds"
    assert not shutil.which("apptainer"), "apptainer is installed now: run the Apptainer commands in a test"
    reasons = {e.note for e in COMMANDS.values() if e.kind == "not_here"}
    assert all(NO_GPU in r or NO_APPTAINER in r for r in reasons), reasons


# -------------------------------------------------------------------------------- the work directory

def run_doc_command(command, cwd, extra=(), timeout=900, env=None):
    """The docs' command line, split as bash would, with `extra` arguments appended, run in cwd."""
    args = [os.path.expanduser(a) for a in shlex.split(command)] + list(extra)
    print("running:", shlex.join(args), f"(in {cwd})")
    proc = subprocess.run(args, cwd=cwd, env=env or services.run_env(cwd), capture_output=True, text=True,
                          timeout=timeout)
    proc.output = proc.stdout + proc.stderr
    return proc


def ok(proc):
    assert proc.returncode == 0, f"{shlex.join(proc.args)} exited {proc.returncode}\n{proc.output[-5000:]}"
    return proc.output


@pytest.fixture(scope="module")
def workdir(tmp_path_factory, corpus_dir):
    """The checkout's layout with the data the recipes name: data/demo (services.make_demo_workdir),
    data/wiki and data/domain = data/demo (the recipes' 128/20 shapes; 512/80 records added for
    phase 2), data/corpus, and hostfiles/hosts copied from the cluster example as its README says."""
    from bert_tf.data import instances as ins, pretraining_data as pd, tokenization

    root = services.make_demo_workdir(tmp_path_factory.mktemp("docs_commands"), corpus_dir)
    (root / "data" / "corpus").symlink_to(corpus_dir)
    (root / "hostfiles").unlink()
    shutil.copytree(REPO / "hostfiles", root / "hostfiles")
    shutil.copy(root / "hostfiles" / "cluster-4x4.example", root / "hostfiles" / "hosts")
    for name in ("wiki", "domain"):
        (root / "data" / name).symlink_to("demo")
    tokenizer = tokenization.Tokenizer.from_file(str(root / "data" / "demo" / "vocab.txt"))
    pd.create_pretraining_data([str(corpus_dir / "lee_background.cor") + "@documents"], "auto", tokenizer,
                               str(root / "data" / "demo" / "seq512"),
                               ins.InstanceConfig(max_seq_length=512, max_predictions_per_seq=80, dupe_factor=1,
                                                 random_seed=7),
                               num_shards=1, heldout_fraction=0.05, log=lambda *a: None)
    return root


def test_env_sh_puts_the_venv_on_path():
    [command] = commands_of("test_env_sh_puts_the_venv_on_path")
    env = {k: v for k, v in os.environ.items() if not k.startswith("OMPI_ALLOW")}
    env["PATH"] = "/usr/bin:/bin"
    out = subprocess.run(["bash", "-c", f"{command} && command -v python && echo \"root=${{OMPI_ALLOW_RUN_AS_ROOT:-}}\""],
                         cwd=REPO, env=env, capture_output=True, text=True, check=True).stdout.split()
    cache = os.environ.get("BERT_TF_CACHE", os.path.expanduser("~/.cache/bert_tf"))
    venv = os.environ.get("BERT_TF_VENV", f"{cache}/venv-py311")
    assert out[0] == f"{venv}/bin/python"
    assert out[1] == ("root=1" if os.geteuid() == 0 else "root=")


@pytest.mark.slow
def test_plan():
    [command] = commands_of("test_plan")
    out = ok(run_doc_command(command, REPO))
    assert re.search(r"^BERT-large: 33\d\.\dM parameters; 4 nodes x 4 devices, 10 Gbit/s between nodes$", out, re.M), out
    days, cost = re.search(r"^total: ([\d.]+) days, cost (\d+)$", out, re.M).groups()
    assert float(cost) == pytest.approx(float(days) * 24 * 16 * 2.5, rel=0.01)     # 16 devices at 2.5 an hour


@pytest.mark.slow
def test_plan_preemptible():
    [command] = commands_of("test_plan_preemptible")
    out = ok(run_doc_command(command, REPO))
    rows = {name.strip(): (float(days), float(cost)) for name, days, cost in
            re.findall(r"^  (on-demand|spot \+ checkpoint restart|spot \+ elastic)\s+([\d.]+) days\s+cost\s+(\d+)$",
                       out, re.M)}
    assert len(rows) == 3, out
    days, cost = rows["on-demand"]
    assert cost == pytest.approx(days * 24 * 16 * 2.48, rel=0.01)                  # 16 devices at 2.48 an hour
    assert all(d >= days for d, _ in rows.values())                                   # preemptions only cost time
    assert re.search(rf"^cheapest: {re.escape(min(rows, key=lambda k: rows[k][1]))}$", out, re.M), out
    assert "cheapest: spot + elastic" in out          # a node lost every 24 h: restarts cost more than commits


@pytest.mark.cluster
@pytest.mark.skipif(not (os.geteuid() == 0 and shutil.which("tc")), reason="the emulated cluster needs root and tc")
def test_emulated_cluster_up_and_down():
    up, down = commands_of("test_emulated_cluster_up_and_down")
    try:
        out = ok(run_doc_command(up, REPO))
        assert "up: 2 nodes at 1 Gbit/s; hostfile " in out and "run ranks with:  ip netns exec btc-launch mpirun -np 2" in out, out
        hostfile = re.search(r"hostfile (\S+)", out)[1]
        assert open(hostfile).read() == "198.18.0.1 slots=1\n198.18.0.2 slots=1\n"
        status = ok(run_doc_command("python run/emulated_cluster.py status", REPO))
        assert "btc-h0" in status and "btc-h1" in status, status
    finally:
        out = ok(run_doc_command(down, REPO))
    assert out.strip().endswith("down"), out


# ------------------------------------------------------------------ the demo run and what builds on it

SHORT_MPIRUN = ["--total_steps=10", "--warmup_steps=3", "--log_interval=5"]
SHORT_HOROVODRUN = ["--total_steps=20", "--warmup_steps=3", "--log_interval=5"]


@pytest.fixture(scope="module")
def demo_runs(workdir):
    """The README's two one-machine commands, one after the other into runs/demo (demo.flags's
    --checkpoint_dir): mpirun for 10 updates, then horovodrun resuming to 20."""
    [mpirun] = commands_of("test_demo_pretraining_with_mpirun")
    [horovodrun] = commands_of("test_demo_pretraining_resumes_with_horovodrun")
    first = run_doc_command(mpirun, workdir, SHORT_MPIRUN)
    second = run_doc_command(horovodrun, workdir, SHORT_HOROVODRUN) if first.returncode == 0 else None
    return first, second


def latest_step(folder):
    import tensorflow as tf
    path = tf.train.latest_checkpoint(str(folder))
    return int(path.rsplit("-", 1)[1]) if path else None


@pytest.mark.cluster
def test_demo_pretraining_with_mpirun(demo_runs, workdir):
    out = ok(demo_runs[0])
    assert "ranks 2 " in out and "held-out MLM accuracy" in out, out[-3000:]


@pytest.mark.cluster
def test_demo_pretraining_resumes_with_horovodrun(demo_runs, workdir):
    assert demo_runs[1] is not None, "the mpirun run before it failed"
    out = ok(demo_runs[1])
    assert "resumed from runs/demo/ckpt-10 at step 10" in out and "ranks 2 " in out, out[-3000:]
    assert latest_step(workdir / "runs" / "demo") == 20


@pytest.fixture(scope="module")
def exported(demo_runs, workdir):
    if demo_runs[1] is None or demo_runs[1].returncode != 0:
        pytest.fail("needs the demo runs (test_demo_pretraining_*)")
    [command] = commands_of("test_export_of_the_demo_run")
    return run_doc_command(command, workdir)


@pytest.mark.cluster
def test_export_of_the_demo_run(exported, workdir):
    ok(exported)
    folder = workdir / "runs" / "demo_export"
    for name in ("bert_model.ckpt.index", "bert_config.json", "vocab.txt", "config.json", "model.safetensors"):
        assert (folder / name).is_file(), sorted(os.listdir(folder))
    assert any(p.name == "saved_model.pb" for p in folder.rglob("*")), sorted(os.listdir(folder))


def dry_run(workdir, args):
    out = ok(run_doc_command(shlex.join(args), workdir, ["--dry_run"]))
    assert "Traceback" not in out, out[-3000:]
    return out


@pytest.fixture(scope="module")
def phase1_checkpoint_stand_in(demo_runs, workdir):
    """runs/base_phase1/ckpt-7506 (what configs/base_phase2.flags starts from): the demo run's last
    checkpoint under that name, with its bert_config.json, so the model size comes from it."""
    import tensorflow as tf
    if demo_runs[1] is None or demo_runs[1].returncode != 0:
        pytest.fail("needs the demo runs (test_demo_pretraining_*)")
    prefix = tf.train.latest_checkpoint(str(workdir / "runs" / "demo"))
    target = workdir / "runs" / "base_phase1"
    target.mkdir(parents=True)
    for f in (workdir / "runs" / "demo").glob(os.path.basename(prefix) + ".*"):
        shutil.copy(f, target / f.name.replace(os.path.basename(prefix), "ckpt-7506"))
    shutil.copy(workdir / "runs" / "demo" / "bert_config.json", target / "bert_config.json")
    return target / "ckpt-7506"


@pytest.mark.cluster
def test_recipe_dry_runs(workdir, ranks_dry_runs, phase1_checkpoint_stand_in):
    """--dry_run of the recipes the cluster commands run: flags, data and paths check out, nothing written."""
    [command] = commands_of("test_recipe_dry_runs")
    vocab = len((workdir / "data" / "demo" / "vocab.txt").read_text().splitlines())
    out = ranks_dry_runs(shlex.split(command))
    assert (f"dry run: flags and inputs check out: model 12 layers, hidden 768, vocab {vocab}; 2 training and 2 "
            "evaluation files of 128-token records; 120 x 32 sequences per rank per update") in out, out[-2000:]
    assert "starts from random weights; checkpoints in runs/base_phase1" in out
    out = ranks_dry_runs(["python", "run/pretrain.py", "--flagfile=configs/base_phase2.flags"])
    assert (f"model 2 layers, hidden 128, vocab {vocab}; 1 training and 1 evaluation files of 512-token records; "
            "20 x 96 sequences per rank") in out, out[-2000:]
    assert "starts from runs/base_phase1/ckpt-7506 (bert_tf format)" in out, out[-2000:]
    assert not (workdir / "runs" / "base_phase2").exists()


@pytest.mark.cluster
def test_continue_base_from_both_formats(exported, workdir, tmp_path):
    """configs/continue_base.flags from a Hugging Face folder and from google's bert_model.ckpt (the
    demo's export, tiny BERT, stands in for the published BERT-base): 3 real updates each in the
    recipe's mixed_float16 (emulated on this CPU: ~60x float32's time, hence 4-sequence batches),
    with evaluation. The two run at once, the second in a copy of the work directory (its own runs/:
    both commands write runs/continue_base), each mostly on one core."""
    ok(exported)
    checkpoints = workdir / "checkpoints"
    checkpoints.mkdir(exist_ok=True)
    for name in ("bert-base-uncased", "uncased_L-12_H-768_A-12"):
        (checkpoints / name).symlink_to(workdir / "runs" / "demo_export")
    second = tmp_path / "workdir2"
    second.mkdir()
    for entry in workdir.iterdir():
        if entry.name != "runs":
            (second / entry.name).symlink_to(entry)
    (second / "runs").mkdir()
    hf, google = commands_of("test_continue_base_from_both_formats")
    short = ["--total_steps=3", "--warmup_steps=1", "--log_interval=1", "--eval_interval=3", "--eval_batches=2",
             "--micro_batch_size=4"]
    runs = ((hf, workdir, "from checkpoints/bert-base-uncased (huggingface format)"),
            (google, second, "from checkpoints/uncased_L-12_H-768_A-12/bert_model.ckpt (google format)"))
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        procs = list(pool.map(lambda run: run_doc_command(run[0], run[1], short), runs))
    evals = []
    for proc, (_, cwd, says) in zip(procs, runs):
        out = ok(proc)
        assert f"initialised encoder and heads {says}" in out, out[-3000:]
        assert "initialised at random" not in out and "precision mixed_float16" in out, out[-3000:]
        run_dir = cwd / "runs" / "continue_base"
        assert latest_step(run_dir) == 3
        records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        assert [r["step"] for r in records if r["kind"] == "train"] == [1, 2, 3], records
        evals.append([r for r in records if r["kind"] == "eval"])
        assert [r["step"] for r in evals[-1]] == [0, 3], records       # the published model first, then adapted
    shutil.rmtree(workdir / "runs" / "continue_base")
    # the same weights through both formats: the same held-out figures before the first update
    first, other = (e[0] for e in evals)
    assert first["eval_mlm_accuracy"] == other["eval_mlm_accuracy"], evals
    assert abs(first["eval_mlm_loss"] - other["eval_mlm_loss"]) < 1e-4, evals


@pytest.mark.cluster
def test_finetune_commands(demo_runs, workdir):
    if demo_runs[1] is None or demo_runs[1].returncode != 0:
        pytest.fail("needs the demo runs (test_demo_pretraining_*)")
    pre, baseline, probe = commands_of("test_finetune_commands")
    # a quarter epoch: the commands' paths (5 folds, both starts, every checkpoint probed), not accuracy
    out = ok(run_doc_command(pre, workdir, ["--epochs=0.25"]))
    assert (workdir / "runs" / "finetune_pre.json").is_file(), out[-3000:]
    out = ok(run_doc_command(baseline, workdir, ["--epochs=0.25"]))
    assert "accuracy" in out, out[-3000:]
    ok(run_doc_command(probe, workdir, ["--epochs=0.25"]))
    records = [json.loads(line) for line in (workdir / "runs" / "demo" / "metrics.jsonl").read_text().splitlines()]
    probed = sorted(r["step"] for r in records if r.get("kind") == "probe")
    assert probed == [10, 20], records[-3:]          # every checkpoint of the two demo runs


# -------------------------------------------------------------------------------- the data commands

@pytest.mark.cluster
def test_data_commands_on_the_bundled_wikipedia_excerpt(tmp_path, corpus_dir):
    """learn_vocab and the 8-rank create_pretraining_data on dump/*.xml.bz2, here the bundled
    excerpt of an English Wikipedia dump (a MediaWiki .xml.bz2 like the real one)."""
    for name in ("run", "bert_tf"):
        (tmp_path / name).symlink_to(REPO / name)
    (tmp_path / "dump").mkdir()
    (tmp_path / "dump" / "enwiki-excerpt.xml.bz2").symlink_to(
        corpus_dir / "enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2")
    vocab, create = commands_of("test_data_commands_on_the_bundled_wikipedia_excerpt")
    ok(run_doc_command(vocab, tmp_path))
    words = (tmp_path / "data" / "wiki" / "vocab.txt").read_text().split("\n")
    assert words[0] == "[PAD]" and len(words) > 1000
    out = ok(run_doc_command(create, tmp_path, ["--dupe_factor=1"],
                             env=services.run_env(tmp_path, {"OMPI_MCA_rmaps_base_oversubscribe": "1"})))
    print(out[-2000:])
    seq128 = tmp_path / "data" / "wiki" / "seq128"
    summary = json.loads((seq128 / "summary.json").read_text())
    total, per_rank = summary["total"], summary["per_rank"]
    assert total["ranks"] == 8 and [r["rank"] for r in per_rank] == list(range(8)), total
    # the ranks read disjoint parts that cover the corpus: their documents add up to the total, which
    # is every document of the excerpt (read here in one process); one .bz2 goes whole to one rank
    from bert_tf.data import corpus, input_pipeline
    documents = sum(1 for _ in corpus.read_documents([str(tmp_path / "dump" / "enwiki-excerpt.xml.bz2")]))
    assert documents > 100
    assert sum(r["documents"] for r in per_rank) == total["documents"] == documents, [r["documents"] for r in per_rank]
    assert [r["documents"] > 0 for r in per_rank].count(True) == 1, [r["documents"] for r in per_rank]
    # every record in the train shards, counted by reading them, is one the summary counted, by rank
    for r in per_rank:
        made = sum(input_pipeline.check_file(f, 128, 20, full=True) for f in seq128.glob(f"train-r{r['rank']:03d}-*"))
        assert made == r.get("train", {}).get("instances", 0), (r["rank"], made, r.get("train"))
    records = sum(input_pipeline.check_file(f, 128, 20, full=True) for f in seq128.glob("train-*"))
    assert records == total["train"]["instances"] > 0, (records, total["train"])


# ------------------------------------------------------------ parsed: 16 ranks on 4 nodes, 4-GPU nodes

FOUR_BY_FOUR = {f"node{i}": 4 for i in range(1, 5)}


def mpirun_map(args, cwd):
    """OpenMPI's job map for an mpirun command line (--display-map --do-not-launch: nothing starts)."""
    assert args[0] == "mpirun", args
    cmd = ["mpirun", "--display-map", "--do-not-launch", *args[1:]]
    proc = subprocess.run(cmd, cwd=cwd, env=services.run_env(cwd), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return {m[0]: int(m[1]) for m in re.findall(
        r"Data for node: (\S+)\s+Num slots: \d+\s+Max slots: \d+\s+Num procs: (\d+)", proc.stdout)}


def command_id(command):
    """A short test id: launcher, recipe, interface."""
    recipe = re.search(r"configs/(\w+)\.flags", command)[1]
    return "-".join([command.split()[0], recipe] + (["eth0"] if "eth0" in command else []))


def ranks_command(args):
    """The command a launcher starts on every rank: from `python` on."""
    return args[args.index("python"):]


@pytest.fixture(scope="module")
def ranks_dry_runs(workdir):
    """--dry_run of each command the 16-rank launches would start (and of the README's dry run), once each."""
    cache = {}

    def get(args):
        args = [a for a in args if a != "--dry_run"]
        key = shlex.join(args)
        if key not in cache:
            cache[key] = dry_run(workdir, args)
        return cache[key]
    return get


def horovodrun_mpirun_command(args, cwd, monkeypatch):
    """What horovodrun does with this command line up to starting mpirun, minus its ssh checks of
    the hosts (node1..node4 do not exist here): Horovod 0.28.1's own argument and hostfile parsers,
    then the mpirun command line its MPI launcher would exec."""
    from horovod.runner import launch, mpi_run
    from horovod.runner.common.util import hosts, secret, settings as hvd_settings, timeout

    monkeypatch.chdir(cwd)
    monkeypatch.setattr(sys, "argv", ["horovodrun", *args[1:]])
    parsed_args = launch.parse_args()
    parsed_args.hosts = hosts.parse_host_files(parsed_args.hostfile)
    settings = hvd_settings.Settings(
        verbose=0, ssh_port=parsed_args.ssh_port, ssh_identity_file=parsed_args.ssh_identity_file,
        extra_mpi_args=parsed_args.mpi_args, tcp_flag=parsed_args.tcp_flag, binding_args=parsed_args.binding_args,
        key=secret.make_secret_key(), start_timeout=timeout.Timeout(30, message="{activity}"),
        num_proc=parsed_args.num_proc, hosts=parsed_args.hosts, output_filename=parsed_args.output_filename,
        run_func_mode=False, nics=parsed_args.nics, prefix_output_with_timestamp=False)
    started = []

    class OsThatRecordsExecve:      # mpi_run ends with os.execve('/bin/sh', ['/bin/sh', '-c', mpirun_command])
        def __getattr__(self, name):
            return getattr(os, name)

        def execve(self, path, argv, env):
            started.append(argv[2])
    monkeypatch.setattr(mpi_run, "os", OsThatRecordsExecve())
    launch._launch_job(parsed_args, settings, parsed_args.nics, parsed_args.command)
    assert len(started) == 1, started
    return parsed_args, shlex.split(started[0])


@pytest.mark.parametrize("command", commands_of("test_horovodrun_on_16_ranks_parses_and_maps_4_per_node"),
                         ids=command_id)
@pytest.mark.cluster
def test_horovodrun_on_16_ranks_parses_and_maps_4_per_node(command, workdir, ranks_dry_runs, monkeypatch, request):
    args = shlex.split(command)
    if "base_phase2" in command:           # phase 2 starts from phase 1's checkpoint
        request.getfixturevalue("phase1_checkpoint_stand_in")
    parsed_args, mpirun = horovodrun_mpirun_command(args, workdir, monkeypatch)
    assert parsed_args.num_proc == 16 and parsed_args.hosts == "node1:4,node2:4,node3:4,node4:4"
    print("horovodrun would start:", shlex.join(mpirun[:12]), "...")
    if "--network-interface" in args:
        joined = " ".join(mpirun)
        assert "-mca btl_tcp_if_include eth0" in joined and "-x NCCL_SOCKET_IFNAME=eth0" in joined, joined
    assert mpirun_map(mpirun, workdir) == FOUR_BY_FOUR
    assert "dry run: flags and inputs check out" in ranks_dry_runs(ranks_command(args))


@pytest.mark.cluster
@pytest.mark.parametrize("command", commands_of("test_mpirun_on_16_ranks_maps_4_per_node"), ids=command_id)
def test_mpirun_on_16_ranks_maps_4_per_node(command, workdir, ranks_dry_runs):
    args = shlex.split(command)
    assert mpirun_map(args, workdir) == FOUR_BY_FOUR
    assert "dry run: flags and inputs check out" in ranks_dry_runs(ranks_command(args))


@pytest.mark.slow
def test_elastic_horovodrun_on_16_ranks_parses_and_discovers_4_nodes(workdir, ranks_dry_runs, monkeypatch, tmp_path):
    """Horovod 0.28.1's own parser and elastic set-up (launch._run up to the Gloo elastic driver, which
    would ssh to the hosts), then the settings' host discovery: the README's script on a live-hosts
    file of 4 nodes x 4 slots, run as Horovod runs it."""
    from horovod.runner import launch
    [command] = commands_of("test_elastic_horovodrun_on_16_ranks_parses_and_discovers_4_nodes")
    live = tmp_path / "hosts.live"
    live.write_text("".join(f"node{i}:4\n" for i in range(1, 5)))
    args = [a.replace("/shared/hosts.live", str(live)) for a in shlex.split(command)]
    monkeypatch.chdir(workdir)
    monkeypatch.setattr(sys, "argv", ["horovodrun", *args[1:]])
    started = []
    monkeypatch.setattr(launch, "gloo_run_elastic", lambda settings, env, cmd, executable: started.append((settings, cmd)))
    launch._run(launch.parse_args())
    [(settings, ranks)] = started
    assert (settings.num_proc, settings.min_num_proc, settings.max_num_proc) == (16, 8, 16)
    assert list(settings.cooldown_range) == [120, 600] and "eth0" in settings.nics, vars(settings)
    assert settings.discovery.find_available_hosts_and_slots() == FOUR_BY_FOUR
    assert ranks == ranks_command(args)
    out = ranks_dry_runs(ranks)
    assert "dry run: flags and inputs check out: model 24 layers, hidden 1024" in out, out[-2000:]


@pytest.mark.slow
def test_elastic_recovery_benchmark_dry_run(workdir):
    """The benchmark's two jobs, as it would start them (with the demo's data), pass run/pretrain.py's --dry_run."""
    [command] = commands_of("test_elastic_recovery_benchmark_dry_run")
    out = ok(run_doc_command(command, workdir, ["--dry_run"]))
    for job, per_rank in (("restart", "4 x 2 sequences per rank"), ("elastic", "4 x 1 sequences per rank")):
        said = re.search(rf"^{job} job: (.*)\n  (.*)$", out, re.M)
        assert said, out[-3000:]
        assert "run/pretrain.py --model_preset=tiny" in said[1] and ("--elastic " in said[1]) == (job == "elastic")
        assert said[2].startswith("dry run: flags and inputs check out: model 2 layers") and per_rank in said[2], said[2]
    assert not (workdir / "runs" / "elastic_recovery").exists()


@pytest.mark.cluster
def test_sbatch_on_4_gpu_nodes_would_start_16_tasks(workdir, tmp_path, ranks_dry_runs):
    [command] = commands_of("test_sbatch_on_4_gpu_nodes_would_start_16_tasks")
    args = shlex.split(command)
    with services.slurm_controller(tmp_path, nodes=4, cpus=4, gpus=4) as env:
        proc = subprocess.run(["sbatch", "--test-only", *args[1:]], cwd=workdir, env={**services.run_env(workdir), **env},
                              capture_output=True, text=True, timeout=60)
    print(proc.stderr)
    assert proc.returncode == 0, proc.stderr
    assert re.search(r"using 16 processors on nodes node\[1-4\] in partition", proc.stderr), proc.stderr
    # the script runs mpirun ... python run/pretrain.py "$@": the arguments after the script
    script_args = args[args.index("run/slurm/pretrain.sbatch") + 1:]
    assert "dry run: flags and inputs check out" in ranks_dry_runs(["python", "run/pretrain.py", *script_args])
