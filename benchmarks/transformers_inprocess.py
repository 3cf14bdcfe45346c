"""The transformers engine without the server: concurrent streams of requests straight into
``TransformersEngine`` (no HTTP, no event-loop work besides the streams), to split the engine's own speed
from what the server process costs it.

    python benchmarks/transformers_inprocess.py CHECKPOINT OUT.json [--concurrency 32] [--per-stream 4]
                                                [--max-tokens 60]

Same seeded card images and fixed output length as ``hyocr bench --workload card --fixed-output``; one
warm-up stream first. Compare with benchmarks/hf_generate.py (static generate()) and ``hyocr bench``
against ``hyocr serve --engine transformers`` on the same machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))


async def run(args: argparse.Namespace) -> dict:
    from hyocr.bench.run import DEFAULT_PROMPT
    from hyocr.bench.workload import Workload
    from hyocr.engines.transformers import TransformersEngine
    from hyocr.types import EngineRequest, PageImage, SamplingParams, Task

    workload = Workload("card", DEFAULT_PROMPT, args.max_tokens, True)
    engine = TransformersEngine(args.checkpoint, max_batch_size=max(64, args.concurrency))
    await engine.start()
    done = 0

    async def stream(k: int, count: int) -> None:
        nonlocal done
        for r in range(count):
            request = EngineRequest(request_id=f"{k}-{r}", task=Task.TEXT, prompt=workload.prompt,
                                    images=(PageImage(workload.image(k * 1000 + r)),),
                                    sampling=SamplingParams(max_tokens=args.max_tokens, ignore_eos=True))
            async for _chunk in engine.generate(request):
                pass
            done += 1

    try:
        await stream(10_000, 2)  # warm-up
        engine.times = type(engine.times)()
        done, started = 0, time.perf_counter()
        await asyncio.gather(*(stream(k, args.per_stream) for k in range(args.concurrency)))
        elapsed = time.perf_counter() - started
    finally:
        await engine.stop()
    return {
        "label": "hyocr transformers engine, in-process (no server)",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "hardware": platform.processor() or platform.machine(),
        "weights": "random (tiny test checkpoint or HunyuanOCR 1.0 architecture)",
        "checkpoint": args.checkpoint,
        "workload": {"name": "card", "size": list(workload.size), "max_tokens": args.max_tokens},
        "concurrency": args.concurrency, "requests": done,
        "throughput_rps": round(done / elapsed, 3),
        "joined_running": engine.joined_running,
        "model_thread": engine.times.as_dict(),  # prefill vs decode-step seconds
    }


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("checkpoint")
    parser.add_argument("output")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--per-stream", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=60)
    args = parser.parse_args()
    record = asyncio.run(run(args))
    Path(args.output).write_text(json.dumps(record, indent=2) + "\n")
    print(json.dumps(record))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
