#!/usr/bin/env bash
# The issue-9 measurements on the GPU machine, in steps that each fit one 10-minute device call.
# On the device, after staging vLLM (../shared/docs/DEVICE.md) and exporting the code to .stage/hyocr:
#   source .stage/c2/install.sh && cd .stage/hyocr && bash benchmarks/h200_issue9.sh STEP $OUT/DIR
# STEP: hyocr   hyocr's shipped defaults on card, page and a4, with a py-spy profile and GPU traces
#       variants hyocr with one change each (VARIANTS, default: stream1 kv850 processes), card only
#       raw     raw vLLM AsyncLLM with its defaults on card, page and a4 (the baseline; same session)
# Each step writes bench JSON (+ .gpu.csv traces, server logs) to DIR; copy the JSON to benchmarks/results/.
set -uo pipefail
step=${1:?step: hyocr | variants | raw}
out=${2:?output directory}
mkdir -p "$out"
export PYTHONPATH="$PWD/src:${PYTHONPATH:-}"
pyspy=$(command -v py-spy || true)
if [ -z "$pyspy" ] && ls .whl/py_spy-*.whl >/dev/null 2>&1; then  # carried as a wheel: unpack it
  python -m pip install -q --no-index --no-deps --target /tmp/pyspy .whl/py_spy-*.whl && pyspy=/tmp/pyspy/bin/py-spy
fi
case "$step" in
  hyocr)
    HYOCR_BENCH_WORKLOAD=card,page,a4 HYOCR_BENCH_PYSPY="$pyspy" python benchmarks/engines_gpu.py "$out" hyocr-vllm ;;
  variants)
    targets=()
    for v in ${VARIANTS:-stream1 kv850 processes}; do targets+=("hyocr-vllm+$v"); done
    HYOCR_BENCH_WORKLOAD=card python benchmarks/engines_gpu.py "$out" "${targets[@]}" ;;
  raw)
    timeout -k 5 540 python benchmarks/raw_vllm.py /tmp/hunyuanocr-1.0-random "$out/{workload}-raw-vllm.json" \
      --workload card,page,a4 > "$out/raw.log" 2>&1
    pkill -9 -f EngineCore ;;
  *) echo "unknown step $step" >&2; exit 2 ;;
esac
for f in "$out"/*.json; do
  python - "$f" <<'EOF'
import json, sys
doc = json.load(open(sys.argv[1]))
print(sys.argv[1].rsplit("/", 1)[-1], [(lv["concurrency"], lv["throughput_rps"], lv["latency_p50_s"], lv["ttft_p50_s"],
      round((lv["peak_gpu_memory_bytes"] or 0) / 2**30, 1), lv["errors"]) for lv in doc["levels"]])
EOF
done
