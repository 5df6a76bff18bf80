"""bert_tf: multi-node BERT pre-training with TensorFlow 2 and Horovod.

Horovod is not in install_requires: it must be built after TensorFlow is installed,
which scripts/setup.sh does (and caches).
"""
import pathlib

from setuptools import find_packages, setup

here = pathlib.Path(__file__).parent
requirements = [
    line.split("#")[0].strip()
    for line in (here / "requirements.txt").read_text().splitlines()
    if line.split("#")[0].strip()
]

setup(
    name="bert_tf",
    version="0.1.0",
    description="Cost-efficient multi-node BERT pre-training (TensorFlow 2 + Horovod)",
    packages=find_packages(include=["bert_tf", "bert_tf.*"]),
    python_requires="==3.11.*",
    install_requires=requirements,
)
