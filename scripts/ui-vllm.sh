#!/usr/bin/env bash
# The web UI (and the API) on vLLM, port 7860: open http://127.0.0.1:7860/ui
#   MODEL=tencent/HunyuanOCR SUBFOLDER=v1.0 scripts/ui-vllm.sh [more hyocr ui flags]
#   HOST=0.0.0.0 to listen beyond loopback: then set HYOCR_API_KEYS (or HYOCR_ALLOWED_IPS), or it warns.
# Needs: pip install -e ".[vllm]" on a machine with a GPU.
set -euo pipefail
exec hyocr ui --engine vllm --model "${MODEL:-tencent/HunyuanOCR}" ${SUBFOLDER:+--subfolder "$SUBFOLDER"} \
  --host "${HOST:-${HYOCR_HOST:-127.0.0.1}}" --port "${PORT:-7860}" "$@"
