"""What the gateway costs: hyocr (fake engine, zero latency) vs a bare FastAPI endpoint doing the same
decode, on the same round trip (a JSON body with a base64 card image in, a small JSON out).

    python benchmarks/gateway_overhead.py [--seconds 4] [--rounds 3] [--concurrency 4]

Both servers run as their own uvicorn processes on loopback; the client alternates between them in
rounds (A, B, A, B, ...) so drift hits both alike. The last line is `ratio=<hyocr req/s / bare req/s>`;
the target is >= 0.9: auth, limits, validation, logs and metrics must be nearly free.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import os
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
# The same decode as hyocr, on a worker thread as hyocr does it (decoding on the event loop would make
# the bare endpoint slower, and the ratio would measure that choice instead of the gateway's cost).
BARE_APP = textwrap.dedent('''
    import asyncio, base64, io
    from fastapi import FastAPI, Request
    from PIL import Image, ImageOps
    app = FastAPI()

    def decode(data: str) -> Image.Image:
        image = Image.open(io.BytesIO(base64.b64decode(data)))
        return ImageOps.exif_transpose(image).convert("RGB")

    @app.post("/v1/ocr")
    async def ocr(request: Request):
        body = await request.json()
        image = await asyncio.to_thread(decode, body["image"])
        return {"text": "ok", "pages": [{"width": image.width, "height": image.height}]}
''')


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def card_b64() -> str:
    sys.path.insert(0, str(ROOT / "src"))
    from hyocr.bench.workload import Workload

    buf = io.BytesIO()
    Workload("card", "", 1, False).image(0).save(buf, "PNG", compress_level=1)
    return base64.b64encode(buf.getvalue()).decode()


def start(cmd: list[str], env: dict, url: str) -> subprocess.Popen:
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.post(f"{url}/v1/ocr", json={"image": card_b64(), "task": "text"}, timeout=5).status_code == 200:
                return proc
        except httpx.HTTPError:
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"{cmd[:4]} did not start")


async def rate(url: str, body: dict, seconds: float, concurrency: int) -> float:
    done = 0
    stop = time.perf_counter() + seconds
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        async def worker() -> None:
            nonlocal done
            while time.perf_counter() < stop:
                r = await client.post("/v1/ocr", json=body)
                r.raise_for_status()
                done += 1

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return done / (time.perf_counter() - started)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=4)
    args = parser.parse_args()

    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}:{os.environ.get('PYTHONPATH', '')}",
           "HYOCR_UI": "false", "HYOCR_LOG_LEVEL": "warning"}
    hy_port, bare_port = free_port(), free_port()
    hyocr_url, bare_url = f"http://127.0.0.1:{hy_port}", f"http://127.0.0.1:{bare_port}"
    bare_file = Path("/tmp") / f"hyocr_bare_app_{os.getpid()}.py"
    bare_file.write_text(BARE_APP)
    procs = [
        start([sys.executable, "-m", "hyocr", "serve", "--engine", "fake", "--port", str(hy_port)], env, hyocr_url),
        start([sys.executable, "-m", "uvicorn", f"{bare_file.stem}:app", "--port", str(bare_port), "--log-level",
               "warning", "--app-dir", "/tmp"], env, bare_url),
    ]
    body = {"image": card_b64(), "task": "text"}
    try:
        hy, bare = [], []
        asyncio.run(rate(hyocr_url, body, 1.0, args.concurrency))  # warm-up
        asyncio.run(rate(bare_url, body, 1.0, args.concurrency))
        for i in range(args.rounds):
            order = [(hyocr_url, hy), (bare_url, bare)] if i % 2 == 0 else [(bare_url, bare), (hyocr_url, hy)]
            for url, results in order:
                results.append(asyncio.run(rate(url, body, args.seconds, args.concurrency)))
        hy_rps, bare_rps = sum(hy) / len(hy), sum(bare) / len(bare)
        print(f"hyocr {hy_rps:.1f} req/s (rounds {', '.join(f'{x:.1f}' for x in hy)})")
        print(f"bare  {bare_rps:.1f} req/s (rounds {', '.join(f'{x:.1f}' for x in bare)})")
        print(f"ratio={hy_rps / bare_rps:.3f}")
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(timeout=30)
        bare_file.unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
