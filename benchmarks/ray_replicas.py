"""Throughput against Ray Serve replica count on the CPU engine: `hyocr serve` (one process, the baseline) vs
`hyocr serve --ray --ray-replicas N` for N = 1, 2, 4, same seeded card workload and client (`hyocr bench`),
one target at a time, in one run.

    python benchmarks/ray_replicas.py OUT_DIR [--replicas 1,2,4] [--concurrency 4,8,16] [--requests 48]

Each replica runs one rapidocr worker; the replicas share the machine's cores (RAY_CPUS_PER_REPLICA is
cores / N when N exceeds them, so Ray schedules all N). Writes OUT_DIR/card-<target>.json and
OUT_DIR/compare.md (`hyocr bench compare`, the single process as the baseline).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent


def start(target: str, replicas: int, port: int, log: Path) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "hyocr", "serve", "--engine", "rapidocr", "--engine-workers", "1", "--no-ui",
           "--port", str(port), "--log-level", "warning", "--served-model-name", target]
    if replicas:
        cores = os.cpu_count() or 1
        cmd += ["--ray", "--ray-replicas", str(replicas), "--ray-cpus-per-replica", str(min(1.0, cores / replicas))]
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "PYTHONPATH": str(ROOT / "src")}
    env.pop("RAY_ADDRESS", None)
    return subprocess.Popen(cmd, stdout=open(log, "w"), stderr=subprocess.STDOUT, env=env, start_new_session=True)


def wait_ready(url: str, proc: subprocess.Popen, replicas: int, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            body = httpx.get(url + "/ready", timeout=5).json()
            if body.get("status") == "ready" and sum(r["alive"] for r in body.get("replicas", [])) >= replicas:
                return
        except (httpx.HTTPError, ValueError):
            pass
        time.sleep(1)
    raise RuntimeError("not ready in time")


def stop(proc: subprocess.Popen) -> None:
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=90)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--replicas", default="1,2,4")
    parser.add_argument("--concurrency", default="4,8,16")
    parser.add_argument("--requests", default="48")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    targets = [("single-process", 0)] + [(f"ray-{n}-replicas", int(n)) for n in args.replicas.split(",")]
    results = []
    for target, replicas in targets:
        port = 8400 + replicas
        url = f"http://127.0.0.1:{port}"
        proc = start(target, replicas, port, args.out / f"{target}.server.log")
        try:
            wait_ready(url, proc, replicas)
            result = args.out / f"card-{target}.json"
            subprocess.run([sys.executable, "-m", "hyocr", "bench", "--url", url, "--workload", "card",
                            "--concurrency", args.concurrency, "--requests", args.requests, "--max-tokens", "64",
                            "--label", target, "--output", str(result)], check=True, stderr=subprocess.DEVNULL)
            results.append(str(result))
            print(f"{target}: done", flush=True)
        finally:
            stop(proc)
    subprocess.run([sys.executable, "-m", "hyocr", "bench", "compare", *results, "--output",
                    str(args.out / "compare.md")], check=True)
    print((args.out / "compare.md").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
