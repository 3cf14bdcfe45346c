#!/usr/bin/env bash
# Issue 30's measurement, one device sitting, started in the background so that it outlives one 10-minute call.
# Build the bundle (DEVICE.md, with the NOTES list of hyocr's own packages) and .stage/c3 (vllm serve's wheels),
# then, back to back (the machine goes back after 30 s idle):
#   run 1, carry [.stage/c1]:           mkdir -p /tmp/stage && cp .stage/c1/* /tmp/stage/
#   run 2, carry [.stage/c2, .stage/c3]: source .stage/c2/install.sh || exit 9; cp -r .stage/c3 /tmp/c3;
#        (C3=/tmp/c3 setsid nohup bash benchmarks/issue30_sitting.sh /tmp/s25 s25 > /tmp/s25.log 2>&1 &);
#        sleep 560; cat /tmp/s25/sitting.txt; tar czf $OUT/s25.tgz --exclude="*.pt.trace.json.gz" -C /tmp s25 s25.log
#   run 3.., no carry:                  sleep 560; cat /tmp/s25/sitting.txt; tar czf $OUT/s25.tgz --exclude="*.pt.trace.json.gz" -C /tmp s25 s25.log
# (the tar in every call: a sitting cut short still brings back what it measured). Every target through benchmarks/cores_gpu.py (one
# bench call per level, GPU busy and each process's CPU recorded), HunyuanOCR 1.0 architecture, random weights.
# C3 (default .stage/c3) holds the wheels vllm serve needs beyond the bundle (DEVICE.md), plus httptools (cp312),
# which with uvloop is what `pip install hyocr` brings through uvicorn[standard]: `pip download --no-deps
# --only-binary=:all: --python-version 3.12 --implementation cp --abi cp312 --platform manylinux_2_17_x86_64 -d
# .stage/c3 uvloop httptools ...`, and py-spy for the c=64 diagnosis (`pip download --no-deps --only-binary=:all:
# --platform manylinux1_x86_64 -d .stage/c3 py-spy`: its binary lands in /tmp/serve-site/bin).
set -uo pipefail
out=${1:?output directory}
mkdir -p "$out"
export PYTHONPATH="$PWD/src:${PYTHONPATH:-}" CAPABILITIES=1
started=$(date +%s)
elapsed() { echo $(( $(date +%s) - started )); }
note() { echo "[$(elapsed)s] $*" | tee -a "$out/sitting.txt"; }

# Parts: s25, the next sitting (NOTES entries 34-35: one torch thread in the engine process against torch's default, the
# core's pixel batching timed and staged in reused pinned buffers, CUDA graphs for prefill-sized steps, each beside the
# defaults, then `vllm serve`); s24, what session 24 ran
# (docs/benchmarks.md "H100, session 24"). C3's uvloop and httptools are what hyocr's uvicorn[standard] installs for
# a user: every target runs with them. The device bundle's parts: c1 56 MiB, c2 the rest (the checkout is ~4 MB,
# one call carries 64 MiB).
[ -d /tmp/serve-site/uvloop ] || python3 -m pip install -q --no-index --no-deps --target /tmp/serve-site "${C3:-.stage/c3}"/*.whl
export PYTHONPATH="$PYTHONPATH:/tmp/serve-site"
part=${2:-s25}  # s25 (the next sitting) or s24 (session 24's, run)
if [[ $part == s25 ]]; then  # session 25's plan, run in session 27 in priority order (the baseline third, ~1350 s)
  note "three cores, three API processes, FP8 KV: defaults (one torch thread in each core, new; c=64 for the p99"
  note "target too), then torch's default threads (OMP_NUM_THREADS=cpu count, as vLLM 0.26 leaves them)"
  CARD_LEVELS=64,256 LEVELS_ONLY=card python3 benchmarks/cores_gpu.py "$out" hyocr-vllm+fp8kv-api3-cores3
  CARD_LEVELS=256 LEVELS_ONLY=card python3 benchmarks/cores_gpu.py "$out" hyocr-vllm+omp-fp8kv-api3-cores3
  note "vllm serve (official flags)"
  CARD_LEVELS=256 LEVELS_ONLY=card python3 benchmarks/cores_gpu.py "$out" vllm-serve
  note "three cores, three API processes, FP8 KV: ring, graphs"
  for v in ring-fp8kv-api3-cores3 graphs-fp8kv-api3-cores3; do
    CARD_LEVELS=256 LEVELS_ONLY=card python3 benchmarks/cores_gpu.py "$out" "hyocr-vllm+$v"
  done
  note "one core at c=64, the core's byte-pixel batching timed (the encoder timing file), vLLM's own, then the ring"
  python3 benchmarks/request_time_breakdown.py "$out/diag" hyocr-vllm > "$out/diag.log" 2>&1
  grep -o '"encoder": {[^}]*}' "$out/diag.log" | tee -a "$out/sitting.txt"
  HYOCR_PIXEL_STAGING=ring python3 benchmarks/request_time_breakdown.py "$out/diag-ring" hyocr-vllm > "$out/diag-ring.log" 2>&1
  grep -o '"encoder": {[^}]*}' "$out/diag-ring.log" | tee -a "$out/sitting.txt"
  note "one core at c=1 and c=64: defaults; at c=64: torch's default threads, graphs"
  CARD_LEVELS=1,64 LEVELS_ONLY=card python3 benchmarks/cores_gpu.py "$out" hyocr-vllm+v2
  for v in hyocr-vllm+omp hyocr-vllm+graphs; do
    CARD_LEVELS=64 LEVELS_ONLY=card python3 benchmarks/cores_gpu.py "$out" "$v"
  done
  note "done"
  exit 0
fi
if [[ $part == s24 ]]; then  # session 24's one sitting (~1250 s), the device budget after three refused starts
  note "a torch profile of one core at c=64 (the encoder's embedding and merger as matrix products, new)"
  python3 benchmarks/gpu_profile.py "$out/profile-c64" --concurrency 64 --steps 300 > "$out/profile-c64.log" 2>&1
  grep -h "self test" "$out/profile-c64.log" | tail -1 | cut -c1-300 | tee -a "$out/sitting.txt"
  python3 -c "import json,sys; d=json.load(open(sys.argv[1])); d.pop('top_kernels'); print(json.dumps(d))" \
    "$out/profile-c64/profile.json" | tee -a "$out/sitting.txt"
  note "one core at c=64 under py-spy"
  spy=$(ls /tmp/serve-site/bin/py-spy 2>/dev/null)
  HYOCR_BENCH_PYSPY=$spy python3 benchmarks/request_time_breakdown.py "$out/diag" hyocr-vllm > "$out/diag.log" 2>&1
  tail -60 "$out/diag.log" | tee -a "$out/sitting.txt"
  note "three cores, three API processes, FP8 KV cache"
  CARD_LEVELS=256 LEVELS_ONLY=card python3 benchmarks/cores_gpu.py "$out" "hyocr-vllm+fp8kv-api3-cores3"
  note "vllm serve (official flags)"
  CARD_LEVELS=256 LEVELS_ONLY=card python3 benchmarks/cores_gpu.py "$out" vllm-serve
  note "one core on A4 pages, then the same with vLLM's convolutions (HYOCR_VISION_GEMM=0)"
  CARD_LEVELS= A4_LEVELS=64 python3 benchmarks/cores_gpu.py "$out" hyocr-vllm
  CARD_LEVELS= A4_LEVELS=64 python3 benchmarks/cores_gpu.py "$out" "hyocr-vllm+convs"
  note "one core with two API processes at c=64, then one core at c=64 and c=1"
  CARD_LEVELS=64 LEVELS_ONLY=card python3 benchmarks/cores_gpu.py "$out" "hyocr-vllm+api2"
  CARD_LEVELS=64,1 LEVELS_ONLY=card python3 benchmarks/cores_gpu.py "$out" "hyocr-vllm+v2"
  note "done"
  exit 0
fi
echo "unknown part: $part (s25, the next sitting; s24, the one session 24 ran)"; exit 2
