#!/usr/bin/env bash
# Issue 30's measurement, one device sitting, started in the background so that it outlives one 10-minute call.
# Build the bundle (DEVICE.md, with the NOTES list of hyocr's own packages) and .stage/c3 (vllm serve's wheels),
# then, back to back (the machine goes back after 30 s idle):
#   run 1, carry [.stage/c1]:           mkdir -p /tmp/stage && cp .stage/c1/* /tmp/stage/
#   run 2, carry [.stage/c2, .stage/c3]: source .stage/c2/install.sh || exit 9; cp -r .stage/c3 /tmp/c3;
#        (C3=/tmp/c3 setsid nohup bash benchmarks/issue30_sitting.sh /tmp/s22 > /tmp/s22.log 2>&1 &);
#        sleep 560; cat /tmp/s22/sitting.txt; tar czf $OUT/s22.tgz -C /tmp s22 s22.log
#   run 3.., no carry:                  sleep 560; cat /tmp/s22/sitting.txt; tar czf $OUT/s22.tgz -C /tmp s22 s22.log
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

# Order (session 22; session 21's results were lost with its machine): one core first on a clean machine (the c=1
# target: session 21 saw 0.48 s there after `vllm serve`, session 20 0.31 s), three cores (session 21's best, 46.9/s
# at c=256; A4 on three cores was measured in session 17), the same three under CUDA MPS, the official
# `vllm serve` at the same levels, then four cores and `--api-server-count 4` as time allows.
note "one core (V2)"
CARD_LEVELS=1,64 A4_LEVELS=64 python3 benchmarks/cores_gpu.py "$out" hyocr-vllm

note "three cores, three API processes (V2)"
CARD_LEVELS=64,192,256 LEVELS_ONLY=card python3 benchmarks/cores_gpu.py "$out" "hyocr-vllm+api3-cores3"

note "three cores under CUDA MPS (kernels of the three cores at once instead of time slices), if the daemon starts"
if command -v nvidia-cuda-mps-control >/dev/null; then
  mkdir -p /tmp/mps-pipe /tmp/mps-log
  if CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps-log nvidia-cuda-mps-control -d; then
    CARD_LEVELS=192,256 LEVELS_ONLY=card python3 benchmarks/cores_gpu.py "$out" "hyocr-vllm+mps-api3-cores3"
    echo quit | CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-pipe nvidia-cuda-mps-control; sleep 3
  else note "MPS daemon did not start"; fi
else note "no nvidia-cuda-mps-control on this machine"; fi

note "vllm serve (official flags)"
[ -d /tmp/serve-site/uvloop ] || python3 -m pip install -q --no-index --no-deps --target /tmp/serve-site "${C3:-.stage/c3}"/*.whl
PYTHONPATH="$PYTHONPATH:/tmp/serve-site" CARD_LEVELS=1,64,192,256 A4_LEVELS=64 \
  python3 benchmarks/cores_gpu.py "$out" vllm-serve

note "four cores, four API processes (V2)"
CARD_LEVELS=192,256 LEVELS_ONLY=card python3 benchmarks/cores_gpu.py "$out" "hyocr-vllm+api4-cores4"

note "vllm serve --api-server-count 4"
PYTHONPATH="$PYTHONPATH:/tmp/serve-site" CARD_LEVELS=64,192,256 LEVELS_ONLY=card \
  python3 benchmarks/cores_gpu.py "$out" vllm-serve+api4
note "done"
