#!/usr/bin/env bash
# The web UI (and the API) on HunyuanOCR with PyTorch transformers, port 7860: open http://127.0.0.1:7860/ui
#   MODEL=tencent/HunyuanOCR SUBFOLDER=v1.0 scripts/ui-pt.sh [more hyocr ui flags, e.g. --device cuda]
# Needs: pip install -e ".[hf]" (a GPU is best; --device cpu works, slowly).
set -euo pipefail
exec hyocr ui --engine transformers --model "${MODEL:-tencent/HunyuanOCR}" ${SUBFOLDER:+--subfolder "$SUBFOLDER"} \
  --host "${HOST:-0.0.0.0}" --port "${PORT:-7860}" "$@"
