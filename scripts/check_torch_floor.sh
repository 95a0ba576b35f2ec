#!/usr/bin/env bash
# The suite on the oldest torch pyproject.toml allows (or the version given), in a throwaway venv, as a user would
# install it: that torch from PyPI (its CUDA build where PyPI has no other: several GB, in this venv only), then
# dgl-oac with its test extra, then README's test command.
#
#   bash scripts/check_torch_floor.sh            # the floor: the torch>=X of pyproject.toml
#   bash scripts/check_torch_floor.sh 2.7.1      # another version
#
# Measured 2026-11-28 (Python 3.11, DGL 1.1.3; README's table): torch 2.8.0, 1356 passed, 16 skipped. Below it:
# 2.7.0 and 2.7.1 deadlock now and then in destroy_process_group (scripts/repro_destroy_hang.py plain, plain torch),
# 2.4.1 lacks the checkpoints' no_dist (35 failed, 12 errors).
set -euo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
floor=$(sed -n 's/^ *"torch>=\([0-9.]*\)".*/\1/p' "$REPO/pyproject.toml")
version=${1:-$floor.0}
[[ $version == *.*.* ]] || version=$version.0
VENV=${TORCH_FLOOR_VENV:-/tmp/dgl-oac-torch-$version}
SRC=$(mktemp -d /tmp/dgl-oac-floor-src.XXXXXX)

git clone -q "$REPO" "$SRC"  # the committed tree, as CI checks it out
[[ -x $VENV/bin/python ]] || python3 -m venv "$VENV"
# /etc/xdg/pip may cap torch for this machine's own venvs; this throwaway one asks PyPI for the exact version
PIP_CONFIG_FILE=/dev/null "$VENV/bin/python" -m pip install -q "torch==$version"
cd "$SRC"
PIP_CONFIG_FILE=/dev/null "$VENV/bin/python" -m pip install -q -e ".[test]"
"$VENV/bin/python" -c "import torch; print('torch', torch.__version__)"
DGL_OAC_DATA=${DGL_OAC_DATA:-$REPO/../shared/data} "$VENV/bin/python" -m pytest -n 2 -p no:cacheprovider
