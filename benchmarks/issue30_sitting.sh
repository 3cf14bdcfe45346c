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
# Order = priority (a sitting cut short keeps the first): the V2 model runner against V1 on one core (c=1 and
# throughput), the best runner with three API processes each owning one of three cores (the cards target),
# `vllm serve` with the official flags and with --api-server-count 4 (the baselines, same sitting), then four
# cores if time is left. C3 (default .stage/c3) holds the wheels vllm serve needs beyond the bundle (DEVICE.md).
set -uo pipefail
out=${1:?output directory}
mkdir -p "$out"
export PYTHONPATH="$PWD/src:${PYTHONPATH:-}" CAPABILITIES=1
started=$(date +%s)
elapsed() { echo $(( $(date +%s) - started )); }
note() { echo "[$(elapsed)s] $*" | tee -a "$out/sitting.txt"; }

note "one core: V2 runner, then V1 (hyocr's 0.26 default)"
CARD_LEVELS=1,64,192 A4_LEVELS=64 python3 benchmarks/cores_gpu.py "$out" hyocr-vllm+v2 hyocr-vllm

# V2 for the multi-core runs if it served every level without errors and at least as fast at c=64 and c=192.
runner=$(python3 - "$out" <<'EOF'
import json, sys
from pathlib import Path
def levels(name):
    try:
        return {lv["concurrency"]: lv for lv in json.loads(Path(sys.argv[1], name).read_text())["levels"]["card"]}
    except (OSError, KeyError, ValueError):
        return {}
v2, v1 = levels("hyocr-vllm--v2.levels.json"), levels("hyocr-vllm.levels.json")
ok = all(c in v2 and c in v1 and not v2[c].get("errors") and (v2[c].get("throughput_rps") or 0)
         >= (v1[c].get("throughput_rps") or 0) for c in (64, 192))
print("v2-" if ok else "")
EOF
)
note "multi-core runner: ${runner:-v1}"
CARD_LEVELS=1,32,64,128,192,256 A4_LEVELS=64 python3 benchmarks/cores_gpu.py "$out" "hyocr-vllm+${runner}api3-cores3"

note "vllm serve (official flags), then --api-server-count 4"
[ -d /tmp/serve-site/uvloop ] || python3 -m pip install -q --no-index --no-deps --target /tmp/serve-site "${C3:-.stage/c3}"/*.whl
PYTHONPATH="$PYTHONPATH:/tmp/serve-site" CARD_LEVELS=1,64,128,192 A4_LEVELS=64 \
  python3 benchmarks/cores_gpu.py "$out" vllm-serve
PYTHONPATH="$PYTHONPATH:/tmp/serve-site" CARD_LEVELS=64,128,192 LEVELS_ONLY=card \
  python3 benchmarks/cores_gpu.py "$out" vllm-serve+api4

note "four cores, four API processes"
CARD_LEVELS=192,256 LEVELS_ONLY=card python3 benchmarks/cores_gpu.py "$out" "hyocr-vllm+${runner}api4-cores4"
note "done"
