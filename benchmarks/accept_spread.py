"""How K API processes share a burst of new connections: one shared listening socket (server/shares.py listen)
against a socket each in a SO_REUSEPORT group (reserve_port + join_group, what core_processes.py uses).

Each process runs uvicorn on hyocr's own socket code with a tiny app that answers its pid after 50 ms (an OCR
request's HTTP side, not its engine: the engine is not what decides which process accepts); the client opens
N connections at once, as `hyocr bench` opens its streams, and counts the connections each process answered.
Seeded by nothing random: the spread is the kernel's and the event loop's.

    python benchmarks/accept_spread.py [K=3] [N=256] [RUNS=3] [LOOP=asyncio|uvloop]
"""

from __future__ import annotations

import asyncio
import collections
import multiprocessing
import os
import socket
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
from hyocr.config import load_settings  # noqa: E402
from hyocr.server.shares import join_group, listen, reserve_port  # noqa: E402


async def app(scope, receive, send) -> None:  # noqa: ANN001
    if scope["type"] != "http":
        return
    await asyncio.sleep(0.05)
    body = str(os.getpid()).encode()
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


def serve(sock: socket.socket | None, port: int, loop: str) -> None:
    import uvicorn

    if sock is None:
        sock = join_group(load_settings(host="127.0.0.1", port=port))  # uvicorn listens on it
    uvicorn.Server(uvicorn.Config(app, loop=loop, log_level="warning")).run(sockets=[sock])


async def burst(port: int, connections: int) -> list[int]:
    async def one() -> int:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        pid = 0
        for _ in range(2):  # kept alive: the second request comes back from the same process
            writer.write(b"GET / HTTP/1.1\r\nhost: bench\r\n\r\n")
            await writer.drain()
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(next(line for line in head.split(b"\r\n") if line.lower().startswith(b"content-length"))
                         .split(b":")[1])
            pid = int(await reader.readexactly(length))
        writer.close()
        return pid

    counts = collections.Counter(await asyncio.gather(*(one() for _ in range(connections))))
    return sorted(counts.values(), reverse=True)


def listening(port: int) -> int:
    """Sockets in LISTEN on ``port`` (/proc/net/tcp)."""
    lines = Path("/proc/net/tcp").read_text().splitlines()[1:]
    return sum(1 for line in lines if line.split()[3] == "0A" and int(line.split()[1].rsplit(":", 1)[1], 16) == port)


def measure(mode: str, processes: int, connections: int, runs: int, loop: str) -> list[list[int]]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    settings = load_settings(host="127.0.0.1", port=port)
    shared = listen(settings) if mode == "shared" else None
    guard = reserve_port(settings) if mode == "group" else None
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=serve, args=(shared, port, loop)) for _ in range(processes)]
    for proc in procs:
        proc.start()
    if mode == "group":  # each process listens once its uvicorn serves
        deadline = time.monotonic() + 60
        while listening(port) < processes:
            assert time.monotonic() < deadline, "the processes did not start listening"
            time.sleep(0.2)
    else:  # one socket listens from the start: time for every process to start accepting on it
        time.sleep(3 + processes)
    try:
        return [asyncio.run(burst(port, connections)) for _ in range(runs)]
    finally:
        for proc in procs:
            proc.terminate()
            proc.join()
        for sock in (shared, guard):
            if sock is not None:
                sock.close()


if __name__ == "__main__":
    k, n, runs = (int(a) for a in (sys.argv[1:4] + ["3", "256", "3"][len(sys.argv[1:4]):]))
    loop = sys.argv[4] if len(sys.argv) > 4 else "asyncio"
    for mode in ("shared", "group"):
        spreads = measure(mode, k, n, runs, loop)
        ratios = [round(s[0] / s[-1], 2) if len(s) == k else float("inf") for s in spreads]
        print(f"{mode:6} K={k} N={n} {loop}: connections per process {spreads}, busiest/idlest {ratios}", flush=True)
