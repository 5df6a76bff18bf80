# bert_tf node image. Both stages that install start from one base image chosen by build argument, so
# the legacy builder (no BuildKit) pulls only that base, and both install through scripts/setup.sh
# (the script CI runs: versions and the Horovod build have one source of truth).
#   docker build -t bert_tf:cpu .                          # Debian 12, Python 3.11
#   docker build -t bert_tf:gpu --build-arg GPU=build .    # + TensorFlow's CUDA 12.5 wheels, Horovod with NCCL
# The GPU image starts from the same Debian base: CUDA comes from PyPI wheels in the venv, and the
# compiler for Horovod's kernels only into the builder stage (scripts/cuda_toolkit.sh), or not at all
# when the wheel cache below holds the GPU wheel. The node's driver comes from the NVIDIA container
# runtime (docker run --gpus all).
# Optional build inputs in docker/build-inputs/ (both builders; see its README.md): ca.crt, the CA
# bundle of a TLS-inspecting proxy, and wheels/, a Horovod wheel cache from scripts/setup.sh. They
# are used in the builder stage only; the runtime stage copies the venv, never them.
# Layers: what scripts/setup.sh makes (Debian packages, venv, Horovod) depends only on the dependency
# inputs (requirements*.txt, setup.py, scripts/, docker/); the project source (bert_tf/, run/, configs/,
# hostfiles/) is one COPY in the runtime stage's last layer, so a change of the source rebuilds that
# layer alone (the builder installs bert_tf editable from a placeholder package the source replaces).
# tests/services.py builds the part before that COPY as an image of its own (bert_tf:cpu-deps-<key>)
# and the rest FROM it: the same instructions in the same order.
# Runs as the non-root user "bert". See docs/operations.md for multi-node use.
ARG BASE_IMAGE=debian:bookworm-20241111

# ------------------------------------------------------------------------------------ builder
FROM ${BASE_IMAGE} AS builder
ARG GPU=0
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ENV DEBIAN_FRONTEND=noninteractive BERT_TF_CACHE=/opt/bert_tf/cache BERT_TF_VENV=/opt/bert_tf/venv \
    BERT_TF_GPU=${GPU}
WORKDIR /opt/bert_tf/src
COPY requirements.txt requirements-dev.txt requirements-cuda.txt setup.py ./
COPY scripts/ scripts/
COPY docker/build-inputs/ /tmp/build-inputs/
# bert_tf/ is a placeholder here, for setup.sh's editable install (it puts /opt/bert_tf/src on the venv's
# path): the runtime stage copies the package over it last.
RUN if [ -s /tmp/build-inputs/ca.crt ]; then export PIP_CERT=/tmp/build-inputs/ca.crt; echo "pip uses the CA bundle from docker/build-inputs/ca.crt"; fi \
    && if [ -d /tmp/build-inputs/wheels ]; then mkdir -p "$BERT_TF_CACHE" && cp -r /tmp/build-inputs/wheels "$BERT_TF_CACHE/"; fi \
    && mkdir bert_tf && echo '"""Placeholder: the image copies the package here last."""' > bert_tf/__init__.py \
    && bash scripts/setup.sh \
    && rm -rf /tmp/build-inputs /root/.cache/pip "$BERT_TF_CACHE/downloads" "$BERT_TF_CACHE/toolkits" \
              /opt/bert_tf/src/scripts/__pycache__ /opt/bert_tf/src/bert_tf/__pycache__

# ------------------------------------------------------------------------------------ source
# The project source gathered in one folder, so that the runtime stage copies it as one layer (every
# layer after the venv is a full copy of the image on storage drivers such as vfs). Pulls nothing.
FROM scratch AS source
COPY bert_tf/ /src/bert_tf/
COPY run/ /src/run/
COPY configs/ /src/configs/
COPY hostfiles/ /src/hostfiles/

# ------------------------------------------------------------------------------------ runtime
FROM ${BASE_IMAGE} AS runtime
ARG GPU=0
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# OMPI_MCA_btl_vader_single_copy_mechanism: vader's single copy (CMA) needs ptrace rights containers
# lack ("Read -1, expected ..., errno = 1" from every MPI job).
# NVIDIA_*: what the NVIDIA container runtime mounts on a GPU node (every GPU; the CUDA driver and
# nvidia-smi, no graphics); nothing on a CPU node. NCCL finds its library by Horovod's RUNPATH, and
# NCCL_* settings reach ssh-started ranks through the entry point (docs/operations.md).
ENV DEBIAN_FRONTEND=noninteractive BERT_TF_CACHE=/opt/bert_tf/cache BERT_TF_VENV=/opt/bert_tf/venv \
    BERT_TF_GPU=${GPU} SSH_PORT=12345 TF_CPP_MIN_LOG_LEVEL=2 PATH=/opt/bert_tf/venv/bin:$PATH \
    OMPI_MCA_btl_vader_single_copy_mechanism=none \
    NVIDIA_VISIBLE_DEVICES=all NVIDIA_DRIVER_CAPABILITIES=compute,utility
# Settings first: the legacy builder commits every instruction as a layer, which storage drivers such
# as vfs store as a full copy of the file system: cheap here, gigabytes after the venv.
ENTRYPOINT ["/usr/local/bin/bert-tf-entrypoint"]
CMD ["run", "bash", "scripts/demo.sh"]
WORKDIR /opt/bert_tf/src
COPY docker/entrypoint.sh /usr/local/bin/bert-tf-entrypoint
# One COPY of the builder's /opt/bert_tf: its venv (with Horovod), wheel cache, corpus and the scripts
# it installed with. setup.sh below finds them in place and only installs the Debian packages (no
# compiler, no PyPI, no CA bundle here). Owned by "bert" (uid 1000) as copied: a chown -R later would
# store them twice.
COPY --from=builder --chown=1000:1000 /opt/bert_tf /opt/bert_tf
# hadolint ignore=DL3008
RUN bash scripts/setup.sh \
    && apt-get update && apt-get install -y --no-install-recommends openssh-server openssh-client \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --create-home --shell /bin/bash --uid 1000 bert \
    && mkdir -p /run/sshd && chown bert /opt/bert_tf /opt/bert_tf/src /opt/bert_tf/src/data \
    && rm -rf /opt/bert_tf/src/bert_tf/__pycache__
USER 1000:1000
# Last, and alone after the settings (each instruction costs the legacy builder a container, on vfs a full
# copy): the project source (bert_tf/ over the placeholder, run/, configs/, hostfiles/) in one layer.
COPY --from=source --chown=1000:1000 /src/ /opt/bert_tf/src/
