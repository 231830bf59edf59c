#!/usr/bin/env bash
# Wheels for the GPU machine (`make gpu-wheels`): Prefect 3.8.8 and everything it needs, as Python 3.12 manylinux
# wheels in .whl/, for a machine that has Python 3.12, torch, nvidia-ml-py, numpy, scipy, pandas, pyyaml,
# scikit-learn and matplotlib but no network. The wheels of what that machine already has (SKIP, as pip names
# distributions) are left out: a copy in front of its own on PYTHONPATH would shadow it. .whl/ is git-ignored
# and travels with the working tree (~40 MB); mlflow and ray do not fit beside it, so check 7 SKIPs there.
#
# There, from the repository root:
#   python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl &&
#   PYTHONPATH=/tmp/site:$PWD python3 -m benchmarks.gpu_check --json $OUT/gpu.json
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
SKIP=${SKIP:-"torch nvidia-ml-py numpy"}
rm -rf .whl
"$PYTHON" -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d .whl prefect==3.8.8 fastapi==0.139.0 sqlalchemy==2.0.58
for name in $SKIP; do
  # wheel file names spell a distribution with underscores: nvidia-ml-py -> nvidia_ml_py-13.615.71-py3-none-any.whl
  rm -f .whl/"${name//-/_}"-[0-9]*.whl
done
echo "$(ls .whl/*.whl | wc -l) wheels, $(du -sh .whl | cut -f1) in .whl/ (left out: $SKIP)"
