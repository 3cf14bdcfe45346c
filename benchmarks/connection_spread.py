"""How a server with several API processes spreads a client pool's connections over them.

`hyocr bench` opens its connections the way this does: one httpx pool per client process, every stream's
first request at once, the connections kept alive for the whole level. Each stream asks /v1/models, whose
``hyocr.api_process`` names the process that answered, a few times (the pool hands it whichever kept
connection is idle, each bound to one process).

    python benchmarks/connection_spread.py http://127.0.0.1:8000 --connections 64 --clients 4

prints JSON: how many of the requests each process answered.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import multiprocessing

import httpx


async def _pool(url: str, connections: int, rounds: int) -> list[str]:
    limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as client:
        async def stream() -> list[str]:
            return [(await client.get("/v1/models")).json()["data"][0]["hyocr"]["api_process"]
                    for _ in range(rounds)]

        return [answer for answers in await asyncio.gather(*(stream() for _ in range(connections)))
                for answer in answers]


def _client(args: tuple[str, int, int]) -> list[str]:
    return asyncio.run(_pool(*args))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url")
    parser.add_argument("--connections", type=int, default=64, help="in all, split over the clients")
    parser.add_argument("--clients", type=int, default=4, help="client processes, each with its own pool")
    parser.add_argument("--rounds", type=int, default=4, help="requests per stream")
    args = parser.parse_args()
    share = args.connections // args.clients
    with multiprocessing.get_context("spawn").Pool(args.clients) as pool:
        parts = pool.map(_client, [(args.url, share, args.rounds)] * args.clients)
    answers = [answer for part in parts for answer in part]
    spread = dict(sorted(collections.Counter(answers).items()))
    print(json.dumps({"requests": len(answers), "per_process": spread}))


if __name__ == "__main__":
    main()
