#!/usr/bin/env bash
# Issue 30's measurement, one device sitting, started in the background so that it outlives one 10-minute call.
# Build the bundle (DEVICE.md, with the NOTES list of hyocr's own packages) and .stage/c3 (vllm serve's wheels),
# then, back to back (the machine goes back after 30 s idle):
#   run 1, carry [.stage/c1]:           mkdir -p /tmp/stage && cp .stage/c1/* /tmp/stage/
#   run 2, carry [.stage/c2, .stage/c3]: source .stage/c2/install.sh || exit 9; cp -r .stage/c3 /tmp/c3;
#        (C3=/tmp/c3 setsid nohup bash benchmarks/issue30_sitting.sh /tmp/s31 s31 > /tmp/s31.log 2>&1 &);
#        sleep 150; cat /tmp/s31/sitting.txt; tail -n 5 /tmp/s31/*.server.log
#        (a short first look: session 29 slept 535 s through a server that had died at import)
#   run 3.., no carry:                  sleep 560; cat /tmp/s31/sitting.txt; tar czf $OUT/s31.tgz --exclude="*.pt.trace.json.gz" -C /tmp s31 s31.log
#   (a later call's shell has not sourced install.sh: source it again, carrying .stage/c2, before starting anything)
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

# Parts: s28, the next sitting (issue 30's Measure table: hyocr's card setting at c=32-256, `vllm serve` with the
# official flags and with --api-server-count 4, hyocr's defaults on cards and A4, four cores); s25, what session 27 ran
# (docs/benchmarks.md "H100, session 27": one torch thread in the engine process against torch's default, CUDA graphs
# for prefill-sized steps, the core's pixel batching timed; its reused pinned buffers, measured there, are gone).
# C3's uvloop and httptools are what hyocr's uvicorn[standard] installs for
# a user: every target runs with them. The device bundle's parts: c1 56 MiB, c2 the rest (the checkout is ~4 MB,
# one call carries 64 MiB).
[ -d /tmp/serve-site/uvloop ] || python3 -m pip install -q --no-index --no-deps --target /tmp/serve-site "${C3:-.stage/c3}"/*.whl
export PYTHONPATH="$PYTHONPATH:/tmp/serve-site"
part=${2:-s28}  # s28 (the next sitting) or s25 (session 27's, run)
if [[ $part == s25 ]]; then  # session 25's plan, run in session 27 in priority order (the baseline third, ~1350 s)
  note "three cores, three API processes, FP8 KV: defaults (one torch thread in each core, new; c=64 for the p99"
  note "target too), then torch's default threads (OMP_NUM_THREADS=cpu count, as vLLM 0.26 leaves them)"
  CARD_LEVELS=64,256 LEVELS_ONLY=card python3 benchmarks/cores_gpu.py "$out" hyocr-vllm+fp8kv-api3-cores3
  CARD_LEVELS=256 LEVELS_ONLY=card python3 benchmarks/cores_gpu.py "$out" hyocr-vllm+omp-fp8kv-api3-cores3
  note "vllm serve (official flags)"
  CARD_LEVELS=256 LEVELS_ONLY=card python3 benchmarks/cores_gpu.py "$out" vllm-serve
  note "three cores, three API processes, FP8 KV: graphs"
  CARD_LEVELS=256 LEVELS_ONLY=card python3 benchmarks/cores_gpu.py "$out" hyocr-vllm+graphs-fp8kv-api3-cores3
  note "one core at c=64, the core's byte-pixel batching timed (the encoder timing file)"
  python3 benchmarks/request_time_breakdown.py "$out/diag" hyocr-vllm > "$out/diag.log" 2>&1
  grep -o '"encoder": {[^}]*}' "$out/diag.log" | tee -a "$out/sitting.txt"
  note "one core at c=1 and c=64: defaults; at c=64: torch's default threads, graphs"
  CARD_LEVELS=1,64 LEVELS_ONLY=card python3 benchmarks/cores_gpu.py "$out" hyocr-vllm+v2
  for v in hyocr-vllm+omp hyocr-vllm+graphs; do
    CARD_LEVELS=64 LEVELS_ONLY=card python3 benchmarks/cores_gpu.py "$out" "$v"
  done
  note "done"
  exit 0
fi
if [[ $part == s28 ]]; then  # issue 30's Measure table, the targets in priority order (~1400 s; a cut keeps the first)
  export REQUESTS_PER_STREAM=8  # twice session 27's: the ramp-up and drain weigh less in a level's rate
  note "hyocr for cards: three cores, three API processes, FP8 KV (the README's card setting)"
  CARD_LEVELS=32,64,128,192,256 LEVELS_ONLY=card python3 benchmarks/cores_gpu.py "$out" hyocr-vllm+fp8kv-api3-cores3
  note "vllm serve (official flags): cards and A4"
  CARD_LEVELS=1,64,256 A4_LEVELS=64 python3 benchmarks/cores_gpu.py "$out" vllm-serve
  note "hyocr's defaults (one core): cards at c=1 and c=64, A4"
  CARD_LEVELS=1,64 A4_LEVELS=64,128 python3 benchmarks/cores_gpu.py "$out" hyocr-vllm
  note "vllm serve --api-server-count 4"
  CARD_LEVELS=128,256 LEVELS_ONLY=card python3 benchmarks/cores_gpu.py "$out" vllm-serve+api4
  note "four cores, four API processes, FP8 KV (the cores' CPU a card is a quarter of session 24's since one thread)"
  CARD_LEVELS=256 LEVELS_ONLY=card python3 benchmarks/cores_gpu.py "$out" hyocr-vllm+fp8kv-api4-cores4
  note "done"
  exit 0
fi
if [[ $part == s29 ]]; then  # s28's hyocr targets again, after a fix (its hyocr servers had failed to import)
  export REQUESTS_PER_STREAM=8
  note "hyocr for cards: three cores, three API processes, FP8 KV (the README's card setting)"
  CARD_LEVELS=32,64,128,192,256 LEVELS_ONLY=card python3 benchmarks/cores_gpu.py "$out" hyocr-vllm+fp8kv-api3-cores3
  note "hyocr's defaults (one core): cards at c=1 and c=64, A4 c=64"
  CARD_LEVELS=1,64 A4_LEVELS=64 python3 benchmarks/cores_gpu.py "$out" hyocr-vllm
  note "four cores, four API processes, FP8 KV"
  CARD_LEVELS=256 LEVELS_ONLY=card python3 benchmarks/cores_gpu.py "$out" hyocr-vllm+fp8kv-api4-cores4
  note "hyocr's defaults: A4 c=128"
  CARD_LEVELS=1 A4_LEVELS=128 python3 benchmarks/cores_gpu.py "$out" hyocr-vllm
  note "done"
  exit 0
fi
if [[ $part == s30 ]]; then  # NOTES entry 37: c=1 on one torch thread or torch's pool, A4, the rest of the table
  export REQUESTS_PER_STREAM=8
  python3 -c "import hyocr.cli, hyocr.server.uvicorn, hyocr.api.app" || { note "hyocr does not import"; exit 3; }
  note "hyocr's defaults (one core, one torch thread): cards c=1 and c=64, A4 c=64 and c=128"
  CARD_LEVELS=1,64 A4_LEVELS=64,128 python3 benchmarks/cores_gpu.py "$out" hyocr-vllm
  note "one core on torch's default threads: cards c=1 and c=64"
  CARD_LEVELS=1,64 LEVELS_ONLY=card python3 benchmarks/cores_gpu.py "$out" hyocr-vllm+omp
  note "one core on vLLM's V1 model runner (what vllm serve runs): cards c=1"
  CARD_LEVELS=1 LEVELS_ONLY=card python3 benchmarks/cores_gpu.py "$out" hyocr-vllm+v1
  note "one core at c=1: where a card's time goes (request_time_breakdown.py, py-spy on the server processes)"
  HYOCR_DIAG_CONCURRENCY=1 HYOCR_DIAG_REQUESTS=48 HYOCR_BENCH_PYSPY=/tmp/serve-site/bin/py-spy \
    python3 benchmarks/request_time_breakdown.py "$out/diag1" hyocr-vllm > "$out/diag1.log" 2>&1
  tail -n 40 "$out/diag1.log" >> "$out/sitting.txt"
  note "vllm serve (official flags): cards c=1, 64, 256 and A4 c=64"
  CARD_LEVELS=1,64,256 A4_LEVELS=64 python3 benchmarks/cores_gpu.py "$out" vllm-serve
  note "three cores, three API processes, FP8 KV: cards c=32, 192, 256 and A4 c=64"
  CARD_LEVELS=32,192,256 A4_LEVELS=64 python3 benchmarks/cores_gpu.py "$out" hyocr-vllm+fp8kv-api3-cores3
  note "four cores, four API processes, FP8 KV: cards c=256"
  CARD_LEVELS=256 LEVELS_ONLY=card python3 benchmarks/cores_gpu.py "$out" hyocr-vllm+fp8kv-api4-cores4
  note "done"
  exit 0
fi
if [[ $part == s31 ]]; then  # NOTES entry 38: the whole table in one sitting, meant for an H200 (~1500 s)
  export REQUESTS_PER_STREAM=8
  python3 -c "import hyocr.cli, hyocr.server.uvicorn, hyocr.api.app" || { note "hyocr does not import"; exit 3; }
  nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee -a "$out/sitting.txt"
  note "hyocr for cards: three cores, three API processes, FP8 KV (the README's card setting)"
  CARD_LEVELS=64,128,192,256 LEVELS_ONLY=card python3 benchmarks/cores_gpu.py "$out" hyocr-vllm+fp8kv-api3-cores3
  note "vllm serve (official flags): cards c=1, 64, 192, 256 and A4 c=64"
  CARD_LEVELS=1,64,192,256 A4_LEVELS=64 python3 benchmarks/cores_gpu.py "$out" vllm-serve
  note "hyocr's defaults (one core): cards c=1, 32, 64 and A4 c=64, 128"
  CARD_LEVELS=1,32,64 A4_LEVELS=64,128 python3 benchmarks/cores_gpu.py "$out" hyocr-vllm
  note "vllm serve --api-server-count 4: cards c=128, 192, 256"
  CARD_LEVELS=128,192,256 LEVELS_ONLY=card python3 benchmarks/cores_gpu.py "$out" vllm-serve+api4
  note "four cores, four API processes, FP8 KV: cards c=256"
  CARD_LEVELS=256 LEVELS_ONLY=card python3 benchmarks/cores_gpu.py "$out" hyocr-vllm+fp8kv-api4-cores4
  note "done"
  exit 0
fi
echo "unknown part: $part (s31, the next sitting; s30, s28, s29 and s25, the ones run)"; exit 2
