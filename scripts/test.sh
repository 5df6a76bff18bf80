#!/usr/bin/env bash
# Installs what is missing (scripts/setup.sh), then runs the test suite.
# Extra arguments go to pytest, e.g. `bash scripts/test.sh -k masking`.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
bash "$BERT_TF_REPO/scripts/setup.sh"
cd "$BERT_TF_REPO"
exec python -m pytest "$@"
