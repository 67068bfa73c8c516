#!/usr/bin/env bash
# The GPU checks: every test marked `gpu` (cuda device, bf16/fp16 autocast on cuda, the
# gradient scaler and its bitwise resume, nccl DDP on two GPUs). Run on a machine with CUDA:
#     tools/gpu_check.sh            # uses .venv/bin/python, or $PYTHON
# Without CUDA every one of them is skipped (and this script says so).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
"$PY" - <<'PY'
import torch
print(f"torch {torch.__version__}, CUDA available: {torch.cuda.is_available()}, "
      f"devices: {torch.cuda.device_count()}")
PY
PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" exec "$PY" -m pytest -m gpu -q -p no:randomly -rs "$@" tests
