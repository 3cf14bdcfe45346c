"""Where a card's GPU time goes in one hyocr engine core: a torch profile of the engine under the card workload.

    python benchmarks/gpu_profile.py OUT_DIR [--concurrency 64] [--steps 300] [--vllm-args JSON]
    python benchmarks/gpu_profile.py --analyse TRACE.json.gz       (a trace already taken)

Starts hyocr's real server in this process (build_app and uvicorn, the vLLM engine with the shipped defaults, one
core, the HunyuanOCR 1.0 architecture with random bf16 weights: engines_gpu.build_checkpoint), warms it with the card
workload (``hyocr bench``, 150 output tokens), then, while a second bench run keeps CONCURRENCY cards in flight, asks
the engine core for a torch profile of STEPS engine steps (vLLM's ``profiler_config``, ``AsyncLLM.start_profile``).
From the trace it splits the GPU's kernel time into
- the vision encoder (hyocr's ``hyocr:vision_encoder`` annotation around each pass, vision.py),
- the rest of the steps that prefill (vLLM's per-step annotation ``execute_context_N(T)_generation_M(G)``, N > 0),
- decode-only steps (N = 0),
- kernels outside any step (sampling runs after the step's annotation),
and reports the GPU busy share of the window, the kernel time per card (per 150 generated tokens) and the top
kernels. Writes OUT_DIR/profile.json and the raw trace under OUT_DIR/trace.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import collections
import gzip
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
import engines_gpu  # noqa: E402

PORT = 8100
STEP = re.compile(r"execute_context_(\d+)\((\d+)\)_generation_(\d+)\((\d+)\)")
ENCODER = "hyocr:vision_encoder"
CARD_TOKENS = 150


def bench(url: str, concurrency: int, requests: int, output: Path) -> list[str]:
    return [sys.executable, "-m", "hyocr", "bench", "--url", url, "--workload", "card", "--concurrency",
            str(concurrency), "--requests", str(requests), "--max-tokens", str(CARD_TOKENS), "--fixed-output",
            "--label", "profile", "--output", str(output)]


async def profile(out: Path, concurrency: int, steps: int, vllm_args: str | None) -> Path:
    import httpx
    import uvicorn
    from vllm.config import ProfilerConfig

    from hyocr.api.app import build_app
    from hyocr.config import Settings
    from hyocr.engines.vllm.engine import VllmEngine

    engines_gpu.build_checkpoint()
    os.environ.pop("VLLM_USE_V2_MODEL_RUNNER", None)  # the device bundle's install.sh forces V1; hyocr picks its own
    trace_dir = out / "trace"
    trace_dir.mkdir(parents=True, exist_ok=True)
    settings = Settings(engine="vllm", model=str(engines_gpu.CHECKPOINT), port=PORT, ui=False, jobs=False,
                        served_model_name="hyocr-vllm", log_level="warning", vllm_args=vllm_args)
    engine = VllmEngine.from_settings(settings)
    # ignore_frontend: the engine core's trace only (the API process's would cover the whole run);
    # max_iterations: the core stops and writes the trace by itself after STEPS steps
    engine.engine_args["profiler_config"] = ProfilerConfig(
        profiler="torch", torch_profiler_dir=str(trace_dir), torch_profiler_with_stack=False, ignore_frontend=True,
        max_iterations=steps)
    app = build_app(settings, engine)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=PORT, log_level="warning"))
    serving = asyncio.create_task(server.serve())
    url = f"http://127.0.0.1:{PORT}"
    started = time.perf_counter()
    async with httpx.AsyncClient() as client:
        while True:
            if serving.done():
                raise RuntimeError("the server stopped before it was ready")
            try:
                if (await client.get(f"{url}/ready")).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            await asyncio.sleep(1)
    print(f"ready in {time.perf_counter() - started:.0f}s", flush=True)
    env = {**os.environ, "PYTHONPATH": f"{engines_gpu.ROOT / 'src'}:{os.environ.get('PYTHONPATH', '')}"}
    warm = await asyncio.create_subprocess_exec(*bench(url, concurrency, 2 * concurrency, out / "warm.json"), env=env,
                                                stderr=subprocess.DEVNULL)
    await warm.wait()
    # long enough to outlast the profile at any concurrency (c=1: ~0.4 s a card)
    load = await asyncio.create_subprocess_exec(*bench(url, concurrency, max(8 * concurrency, 48), out / "load.json"),
                                                env=env, stderr=subprocess.DEVNULL)
    await asyncio.sleep(4)  # past the first wave's prefills: the steady mix of prefills and decodes
    await engine.engine.start_profile()
    deadline = time.monotonic() + 120
    while not list(trace_dir.glob("*.pt.trace.json*")) and time.monotonic() < deadline:
        await asyncio.sleep(1)
    await asyncio.sleep(2)  # the file is written by the core; let it finish
    await load.wait()
    await engine.engine.stop_profile()
    server.should_exit = True
    await serving
    traces = sorted(trace_dir.glob("*.pt.trace.json*"), key=lambda p: p.stat().st_mtime)
    if not traces:
        raise RuntimeError(f"no trace written under {trace_dir}")
    return traces[-1]


def union(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b > end:
            total += b - max(a, end)
            end = b
    return total


def analyse(trace: Path) -> dict:
    opener = gzip.open if trace.suffix == ".gz" else open
    with opener(trace, "rt") as f:
        events = json.load(f)["traceEvents"]
    kernels = sorted((e["ts"], e["ts"] + e.get("dur", 0), e["name"]) for e in events
                     if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"))
    if not kernels:
        raise RuntimeError("the trace has no GPU kernels")
    spans = [e for e in events if e.get("ph") == "X" and e.get("cat") == "gpu_user_annotation"]
    starts = [k[0] for k in kernels]
    label = ["outside a step"] * len(kernels)
    step_counts = collections.Counter()
    tokens = 0
    # steps first, the encoder after: its spans lie inside a step's and take its kernels
    for span in sorted(spans, key=lambda e: e["name"] == ENCODER):
        m = STEP.fullmatch(span["name"])
        if m:
            context, _, generation, _ = (int(g) for g in m.groups())
            name = "steps with prefill (less the encoder)" if context else "decode-only steps"
            step_counts[name] += 1
            tokens += generation
        elif span["name"] == ENCODER:
            name = "vision encoder"
        else:
            continue
        a, b = span["ts"], span["ts"] + span.get("dur", 0)
        for i in range(bisect.bisect_left(starts, a), bisect.bisect_right(starts, b)):
            label[i] = name
    window = kernels[-1][1] - kernels[0][0]
    by_label: dict[str, float] = collections.defaultdict(float)
    by_kernel: dict[tuple[str, str], list[float]] = collections.defaultdict(lambda: [0.0, 0])
    for (a, b, name), where in zip(kernels, label, strict=True):
        by_label[where] += b - a
        entry = by_kernel[(where, name[:90])]
        entry[0] += b - a
        entry[1] += 1
    kernel_us = sum(by_label.values())
    cards = tokens / CARD_TOKENS
    top = sorted(by_kernel.items(), key=lambda kv: -kv[1][0])[:25]
    return {
        "trace": str(trace),
        "window_ms": round(window / 1000, 1),
        "gpu_busy_pct": round(100 * union([(a, b) for a, b, _ in kernels]) / window, 1),
        "kernel_ms": round(kernel_us / 1000, 1),
        "steps": dict(step_counts),
        "generated_tokens": tokens,
        "cards_equivalent": round(cards, 1),
        "kernel_ms_per_card": round(kernel_us / 1000 / cards, 2) if cards else None,
        "share_pct": {k: round(100 * v / kernel_us, 1) for k, v in sorted(by_label.items(), key=lambda kv: -kv[1])},
        "ms_per_card": {k: round(v / 1000 / cards, 2) for k, v in by_label.items()} if cards else {},
        "top_kernels": [{"where": w, "kernel": n, "ms": round(t / 1000, 2), "calls": c} for (w, n), (t, c) in top],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", nargs="?", type=Path)
    parser.add_argument("--analyse", type=Path, help="only analyse this trace")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--vllm-args", default=None, help="more AsyncEngineArgs (JSON), as hyocr's --vllm-args")
    args = parser.parse_args()
    if args.analyse:
        print(json.dumps(analyse(args.analyse), indent=1))
        return 0
    if args.out is None:
        parser.error("OUT_DIR or --analyse TRACE")
    args.out.mkdir(parents=True, exist_ok=True)
    trace = asyncio.run(profile(args.out, args.concurrency, args.steps, args.vllm_args))
    result = {"concurrency": args.concurrency, "steps": args.steps, "vllm_args": args.vllm_args,
              **analyse(trace)}
    (args.out / "profile.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "top_kernels"}, indent=1))
    for row in result["top_kernels"][:12]:
        print(f"{row['ms']:9.2f} ms {row['calls']:6d}  {row['where'][:22]:22s}  {row['kernel']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
