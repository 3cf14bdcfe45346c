#!/usr/bin/env bash
# The API on vLLM (the reference article's 2-API接口-vllm.sh): HunyuanOCR, port 8000.
#   MODEL=tencent/HunyuanOCR SUBFOLDER=v1.0 scripts/api-vllm.sh [more hyocr serve flags]
#   HOST=0.0.0.0 to listen beyond loopback: then set HYOCR_API_KEYS (or HYOCR_ALLOWED_IPS), or it warns.
# Needs: pip install -e ".[vllm]" on a machine with a GPU.
set -euo pipefail
exec hyocr serve --engine vllm --model "${MODEL:-tencent/HunyuanOCR}" ${SUBFOLDER:+--subfolder "$SUBFOLDER"} \
  --host "${HOST:-${HYOCR_HOST:-127.0.0.1}}" --port "${PORT:-8000}" "$@"
