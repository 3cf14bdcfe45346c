"""What serving costs on the CPU engine: hyocr serving rapidocr over HTTP vs calling rapidocr directly,
on the same seeded card images, at concurrency = cores, in one run.

    python benchmarks/engine_overhead.py [--requests 16] [--rounds 2]

Direct calls use RapidOCR the way hyocr configures it (same models, same worker and thread counts) and
include decoding the PNG, as the server must. The client alternates between the two in rounds. The last
line is `ratio=<hyocr images/s / direct images/s>`; the target is >= 0.95.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import os
import queue
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from PIL import Image  # noqa: E402

from hyocr.bench.workload import Workload  # noqa: E402
from hyocr.engines.rapidocr import RapidOcrEngine  # noqa: E402


def pngs(count: int) -> list[bytes]:
    workload = Workload("card", "", 1, False, seed=7)
    out = []
    for i in range(count):
        buf = io.BytesIO()
        workload.image(i).save(buf, "PNG", compress_level=1)
        out.append(buf.getvalue())
    return out


def direct_rate(images: list[bytes], concurrency: int, instances: queue.SimpleQueue) -> float:
    def one(data: bytes) -> int:
        image = Image.open(io.BytesIO(data)).convert("RGB")
        engine = instances.get()
        try:
            return len(engine(image).txts or ())
        finally:
            instances.put(engine)

    started = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(one, images))
    return len(images) / (time.perf_counter() - started)


async def served_rate(url: str, images: list[bytes], concurrency: int) -> float:
    work: asyncio.Queue = asyncio.Queue()
    for data in images:
        work.put_nowait(data)
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:
        async def worker() -> None:
            while not work.empty():
                data = work.get_nowait()
                r = await client.post("/v1/ocr", files={"file": ("card.png", data, "image/png")},
                                      data={"task": "text"})
                r.raise_for_status()

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return len(images) / (time.perf_counter() - started)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    cores = os.cpu_count() or 2
    images = pngs(args.requests)

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}:{os.environ.get('PYTHONPATH', '')}", "HYOCR_UI": "false",
           "HYOCR_LOG_LEVEL": "warning"}
    server = subprocess.Popen([sys.executable, "-m", "hyocr", "serve", "--port", str(port)], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    engine = RapidOcrEngine(workers=max(1, cores // 2))  # hyocr's default pool, used directly
    instances: queue.SimpleQueue = queue.SimpleQueue()
    for _ in range(engine.workers):
        instance = engine._new_instance()
        instance(Image.new("RGB", (64, 32), "white"))  # load its sessions, as hyocr does at start
        instances.put(instance)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(f"{url}/ready", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("hyocr did not start")
            time.sleep(0.3)
        asyncio.run(served_rate(url, images[:2], cores))  # warm-up
        direct_rate(images[:2], cores, instances)
        served, direct = [], []
        for i in range(args.rounds):
            steps = [("served", served), ("direct", direct)]
            for name, results in steps if i % 2 == 0 else reversed(steps):
                if name == "served":
                    results.append(asyncio.run(served_rate(url, images, cores)))
                else:
                    results.append(direct_rate(images, cores, instances))
        s_rate, d_rate = sum(served) / len(served), sum(direct) / len(direct)
        print(f"hyocr  {s_rate:.2f} images/s (rounds {', '.join(f'{x:.2f}' for x in served)})")
        print(f"direct {d_rate:.2f} images/s (rounds {', '.join(f'{x:.2f}' for x in direct)})")
        print(f"ratio={s_rate / d_rate:.3f}")
    finally:
        server.terminate()
        server.wait(timeout=30)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
