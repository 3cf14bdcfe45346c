#!/usr/bin/env bash
# The web UI (and the API) on HunyuanOCR with PyTorch transformers, port 7860: open http://127.0.0.1:7860/ui
#   MODEL=tencent/HunyuanOCR SUBFOLDER=v1.0 scripts/ui-pt.sh [more hyocr ui flags, e.g. --device cuda]
#   HOST=0.0.0.0 to listen beyond loopback: then set HYOCR_API_KEYS (or HYOCR_ALLOWED_IPS), or it warns.
# Needs: pip install -e ".[hf]" (a GPU is best; --device cpu works, slowly).
set -euo pipefail
exec hyocr ui --engine transformers --model "${MODEL:-tencent/HunyuanOCR}" ${SUBFOLDER:+--subfolder "$SUBFOLDER"} \
  --host "${HOST:-${HYOCR_HOST:-127.0.0.1}}" --port "${PORT:-7860}" "$@"
