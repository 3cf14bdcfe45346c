"""Greedy outputs of a running server on fixed seeded cards, to check that a variant leaves them unchanged
(speculative decoding must not change what greedy decoding writes).

    python benchmarks/output_probe.py URL OUT.json [--images 8] [--max-tokens 150]   record one server's texts
    python benchmarks/output_probe.py --compare A.json B.json                        how many texts match

Requests go one at a time and then all together, so a difference that only batching brings shows as such.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
from hyocr.bench.run import DEFAULT_PROMPT  # noqa: E402
from hyocr.bench.workload import Workload  # noqa: E402


async def text(client: httpx.AsyncClient, body: dict) -> str:
    resp = await client.post("/v1/chat/completions", json={**body, "stream": False})
    resp.raise_for_status()
    return resp.json()["choices"][0]["message"]["content"]


async def record(url: str, images: int, max_tokens: int) -> dict:
    workload = Workload("card", DEFAULT_PROMPT, max_tokens, True)
    model = httpx.get(url + "/v1/models", timeout=30).json()["data"][0]["id"]
    bodies = [workload.chat_body(i, model) for i in range(images)]
    for body in bodies:
        body.pop("stream_options", None)
    async with httpx.AsyncClient(base_url=url, timeout=600) as client:
        alone = [await text(client, body) for body in bodies]
        together = await asyncio.gather(*(text(client, body) for body in bodies))
    return {"model": model, "max_tokens": max_tokens, "alone": alone, "together": list(together)}


def common_prefix(a: str, b: str) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def compare(a: dict, b: dict) -> dict:
    out = {}
    for mode in ("alone", "together"):
        pairs = list(zip(a[mode], b[mode], strict=True))
        out[mode] = {"identical": sum(x == y for x, y in pairs), "of": len(pairs),
                     "first_difference_at_chars": [common_prefix(x, y) for x, y in pairs if x != y]}
    # The same server alone vs together: how much batching alone changes greedy text (the noise floor).
    out["batching_alone_vs_together"] = {
        name: sum(x == y for x, y in zip(doc["alone"], doc["together"], strict=True)) for name, doc in
        (("a", a), ("b", b))}
    return out


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("paths", nargs=2)
    parser.add_argument("--compare", action="store_true")
    parser.add_argument("--images", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=150)
    args = parser.parse_args()
    if args.compare:
        a, b = (json.loads(Path(p).read_text()) for p in args.paths)
        print(json.dumps({"a": a["model"], "b": b["model"], **compare(a, b)}, indent=1))
        return 0
    url, path = args.paths
    Path(path).write_text(json.dumps(asyncio.run(record(url, args.images, args.max_tokens)), ensure_ascii=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
