# bert_tf node image. One Dockerfile, two targets, both installed by scripts/setup.sh (the same
# script CI runs, so versions and the Horovod build have one source of truth):
#   docker build -t bert_tf:cpu .                                    # Debian bookworm, Python 3.11
#   docker build -t bert_tf:gpu --build-arg VARIANT=gpu .            # CUDA 12.5.1 + cuDNN 9 (TF 2.21's), NCCL
# The Horovod wheel is built in the builder stage; only the wheel (and the venv's pins) reach the
# runtime stage. Runs as the non-root user "bert". See docs/operations.md for multi-node use.
ARG VARIANT=cpu

FROM debian:bookworm-20241111 AS base-cpu
ENV BERT_TF_HOROVOD_GPU=0

FROM nvidia/cuda:12.5.1-cudnn-devel-ubuntu22.04 AS base-gpu
ENV BERT_TF_HOROVOD_GPU=1

# ------------------------------------------------------------------------------------ builder
# hadolint ignore=DL3006
FROM base-${VARIANT} AS builder
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ENV DEBIAN_FRONTEND=noninteractive BERT_TF_CACHE=/opt/bert_tf/cache BERT_TF_VENV=/opt/bert_tf/venv
# hadolint ignore=DL3008
RUN apt-get update && apt-get install -y --no-install-recommends bash ca-certificates \
    && if [ "$BERT_TF_HOROVOD_GPU" = 1 ]; then apt-get install -y --no-install-recommends libnccl-dev; fi \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /opt/bert_tf/src
COPY requirements.txt requirements-dev.txt setup.py ./
COPY scripts/ scripts/
COPY bert_tf/ bert_tf/
RUN bash scripts/setup.sh

# ------------------------------------------------------------------------------------ runtime
# hadolint ignore=DL3006
FROM base-${VARIANT} AS runtime
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ENV DEBIAN_FRONTEND=noninteractive BERT_TF_CACHE=/opt/bert_tf/cache BERT_TF_VENV=/opt/bert_tf/venv \
    SSH_PORT=12345 TF_CPP_MIN_LOG_LEVEL=2
# hadolint ignore=DL3008
RUN apt-get update && apt-get install -y --no-install-recommends bash ca-certificates openssh-server openssh-client \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --create-home --shell /bin/bash --uid 1000 bert \
    && mkdir -p /opt/bert_tf /run/sshd && chown bert /opt/bert_tf
# Only the built wheel comes from the builder; setup.sh installs it instead of building (no compiler here).
COPY --from=builder /opt/bert_tf/cache/wheels /opt/bert_tf/cache/wheels
WORKDIR /opt/bert_tf/src
COPY requirements.txt requirements-dev.txt setup.py README.md ./
COPY scripts/ scripts/
COPY bert_tf/ bert_tf/
COPY run/ run/
COPY configs/ configs/
COPY hostfiles/ hostfiles/
COPY docker/entrypoint.sh /usr/local/bin/bert-tf-entrypoint
# The bundled demo corpus is fetched at build time, checked against scripts/corpus.sha256.
RUN bash scripts/setup.sh && chown -R bert /opt/bert_tf
USER 1000:1000
ENV PATH=/opt/bert_tf/venv/bin:$PATH
ENTRYPOINT ["/usr/local/bin/bert-tf-entrypoint"]
CMD ["run", "bash", "scripts/demo.sh"]
