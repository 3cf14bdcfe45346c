#!/usr/bin/env bash
# The API on vLLM (the reference article's 2-API接口-vllm.sh): HunyuanOCR, port 8000.
#   MODEL=tencent/HunyuanOCR SUBFOLDER=v1.0 scripts/api-vllm.sh [more hyocr serve flags]
# Needs: pip install -e ".[vllm]" on a machine with a GPU.
set -euo pipefail
exec hyocr serve --engine vllm --model "${MODEL:-tencent/HunyuanOCR}" ${SUBFOLDER:+--subfolder "$SUBFOLDER"} \
  --host "${HOST:-0.0.0.0}" --port "${PORT:-8000}" "$@"
