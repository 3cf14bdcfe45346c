"""The load generator: N streaming chat requests at a fixed concurrency against an OpenAI-compatible
server, measuring latency and time to first token per request (httpx, asyncio).

Request bodies are built before the clock starts, so the generator measures the server, not
image encoding. One client process handles about 16 streams (``STREAMS_PER_CLIENT``): parsing a
card's ~40 server-sent events costs the client ~20 ms of CPU (measured on the H200 machine), so a
single process would saturate its core near 50 requests/s and measure itself instead of the server.
Higher concurrency is split over client processes that start together; their samples are pooled.
"""

from __future__ import annotations

import asyncio
import json
import math
import multiprocessing
import queue
import re
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import httpx

from .gpu import NVIDIA_SMI, GpuMemorySampler, GpuProbe, PeakSampler
from .workload import Workload

__all__ = ["GpuMemorySampler", "LevelResult", "Sample", "error_kind", "one_request", "run_level", "summarize"]

# CUDA's "CUDA out of memory", torch's OutOfMemoryError, vLLM's messages, an "out_of_memory" code.
_OOM = re.compile(r"out[ _]of[ _]memory|outofmemory|\boom\b", re.IGNORECASE)


@dataclass(slots=True)
class Sample:
    ok: bool
    latency: float
    ttft: float | None = None
    completion_tokens: int = 0
    prompt_tokens: int = 0
    error: str | None = None  # error_kind(): "oom", "http_503", "timeout", "connection", ...


@dataclass(slots=True)
class LevelResult:
    concurrency: int
    requests: int
    errors: int
    error_rate: float = field(init=False)  # errors / requests
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
    peak_gpu_memory_source: str | None = None  # gpu.SERVER_METRICS | gpu.NVIDIA_SMI | None
    clients: int = 1  # load-generator processes the level was spread over

    def __post_init__(self) -> None:
        self.error_rate = round(self.errors / self.requests, 4) if self.requests else 0.0
        if self.peak_gpu_memory_bytes is not None and self.peak_gpu_memory_source is None:
            self.peak_gpu_memory_source = NVIDIA_SMI  # callers that predate the field only had nvidia-smi

    def as_dict(self) -> dict:
        return asdict(self)


def error_kind(status: int | None, body: str = "") -> str:
    """The error breakdown key of a failed request: "oom" when a server error says the engine ran out of
    memory (in its message, type or code), else ``http_<status>``, or for an error event inside a
    200 stream its error type."""
    if (status is None or status >= 500) and _OOM.search(body):
        return "oom"
    if status is not None:
        return f"http_{status}"
    try:
        error = json.loads(body)
    except ValueError:
        return "error"
    return str(error.get("type") or "error") if isinstance(error, dict) else "error"


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
                text = (await resp.aread()).decode(errors="replace")
                return Sample(False, time.perf_counter() - started, error=error_kind(resp.status_code, text))
            async for line in resp.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                event = json.loads(line[6:])
                if "error" in event:
                    kind = error_kind(None, json.dumps(event["error"], ensure_ascii=False))
                    return Sample(False, time.perf_counter() - started, error=kind)
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


STREAMS_PER_CLIENT = 16


def default_requests(concurrency: int) -> int:
    """Requests per level: four per stream (the first round starts together; later ones arrive as
    earlier ones finish, the steady state a server sees), and at least 32."""
    return max(32, 4 * concurrency)


def client_processes(concurrency: int, requested: int = 0) -> int:
    """Client processes for a level: ``requested``, else one per STREAMS_PER_CLIENT streams."""
    wanted = requested or math.ceil(concurrency / STREAMS_PER_CLIENT)
    return max(1, min(wanted, concurrency))


async def closed_loop(url: str, bodies: list[dict], concurrency: int, *, timeout: float,
                      headers: dict[str, str] | None, progress: Callable[[], object] | None = None) -> list[Sample]:
    """``concurrency`` workers sending ``bodies`` back to back: each starts its next request when its
    last one ends."""
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    samples: list[Sample] = []
    pending = iter(bodies)
    async with httpx.AsyncClient(base_url=url, timeout=timeout, limits=limits, headers=headers) as client:
        async def worker() -> None:
            for body in pending:  # shared iterator: each body is taken by exactly one worker
                samples.append(await one_request(client, body))
                if progress is not None:
                    progress()

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return samples


def _client_process(url: str, workload: Workload, indices: list[int], model: str, concurrency: int,
                    timeout: float, headers: dict[str, str] | None, start: object, done: object,
                    results: object) -> None:
    """One client process: draw its share of the bodies, wait for the common start, run them, report
    (samples, end time)."""
    bodies = [workload.chat_body(i, model) for i in indices]

    def count() -> None:
        with done.get_lock():
            done.value += 1

    async def go() -> list[Sample]:
        return await closed_loop(url, bodies, concurrency, timeout=timeout, headers=headers, progress=count)

    start.wait()
    samples = asyncio.run(go())
    results.put((samples, time.monotonic()))  # CLOCK_MONOTONIC: one clock for every process on Linux


async def run_level(
    url: str, workload: Workload, *, concurrency: int, requests: int, offset: int = 0,
    timeout: float = 600.0, model: str = "hyocr", progress: Callable[[], object] | None = None,
    headers: dict[str, str] | None = None, gpu: GpuProbe | None = None, clients: int = 0,
) -> LevelResult:
    processes = client_processes(concurrency, clients)
    indices = list(range(offset, offset + requests))
    if processes == 1:
        bodies = [workload.chat_body(i, model) for i in indices]
        async with PeakSampler(gpu.read if gpu else None) as memory:
            started = time.monotonic()
            samples = await closed_loop(url, bodies, concurrency, timeout=timeout, headers=headers,
                                        progress=progress)
            duration = time.monotonic() - started
    else:  # each client process draws its own bodies (in parallel), then they start together
        samples, duration, memory = await _run_clients(url, workload, indices, model, concurrency, processes,
                                                       timeout=timeout, headers=headers, progress=progress,
                                                       gpu=gpu)
    level = summarize(samples, concurrency=concurrency, duration=duration, peak=memory.peak,
                      source=gpu.source if gpu and memory.peak is not None else None)
    level.clients = processes
    return level


async def _run_clients(url: str, workload: Workload, indices: list[int], model: str, concurrency: int,
                       processes: int, *, timeout: float, headers: dict[str, str] | None,
                       progress: Callable[[], object] | None, gpu: GpuProbe | None) -> tuple[list, float, PeakSampler]:
    """The level over ``processes`` client processes: streams and requests dealt out evenly, one start."""
    ctx = multiprocessing.get_context("spawn")
    start, done, results = ctx.Barrier(processes + 1), ctx.Value("i", 0), ctx.Queue()
    shares = [concurrency // processes + (k < concurrency % processes) for k in range(processes)]
    procs = [ctx.Process(target=_client_process, daemon=True,
                         args=(url, workload, indices[k::processes], model, shares[k], timeout, headers, start,
                               done, results))
             for k in range(processes)]
    for proc in procs:
        proc.start()
    try:
        # Every client has imported and drawn its bodies (a page takes ~0.1 s to draw and encode).
        await asyncio.to_thread(start.wait, 600)
        async with PeakSampler(gpu.read if gpu else None) as memory:
            started = time.monotonic()
            reported, samples, ends = 0, [], []
            while len(ends) < processes:
                try:
                    part, end = await asyncio.to_thread(results.get, True, 0.25)
                    samples += part
                    ends.append(end)
                except queue.Empty:
                    if not any(p.is_alive() for p in procs) and results.empty():
                        raise RuntimeError("a load-generator process died") from None
                if progress is not None:
                    while reported < done.value:
                        reported += 1
                        progress()
        return samples, max(ends) - started, memory
    finally:
        for proc in procs:
            proc.join(timeout=5)
            if proc.is_alive():
                proc.kill()


def summarize(samples: list[Sample], *, concurrency: int, duration: float, peak: int | None = None,
              source: str | None = None) -> LevelResult:
    """One level's figures from its samples (also the raw vLLM baseline's, so both are computed alike)."""
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
        peak_gpu_memory_bytes=peak,
        error_breakdown=breakdown,
        peak_gpu_memory_source=source,
    )
