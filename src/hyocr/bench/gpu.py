"""Peak GPU memory while a level runs: from the server's /metrics (its NVML gauges, so it works for a
remote server) or, when the server exports none, from this machine's nvidia-smi.

Either way the figure is memory in use on the whole GPU(s), all processes, summed over devices.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import subprocess
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Self

import httpx
from prometheus_client.parser import text_string_to_metric_families

GPU_MEMORY_METRIC = "hyocr_gpu_memory_used_bytes"  # observability/metrics.py GpuCollector
SERVER_METRICS = "server_metrics"
NVIDIA_SMI = "nvidia-smi"

Reader = Callable[[], Awaitable[int | None]]


def parse_gpu_memory(text: str) -> int | None:
    """Bytes in use summed over the GPUs of a Prometheus text exposition; None if it has no such gauge."""
    values = [sample.value for family in text_string_to_metric_families(text) if family.name == GPU_MEMORY_METRIC
              for sample in family.samples if sample.name == GPU_MEMORY_METRIC]
    return int(sum(values)) if values else None


def server_metrics_reader(metrics_url: str, headers: dict[str, str] | None = None) -> Reader:
    async def read() -> int | None:
        try:
            async with httpx.AsyncClient(timeout=5, headers=headers) as client:
                resp = await client.get(metrics_url)
            return parse_gpu_memory(resp.text) if resp.status_code == 200 else None
        except (httpx.HTTPError, ValueError):  # unreachable, or not Prometheus text
            return None

    return read


async def read_nvidia_smi() -> int | None:
    try:
        proc = await asyncio.create_subprocess_exec(
            NVIDIA_SMI, "--query-gpu=memory.used", "--format=csv,noheader,nounits",
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        )
        out, _ = await proc.communicate()
        return sum(int(v) for v in out.decode().split()) * 1024 * 1024
    except (OSError, ValueError):
        return None


@dataclass(frozen=True, slots=True)
class GpuProbe:
    source: str  # SERVER_METRICS | NVIDIA_SMI: recorded in each level
    read: Reader


async def choose_probe(metrics_url: str, headers: dict[str, str] | None = None) -> GpuProbe | None:
    """The server's gauge if it exports one, else local nvidia-smi, else nothing; says which on stderr."""
    try:
        async with httpx.AsyncClient(timeout=10, headers=headers) as client:
            resp = await client.get(metrics_url)
        status = resp.status_code
        found = parse_gpu_memory(resp.text) if status == 200 else None
    except (httpx.HTTPError, ValueError):
        status, found = None, None
    if found is not None:
        print(f"peak GPU memory: from {GPU_MEMORY_METRIC} at {metrics_url}", file=sys.stderr)
        return GpuProbe(SERVER_METRICS, server_metrics_reader(metrics_url, headers))
    why = {None: "unreachable", 200: f"no {GPU_MEMORY_METRIC}"}.get(status, f"HTTP {status}")
    if status in (401, 403):
        why += " (pass --api-key, or serve with HYOCR_PUBLIC_METRICS=true)"
    if shutil.which(NVIDIA_SMI):
        print(f"peak GPU memory: from local nvidia-smi ({metrics_url}: {why})", file=sys.stderr)
        return GpuProbe(NVIDIA_SMI, read_nvidia_smi)
    print(f"peak GPU memory: not measured ({metrics_url}: {why}; no nvidia-smi here)", file=sys.stderr)
    return None


class PeakSampler:
    """The largest reading taken every ``interval`` seconds while the block runs.

    ``async with`` also reads once more on exit, so a level shorter than the interval still has a figure.
    """

    def __init__(self, read: Reader | None, interval: float = 0.5) -> None:
        self.read, self.interval = read, interval
        self.peak: int | None = None
        self._task: asyncio.Task | None = None

    def _note(self, value: int | None) -> None:
        if value is not None:
            self.peak = max(self.peak or 0, value)

    async def _run(self) -> None:
        while True:
            self._note(await self.read())
            await asyncio.sleep(self.interval)

    def __enter__(self) -> Self:
        if self.read is not None:
            self._task = asyncio.get_running_loop().create_task(self._run())
        return self

    def __exit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()

    async def __aenter__(self) -> Self:
        return self.__enter__()

    async def __aexit__(self, *exc: object) -> None:
        if self._task is None:
            return
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self._note(await self.read())


class GpuMemorySampler(PeakSampler):
    """Local nvidia-smi only, as a plain ``with`` block (benchmarks/raw_vllm.py measures in-process)."""

    def __init__(self, interval: float = 0.2) -> None:
        super().__init__(read_nvidia_smi if self.available() else None, interval)

    @staticmethod
    def available() -> bool:
        return shutil.which(NVIDIA_SMI) is not None
