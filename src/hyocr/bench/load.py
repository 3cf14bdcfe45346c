"""The load generator: N streaming chat requests at a fixed concurrency against an OpenAI-compatible
server, measuring latency and time to first token per request (httpx, asyncio).

Request bodies are built before the clock starts, so the generator measures the server, not
image encoding.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import statistics
import subprocess
import time
from dataclasses import asdict, dataclass, field

import httpx

from .workload import Workload


@dataclass(slots=True)
class Sample:
    ok: bool
    latency: float
    ttft: float | None = None
    completion_tokens: int = 0
    prompt_tokens: int = 0
    error: str | None = None  # "http_503", "timeout", "connection", ...


@dataclass(slots=True)
class LevelResult:
    concurrency: int
    requests: int
    errors: int
    duration_s: float
    throughput_rps: float
    output_tokens_per_s: float
    latency_mean_s: float
    latency_p50_s: float
    latency_p99_s: float
    ttft_p50_s: float | None
    ttft_p99_s: float | None
    prompt_tokens_mean: float
    completion_tokens_mean: float
    peak_gpu_memory_bytes: int | None
    error_breakdown: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict:
        return asdict(self)


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


async def one_request(client: httpx.AsyncClient, body: dict) -> Sample:
    started = time.perf_counter()
    ttft = None
    usage: dict = {}
    try:
        async with client.stream("POST", "/v1/chat/completions", json=body) as resp:
            if resp.status_code != 200:
                await resp.aread()
                return Sample(False, time.perf_counter() - started, error=f"http_{resp.status_code}")
            async for line in resp.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                event = json.loads(line[6:])
                if "error" in event:
                    return Sample(False, time.perf_counter() - started, error=event["error"].get("type", "error"))
                if event.get("usage"):
                    usage = event["usage"]
                if ttft is None and any((c.get("delta") or {}).get("content") for c in event.get("choices", [])):
                    ttft = time.perf_counter() - started
    except httpx.TimeoutException:
        return Sample(False, time.perf_counter() - started, error="timeout")
    except httpx.HTTPError:
        return Sample(False, time.perf_counter() - started, error="connection")
    return Sample(True, time.perf_counter() - started, ttft, usage.get("completion_tokens", 0),
                  usage.get("prompt_tokens", 0))


class GpuMemorySampler:
    """Peak GPU memory in use (all processes, as nvidia-smi reports it) while a level runs."""

    def __init__(self, interval: float = 0.2) -> None:
        self.interval = interval
        self.peak: int | None = None
        self._task: asyncio.Task | None = None

    @staticmethod
    def available() -> bool:
        return shutil.which("nvidia-smi") is not None

    async def _run(self) -> None:
        while True:
            proc = await asyncio.create_subprocess_exec(
                "nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits",
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            )
            out, _ = await proc.communicate()
            try:
                used = sum(int(v) for v in out.decode().split()) * 1024 * 1024
                self.peak = max(self.peak or 0, used)
            except ValueError:
                pass
            await asyncio.sleep(self.interval)

    def __enter__(self) -> GpuMemorySampler:
        if self.available():
            self._task = asyncio.get_running_loop().create_task(self._run())
        return self

    def __exit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()


async def run_level(
    url: str, workload: Workload, *, concurrency: int, requests: int, offset: int = 0,
    timeout: float = 600.0, model: str = "hyocr", progress=None,
) -> LevelResult:
    bodies = [workload.chat_body(offset + i, model) for i in range(requests)]
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    samples: list[Sample] = []
    queue: asyncio.Queue = asyncio.Queue()
    for body in bodies:
        queue.put_nowait(body)

    async with httpx.AsyncClient(base_url=url, timeout=timeout, limits=limits) as client:
        async def worker() -> None:
            while not queue.empty():
                body = queue.get_nowait()
                samples.append(await one_request(client, body))
                if progress is not None:
                    progress()

        with GpuMemorySampler() as gpu:
            started = time.perf_counter()
            await asyncio.gather(*(worker() for _ in range(concurrency)))
            duration = time.perf_counter() - started
    ok = [s for s in samples if s.ok]
    latencies = [s.latency for s in ok]
    ttfts = [s.ttft for s in ok if s.ttft is not None]
    breakdown: dict[str, int] = {}
    for s in samples:
        if not s.ok:
            breakdown[s.error or "error"] = breakdown.get(s.error or "error", 0) + 1
    return LevelResult(
        concurrency=concurrency,
        requests=len(samples),
        errors=len(samples) - len(ok),
        duration_s=round(duration, 3),
        throughput_rps=round(len(ok) / duration, 3) if duration else 0.0,
        output_tokens_per_s=round(sum(s.completion_tokens for s in ok) / duration, 1) if duration else 0.0,
        latency_mean_s=round(statistics.fmean(latencies), 4) if latencies else float("nan"),
        latency_p50_s=round(_quantile(latencies, 0.5), 4),
        latency_p99_s=round(_quantile(latencies, 0.99), 4),
        ttft_p50_s=round(_quantile(ttfts, 0.5), 4) if ttfts else None,
        ttft_p99_s=round(_quantile(ttfts, 0.99), 4) if ttfts else None,
        prompt_tokens_mean=round(statistics.fmean([s.prompt_tokens for s in ok]), 1) if ok else 0.0,
        completion_tokens_mean=round(statistics.fmean([s.completion_tokens for s in ok]), 1) if ok else 0.0,
        peak_gpu_memory_bytes=gpu.peak,
        error_breakdown=breakdown,
    )
