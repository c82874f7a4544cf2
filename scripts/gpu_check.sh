#!/usr/bin/env bash
# Issue 30's GPU check, for a one-GPU machine (under 8 minutes): the GPU tests (marker `gpu`),
# then images/s per stage (CPU decode per core, nvJPEG batched decode, the head contiguous and
# channels_last) and end to end through the extraction engine, for ResNet18 to layer2 and
# EfficientNet-Lite0 to split 9 over the 500x375 photos.
#
#   scripts/gpu_check.sh [--images 512] [--batch 128]     # PYTHON=... to pick the interpreter
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-.venv/bin/python}"
[ -x "$PYTHON" ] || PYTHON=python3
"$PYTHON" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 2)' || {
  echo "gpu_check: no CUDA device; nothing to check" >&2
  exit 2
}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
timeout 240 "$PYTHON" -m pytest -m gpu -q -p no:cacheprovider \
  tests/hapi_models/test_transforms_cuda.py tests/hapi_core/test_core_layout.py
timeout 300 "$PYTHON" -m hapi_bench.gpu_check "$@"
