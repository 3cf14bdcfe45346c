#!/usr/bin/env bash
# GPU measurement runs: the throughput of hyocr, of its variants and of the raw vLLM and transformers
# baselines, the ViT's cost, where a request's time goes; in steps that each fit one 10-minute device call.
# On the device, after staging vLLM (../shared/docs/DEVICE.md), from the checkout:
#   source .stage/c2/install.sh && bash benchmarks/gpu_runs.sh STEP DIR   (then tar DIR into $OUT)
# STEP: vit     the vision encoder's cost per image: plain PyTorch eager/graphed, vLLM's forward vs hyocr's
#       diag    where a card's time goes at concurrency 64 (TARGETS, default: hyocr-vllm hyocr-vllm+vllm-vit)
#       hyocr   hyocr's shipped defaults on card, page and a4, with a py-spy profile and GPU traces
#       variants hyocr with one change each (VARIANTS, default: stream1 kv850 processes), card only
#       raw     raw vLLM AsyncLLM with its defaults on card, page and a4 (the baseline; same session)
#       transformers  hyocr's transformers engine on card and page (the baseline row)
#       serve   `vllm serve` with the official HunyuanOCR flags, over HTTP (needs .stage/c3's wheels carried)
#       hfgen   transformers' generate() on static batches (benchmarks/hf_generate.py), the PyTorch baseline
#       tsplit  the transformers engine alone (benchmarks/transformers_inprocess.py, py-spy) vs behind the
#               server vs static generate(), cards, one sitting (TCONC, default: 32 64)
#       dflash  hyocr vLLM with and without 1.5's DFlash draft (random weights: acceptance ~0, so this is the
#               overhead of the path and its correctness), cards and A4 (WORKLOADS), c=1 and 32
#       dp      hyocr vLLM with DATA_PARALLEL_SIZE=2 (VARIANT dp2) beside the default, cards at c=64 (on one GPU:
#               does vLLM place two cores on it?)
#       rayserve hyocr vLLM in one process vs as a Ray Serve application with one GPU replica (VARIANT ray1),
#               cards at c=1 and 64; Ray's wheels carried in .stage/c3a (staged to /tmp/stage3) and .stage/c3b
#       tcost   one decode step of the transformers engine's RunningBatch: ms/step by rows, padded or not,
#               sdpa vs eager, with torch.profiler's top ops (benchmarks/transformers_step_cost.py)
# Each step writes bench JSON (+ .gpu.csv traces, server logs) to DIR; copy the JSON to benchmarks/results/.
set -uo pipefail
step=${1:?step: vit | diag | hyocr | variants | raw | transformers | serve | hfgen | tsplit | tcost | dflash | dp | rayserve}
out=${2:?output directory}
mkdir -p "$out"
# An A4 page takes ~4x a card: two requests per stream keep its levels near half a minute.
A4_REQUESTS=${A4_REQUESTS:-32,32,64,128}
export HYOCR_BENCH_REQUESTS="a4=$A4_REQUESTS ${HYOCR_BENCH_REQUESTS:-}"  # the caller's counts win
export PYTHONPATH="$PWD/src:${PYTHONPATH:-}"
pyspy=$(command -v py-spy || true)
if [ -z "$pyspy" ] && ls .whl/py_spy-*.whl >/dev/null 2>&1; then  # carried as a wheel: unpack it
  python3 -m pip install -q --no-index --no-deps --target /tmp/pyspy .whl/py_spy-*.whl && pyspy=/tmp/pyspy/bin/py-spy
fi
case "$step" in
  vit)
    python3 benchmarks/vit_cost.py "$out/vit-cost.json"; exit ;;
  diag)
    HYOCR_BENCH_PYSPY="$pyspy" python3 benchmarks/request_time_breakdown.py "$out" ${TARGETS:-hyocr-vllm hyocr-vllm+vllm-vit}
    exit ;;
  hyocr)
    HYOCR_BENCH_WORKLOAD=${WORKLOADS:-card,page,a4} HYOCR_BENCH_PYSPY="${PYSPY_ON:+$pyspy}" \
      python3 benchmarks/engines_gpu.py "$out" hyocr-vllm ;;
  variants)
    targets=()
    for v in ${VARIANTS:-stream1 kv850 processes}; do targets+=("hyocr-vllm+$v"); done
    HYOCR_BENCH_WORKLOAD=${WORKLOADS:-card} python3 benchmarks/engines_gpu.py "$out" "${targets[@]}" ;;
  raw)
    python3 -c "import sys; sys.path.insert(0, 'benchmarks'); import engines_gpu; engines_gpu.build_checkpoint()"
    timeout -k 5 540 python3 benchmarks/raw_vllm.py /tmp/hunyuanocr-1.0-random "$out/{workload}-raw-vllm.json" \
      --workload ${WORKLOADS:-card,page,a4} --requests "a4=$A4_REQUESTS" > "$out/raw.log" 2>&1
    pkill -9 -f EngineCore ;;
  transformers)
    HYOCR_BENCH_WORKLOAD=${WORKLOADS:-card,page} python3 benchmarks/engines_gpu.py "$out" hyocr-transformers ;;
  serve)  # vLLM's own OpenAI server needs a few packages more than AsyncLLM (../shared/docs/DEVICE.md)
    [ -d /tmp/serve-site/uvloop ] || python3 -m pip install -q --no-index --no-deps --target /tmp/serve-site .stage/c3/*.whl
    PYTHONPATH="$PYTHONPATH:/tmp/serve-site" HYOCR_BENCH_WORKLOAD=${WORKLOADS:-card,a4} \
      python3 benchmarks/engines_gpu.py "$out" vllm-serve ;;
  hfgen)
    python3 -c "import sys; sys.path.insert(0, 'benchmarks'); import engines_gpu; engines_gpu.build_checkpoint()"
    for b in ${BATCHES:-32}; do
      python3 benchmarks/hf_generate.py /tmp/hunyuanocr-1.0-random "$out/card-hf-generate-b$b.json" --batch "$b" \
        --requests $((b * 2)) >> "$out/hfgen.log" 2>&1
    done ;;
  tsplit)
    python3 -c "import sys; sys.path.insert(0, 'benchmarks'); import engines_gpu; engines_gpu.build_checkpoint()"
    for c in ${TCONC:-32 64}; do
      spy=()
      [ -n "$pyspy" ] && spy=("$pyspy" record --threads --nonblocking -r 50 -f raw -o "$out/inprocess-c$c.pyspy.txt" --)
      "${spy[@]}" python3 benchmarks/transformers_inprocess.py /tmp/hunyuanocr-1.0-random \
        "$out/card-transformers-inprocess-c$c.json" --concurrency "$c" --max-tokens 150 >> "$out/tsplit.log" 2>&1
    done
    python3 benchmarks/hf_generate.py /tmp/hunyuanocr-1.0-random "$out/card-hf-generate-b32.json" --batch 32 \
      --requests 64 >> "$out/tsplit.log" 2>&1
    python3 benchmarks/hf_generate.py /tmp/hunyuanocr-1.0-random "$out/card-hf-generate-b32-nocudnn.json" --batch 32 \
      --requests 64 --no-cudnn >> "$out/tsplit.log" 2>&1
    HYOCR_BENCH_CONCURRENCY=${SERVER_CONC:-32,64} HYOCR_BENCH_WORKLOAD=card \
      python3 benchmarks/engines_gpu.py "$out" hyocr-transformers ;;
  dflash)
    python3 benchmarks/dflash_draft.py /tmp/dflash-random > /dev/null
    HYOCR_BENCH_PROBE=1 HYOCR_BENCH_CONCURRENCY=${CONCURRENCY:-1,32} HYOCR_BENCH_WORKLOAD=${WORKLOADS:-card} \
      python3 benchmarks/engines_gpu.py "$out" hyocr-vllm hyocr-vllm+dflash
    python3 benchmarks/output_probe.py --compare "$out/hyocr-vllm.outputs.json" "$out/hyocr-vllm--dflash.outputs.json" \
      > "$out/dflash-outputs-compare.json" ;;
  dp)
    HYOCR_BENCH_CONCURRENCY=${CONCURRENCY:-64} HYOCR_BENCH_WORKLOAD=${WORKLOADS:-card} \
      python3 benchmarks/engines_gpu.py "$out" hyocr-vllm+dp2 ;;
  rayserve)
    if [ ! -d /tmp/ray-site/ray ]; then  # Ray's wheel is split over the two carries (64 MiB a call)
      name=$(basename "$(ls /tmp/stage3/*.part00 | head -1)" .part00)
      cat /tmp/stage3/"$name".part* .stage/c3b/"$name".part* > /tmp/"$name"
      python3 -m pip install -q --no-index --no-deps --target /tmp/ray-site /tmp/"$name" .stage/c3b/*.whl
    fi
    PYTHONPATH="$PYTHONPATH:/tmp/ray-site" RAY_USAGE_STATS_ENABLED=0 HYOCR_BENCH_CONCURRENCY=${CONCURRENCY:-1,64} \
      HYOCR_BENCH_WORKLOAD=${WORKLOADS:-card} python3 benchmarks/engines_gpu.py "$out" hyocr-vllm hyocr-vllm+ray1 ;;
  tcost)
    python3 -c "import sys; sys.path.insert(0, 'benchmarks'); import engines_gpu; engines_gpu.build_checkpoint()"
    python3 benchmarks/transformers_step_cost.py /tmp/hunyuanocr-1.0-random "$out/transformers-step-cost.json" \
      --rows ${TROWS:-32,64} --attention ${ATTENTION:-sdpa,sdpa+cudnn,eager} >> "$out/tcost.log" 2>&1 ;;
  *) echo "unknown step $step" >&2; exit 2 ;;
esac
for f in "$out"/{card,page,a4}-*.json; do
  [ -e "$f" ] || continue
  python3 - "$f" <<'EOF'
import json, sys
doc = json.load(open(sys.argv[1]))
if "levels" not in doc:
    print(sys.argv[1].rsplit("/", 1)[-1], doc.get("throughput_rps"), doc.get("model_thread", ""))
    raise SystemExit
print(sys.argv[1].rsplit("/", 1)[-1], [(lv["concurrency"], lv["throughput_rps"], lv["latency_p50_s"], lv["ttft_p50_s"],
      round((lv["peak_gpu_memory_bytes"] or 0) / 2**30, 1), lv["errors"]) for lv in doc["levels"]])
EOF
done
