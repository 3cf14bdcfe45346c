#!/usr/bin/env bash
# Issue 30's measurement, one device sitting, started in the background so that it outlives one 10-minute call.
# Build the bundle (DEVICE.md, with the NOTES list of hyocr's own packages) and .stage/c3 (vllm serve's wheels),
# then, back to back (the machine goes back after 30 s idle):
#   run 1, carry [.stage/c1]:           mkdir -p /tmp/stage && cp .stage/c1/* /tmp/stage/
#   run 2, carry [.stage/c2, .stage/c3]: source .stage/c2/install.sh || exit 9; cp -r .stage/c3 /tmp/c3;
#        (C3=/tmp/c3 setsid nohup bash benchmarks/issue30_sitting.sh /tmp/s23 > /tmp/s23.log 2>&1 &);
#        sleep 560; cat /tmp/s23/sitting.txt; tar czf $OUT/s23.tgz --exclude="*.pt.trace.json.gz" -C /tmp s23 s23.log
#   run 3.., no carry:                  sleep 560; cat /tmp/s23/sitting.txt; tar czf $OUT/s23.tgz --exclude="*.pt.trace.json.gz" -C /tmp s23 s23.log
# (the tar in every call: a sitting cut short still brings back what it measured). Every target through benchmarks/cores_gpu.py (one
# bench call per level, GPU busy and each process's CPU recorded), HunyuanOCR 1.0 architecture, random weights.
# C3 (default .stage/c3) holds the wheels vllm serve needs beyond the bundle (DEVICE.md), plus httptools (cp312),
# which with uvloop is what `pip install hyocr` brings through uvicorn[standard]: `pip download --no-deps
# --only-binary=:all: --python-version 3.12 --implementation cp --abi cp312 --platform manylinux_2_17_x86_64 -d
# .stage/c3 uvloop httptools ...`.
set -uo pipefail
out=${1:?output directory}
mkdir -p "$out"
export PYTHONPATH="$PWD/src:${PYTHONPATH:-}" CAPABILITIES=1
started=$(date +%s)
elapsed() { echo $(( $(date +%s) - started )); }
note() { echo "[$(elapsed)s] $*" | tee -a "$out/sitting.txt"; }

# Order (session 23; session 22 ran one, three and four cores, MPS and both `vllm serve`s: docs/benchmarks.md): three
# cores as they are (a socket each in a SO_REUSEPORT group since session 22: NOTES entry 27's measure), then with an
# FP8 KV cache (entry 26's next lever), the official `vllm serve` at the same levels, a torch profile of one core
# at c=64 (gpu_profile.py: where a card's GPU time goes), three cores on one shared socket at c=256 (the group's
# counterpart), then one core (c=1 and A4). Each hyocr run records which processes hold a CUDA context.
# C3's uvloop and httptools are what hyocr's uvicorn[standard] installs for a user: every target runs with them
# (sessions 13-22 ran hyocr on asyncio's loop and h11, the bundle having neither)
[ -d /tmp/serve-site/uvloop ] || python3 -m pip install -q --no-index --no-deps --target /tmp/serve-site "${C3:-.stage/c3}"/*.whl
export PYTHONPATH="$PYTHONPATH:/tmp/serve-site"
note "three cores, three API processes (a socket each in a SO_REUSEPORT group, the default since session 22)"
CARD_LEVELS=192,256 LEVELS_ONLY=card python3 benchmarks/cores_gpu.py "$out" "hyocr-vllm+api3-cores3"

note "three cores, three API processes, FP8 KV cache"
CARD_LEVELS=192,256 LEVELS_ONLY=card python3 benchmarks/cores_gpu.py "$out" "hyocr-vllm+fp8kv-api3-cores3"
grep -i -m3 "fp8\|kv_cache_dtype" "$out"/hyocr-vllm--fp8kv-api3-cores3.server.log | tee -a "$out/sitting.txt"

note "vllm serve (official flags)"
CARD_LEVELS=192,256,1 LEVELS_ONLY=card python3 benchmarks/cores_gpu.py "$out" vllm-serve

note "a torch profile of one core, cards at c=64"
python3 benchmarks/gpu_profile.py "$out/profile" --concurrency 64 --steps 300 > "$out/profile.log" 2>&1
grep -v "^\s\|aten::\|---" "$out/profile.log" | tail -40 | tee -a "$out/sitting.txt"
rm -f "$out"/profile/trace/*.pt.trace.json.gz.tmp

note "three cores, three API processes on one shared socket (as in session 22)"
CARD_LEVELS=256 LEVELS_ONLY=card python3 benchmarks/cores_gpu.py "$out" "hyocr-vllm+shared-api3-cores3"

note "one core"
CARD_LEVELS=1 A4_LEVELS=64 python3 benchmarks/cores_gpu.py "$out" hyocr-vllm
note "done"
