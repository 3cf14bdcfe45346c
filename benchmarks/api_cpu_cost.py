"""What one request costs the API process's CPU, with an engine that costs nothing: the ceiling the
gateway itself puts on a server, whatever the GPU does (issue 9: "where the time goes").

    python benchmarks/api_cpu_cost.py [--requests 64] [--concurrency 16] [--workload card]

Starts `hyocr serve --engine fake` (zero latency) as its own process, sends the `hyocr bench` chat
requests (a base64 PNG in, streamed deltas out) with 1 and then 150 output tokens, and reads the server
process's CPU seconds (user + system, all threads) before and after each batch. Per request:
fixed cost (body, base64 and PNG decode, validation, prompt) = the 1-token batch; per streamed delta =
the difference over 149 deltas. CPU time, not wall time, so a busy client on the same machine does not
change the result much. Prints one JSON line per batch and a summary line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from gateway_overhead import free_port, start  # noqa: E402  (this folder: started and checked alike)

from hyocr.bench.load import run_level  # noqa: E402
from hyocr.bench.workload import Workload  # noqa: E402


def start_server(port: int) -> subprocess.Popen:
    env = {**os.environ, "HYOCR_UI": "false", "HYOCR_LOG_LEVEL": "warning", "HYOCR_MAX_CONCURRENCY": "256",
           "PYTHONPATH": f"{ROOT / 'src'}:{os.environ.get('PYTHONPATH', '')}"}
    return start([sys.executable, "-m", "hyocr", "serve", "--engine", "fake", "--port", str(port)], env,
                 f"http://127.0.0.1:{port}")


def cpu_seconds(proc: psutil.Process) -> float:
    times = proc.cpu_times()
    return times.user + times.system


async def batch(url: str, server: psutil.Process, workload: Workload, requests: int, concurrency: int) -> dict:
    before = cpu_seconds(server)
    level = await run_level(url, workload, concurrency=concurrency, requests=requests, offset=0, timeout=120,
                            model="fake")
    used = cpu_seconds(server) - before
    return {"max_tokens": workload.max_tokens, "requests": level.requests, "errors": level.errors,
            "server_cpu_ms_per_request": round(1000 * used / max(1, level.requests), 2),
            "throughput_rps": level.throughput_rps}


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--workload", default="card")
    args = parser.parse_args()
    port = free_port()
    proc = start_server(port)
    server = psutil.Process(proc.pid)
    url = f"http://127.0.0.1:{port}"
    try:
        results = {}
        await batch(url, server, Workload(args.workload, "提取图中的文字。", 8, True), 8, 4)  # warm-up
        for tokens in (1, 150):
            workload = Workload(args.workload, "提取图中的文字。", tokens, True)
            results[tokens] = await batch(url, server, workload, args.requests, args.concurrency)
            print(json.dumps(results[tokens]), flush=True)
        fixed = results[1]["server_cpu_ms_per_request"]
        per_delta = (results[150]["server_cpu_ms_per_request"] - fixed) / 149
        print(f"fixed_ms_per_request={fixed:.2f} ms_per_streamed_delta={per_delta:.3f} "
              f"ceiling_rps_one_core={1000 / results[150]['server_cpu_ms_per_request']:.1f}")
    finally:
        proc.terminate()
        proc.wait(timeout=30)


if __name__ == "__main__":
    asyncio.run(main())
