"""Benchmark runs -> a self-explaining JSON document and a markdown table."""

from __future__ import annotations

import datetime as dt
import json
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import httpx

from .. import __version__


def gpu_name() -> str | None:
    if not shutil.which("nvidia-smi"):
        return None
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return out.splitlines()[0] if out else None


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def server_info(url: str) -> dict:
    """What the target says it serves (/v1/models), so the result names the engine and model."""
    try:
        data = httpx.get(f"{url}/v1/models", timeout=10).json()["data"][0]
    except (httpx.HTTPError, KeyError, IndexError, ValueError):
        return {}
    return {"model": data.get("id"), **(data.get("hyocr") or {})}


def metadata(url: str, workload, label: str | None) -> dict:
    return {
        "label": label,
        "target": url,
        "server": server_info(url),
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "gpu": gpu_name(),
        "cpu": cpu_name(),
        "cpus": __import__("os").cpu_count(),
        "python": sys.version.split()[0],
        "hyocr": __version__,
        "workload": {
            "name": workload.name,
            "image_size": list(workload.size),
            "prompt": workload.prompt,
            "max_tokens": workload.max_tokens,
            "fixed_output": workload.fixed_output,
            "seed": workload.seed,
        },
    }


def sustained(levels: list[dict], max_error_rate: float = 0.02) -> int | None:
    """The highest concurrency whose error rate stayed under 2%."""
    good = [lv["concurrency"] for lv in levels if lv["requests"] and lv["errors"] / lv["requests"] < max_error_rate]
    return max(good) if good else None


def markdown(doc: dict) -> str:
    meta = doc["metadata"]
    title = meta.get("label") or meta["server"].get("engine") or meta["target"]
    lines = [
        f"**{title}** — {meta['workload']['name']} {meta['workload']['image_size'][0]}x"
        f"{meta['workload']['image_size'][1]}, {meta['workload']['max_tokens']} output tokens"
        f"{' (fixed)' if meta['workload']['fixed_output'] else ''}; GPU {meta['gpu'] or 'none'}; {meta['date']}",
        "",
        "| concurrency | requests | errors | req/s | output tok/s | mean latency s | p50 s | p99 s | TTFT p50 s "
        "| TTFT p99 s | peak GPU mem GiB |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for lv in doc["levels"]:
        mem = f"{lv['peak_gpu_memory_bytes'] / 2**30:.1f}" if lv["peak_gpu_memory_bytes"] else "-"
        ttft50 = f"{lv['ttft_p50_s']:.3f}" if lv["ttft_p50_s"] is not None else "-"
        ttft99 = f"{lv['ttft_p99_s']:.3f}" if lv["ttft_p99_s"] is not None else "-"
        lines.append(
            f"| {lv['concurrency']} | {lv['requests']} | {lv['errors']} | {lv['throughput_rps']:.2f} | "
            f"{lv['output_tokens_per_s']:.0f} | {lv['latency_mean_s']:.3f} | {lv['latency_p50_s']:.3f} | "
            f"{lv['latency_p99_s']:.3f} | {ttft50} | {ttft99} | {mem} |"
        )
    lines.append("")
    lines.append(f"Highest concurrency with < 2% errors: {doc['sustained_concurrency']}")
    return "\n".join(lines)


def write(doc: dict, path: str | None) -> None:
    text = json.dumps(doc, indent=2, ensure_ascii=False)
    if path:
        Path(path).write_text(text + "\n")
