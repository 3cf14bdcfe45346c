#!/usr/bin/env bash
# Issue 30's measurement, one device sitting, started in the background so that it outlives one 10-minute call.
# Build the bundle (DEVICE.md, with the NOTES list of hyocr's own packages) and .stage/c3 (vllm serve's wheels),
# then, back to back (the machine goes back after 30 s idle):
#   run 1, carry [.stage/c1]:           mkdir -p /tmp/stage && cp .stage/c1/* /tmp/stage/
#   run 2, carry [.stage/c2, .stage/c3]: source .stage/c2/install.sh || exit 9; cp -r .stage/c3 /tmp/c3;
#        (C3=/tmp/c3 setsid nohup bash benchmarks/issue30_sitting.sh /tmp/s15 > /tmp/s15.log 2>&1 &);
#        sleep 560; cat /tmp/s15/sitting.txt; tar czf $OUT/s15.tgz -C /tmp s15 s15.log
#   run 3.., no carry:                  sleep 560; cat /tmp/s15/sitting.txt; tar czf $OUT/s15.tgz -C /tmp s15 s15.log
# (the tar in every call: a sitting cut short still brings back what it measured). Every target through benchmarks/cores_gpu.py (one
# bench call per level, GPU busy and each process's CPU recorded), HunyuanOCR 1.0 architecture, random weights.
# C3 (default .stage/c3) holds the wheels vllm serve needs beyond the bundle (DEVICE.md).
set -uo pipefail
out=${1:?output directory}
mkdir -p "$out"
export PYTHONPATH="$PWD/src:${PYTHONPATH:-}" CAPABILITIES=1
started=$(date +%s)
elapsed() { echo $(( $(date +%s) - started )); }
note() { echo "[$(elapsed)s] $*" | tee -a "$out/sitting.txt"; }

# Order (session 21): four and three cores on V2 (0.26's runner now) for the cards target, the official `vllm serve`
# baseline at the same levels, one core (V2) for the c=1 target and A4, `--api-server-count 4`, then five cores.
note "four cores, four API processes (V2)"
CARD_LEVELS=64,128,192,256 LEVELS_ONLY=card python3 benchmarks/cores_gpu.py "$out" "hyocr-vllm+api4-cores4"

note "three cores, three API processes (V2)"
CARD_LEVELS=64,192,256 A4_LEVELS=64 python3 benchmarks/cores_gpu.py "$out" "hyocr-vllm+api3-cores3"

note "vllm serve (official flags)"
[ -d /tmp/serve-site/uvloop ] || python3 -m pip install -q --no-index --no-deps --target /tmp/serve-site "${C3:-.stage/c3}"/*.whl
PYTHONPATH="$PYTHONPATH:/tmp/serve-site" CARD_LEVELS=1,64,192,256 A4_LEVELS=64 \
  python3 benchmarks/cores_gpu.py "$out" vllm-serve

note "one core (V2)"
CARD_LEVELS=1,64 A4_LEVELS=64 python3 benchmarks/cores_gpu.py "$out" hyocr-vllm

note "vllm serve --api-server-count 4"
PYTHONPATH="$PYTHONPATH:/tmp/serve-site" CARD_LEVELS=64,192,256 LEVELS_ONLY=card \
  python3 benchmarks/cores_gpu.py "$out" vllm-serve+api4

note "five cores, five API processes (V2)"
CARD_LEVELS=192,256,320 LEVELS_ONLY=card python3 benchmarks/cores_gpu.py "$out" "hyocr-vllm+api5-cores5"
note "done"
