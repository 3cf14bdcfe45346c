"""Benchmark runs -> a self-explaining JSON document and a markdown table; reading result files back."""

from __future__ import annotations

import datetime as dt
import json
import math
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import httpx

from .. import __version__
from . import BenchError

MAX_ERROR_RATE = 0.02  # "sustained": the level's errors stayed under this fraction
_LEVEL_KEYS = ("concurrency", "requests", "errors", "throughput_rps", "latency_mean_s", "latency_p99_s")


def gpu_name() -> str | None:
    if not shutil.which("nvidia-smi"):
        return None
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                             check=False, capture_output=True, text=True, timeout=10).stdout.strip()
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


def server_info(url: str, headers: dict[str, str] | None = None) -> dict:
    """What the target says it serves (/v1/models), so the result names the engine and model."""
    try:
        data = httpx.get(f"{url}/v1/models", timeout=10, headers=headers).json()["data"][0]
    except (httpx.HTTPError, KeyError, IndexError, ValueError, TypeError):
        return {}
    return {"model": data.get("id"), **(data.get("hyocr") or {})}


def metadata(url: str, workload, label: str | None, *, target: str | None = None,
             headers: dict[str, str] | None = None) -> dict:
    return {
        "label": label,
        "target": target or url,
        "server": server_info(url, headers) if url.startswith("http") else {},
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "gpu": gpu_name(),
        "cpu": cpu_name(),
        "cpus": os.cpu_count(),
        "python": sys.version.split()[0],
        "hyocr": __version__,
        "versions": library_versions(),
        "workload": {
            "name": workload.name,
            "image_size": list(workload.size),
            "prompt": workload.prompt,
            "max_tokens": workload.max_tokens,
            "fixed_output": workload.fixed_output,
            "seed": workload.seed,
        },
    }


# The libraries that decide an engine's speed. Read from the installed distributions, never imported; the
# machine running the benchmark (the server's own for --engine; a URL target also reports its engine in "server").
_LIBRARIES = ("vllm", "torch", "transformers", "onnxruntime", "rapidocr", "httpx", "uvicorn")


def library_versions() -> dict[str, str]:
    from importlib import metadata as md

    versions = {}
    for name in _LIBRARIES:
        try:
            versions[name] = md.version(name)
        except md.PackageNotFoundError:
            continue
    return versions


def error_rate(level: dict) -> float:
    """Files written before ``error_rate`` existed have only the counts."""
    if level.get("error_rate") is not None:
        return level["error_rate"]
    return level["errors"] / level["requests"] if level["requests"] else 0.0


def sustained(levels: list[dict], max_error_rate: float = MAX_ERROR_RATE) -> int | None:
    """The highest concurrency whose error rate stayed under 2%."""
    good = [lv["concurrency"] for lv in levels if lv["requests"] and error_rate(lv) < max_error_rate]
    return max(good) if good else None


def run_name(doc: dict) -> str:
    meta = doc["metadata"]
    return meta.get("label") or (meta.get("server") or {}).get("engine") or meta.get("target") or "run"


# --- cells shared by the run and compare tables ---

def gib(n: int | None) -> str:
    return f"{n / 2**30:.1f}" if n else "-"


def seconds(v: float | None) -> str:
    return "-" if v is None or math.isnan(v) else f"{v:.3f}"  # NaN: every request of the level failed


def errors_cell(level: dict) -> str:
    cell = f"{100 * error_rate(level):.1f}%"
    oom = (level.get("error_breakdown") or {}).get("oom")
    return f"{cell} ({oom} OOM)" if oom else cell


def workload_line(meta: dict) -> str:
    w = meta["workload"]
    return (f"{w['name']} {w['image_size'][0]}x{w['image_size'][1]}, {w['max_tokens']} output tokens"
            f"{' (fixed)' if w['fixed_output'] else ''}")


def markdown(doc: dict) -> str:
    meta = doc["metadata"]
    lines = [
        f"**{run_name(doc)}** — {workload_line(meta)}; GPU {meta['gpu'] or 'none'}; {meta['date']}",
        "",
        ("| concurrency | requests | errors | req/s | output tok/s | mean latency s | p50 s | p99 s | TTFT p50 s "
         "| TTFT p99 s | peak GPU mem GiB |"),
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for lv in doc["levels"]:
        lines.append(
            f"| {lv['concurrency']} | {lv['requests']} | {errors_cell(lv)} | {lv['throughput_rps']:.2f} | "
            f"{lv['output_tokens_per_s']:.0f} | {seconds(lv['latency_mean_s'])} | {seconds(lv['latency_p50_s'])} | "
            f"{seconds(lv['latency_p99_s'])} | {seconds(lv['ttft_p50_s'])} | {seconds(lv['ttft_p99_s'])} | "
            f"{gib(lv['peak_gpu_memory_bytes'])} |"
        )
    lines += ["", f"Highest concurrency with < 2% errors: {sustained(doc['levels'])}"]
    for lv in doc["levels"]:
        if lv.get("error_breakdown"):
            kinds = ", ".join(f"{k} {v}" for k, v in sorted(lv["error_breakdown"].items()))
            lines.append(f"Errors at concurrency {lv['concurrency']}: {kinds}")
    sources = sorted({lv["peak_gpu_memory_source"] for lv in doc["levels"] if lv.get("peak_gpu_memory_source")})
    if sources:
        lines.append(f"Peak GPU memory from: {', '.join(sources)}")
    return "\n".join(lines)


def write(doc: dict, path: str | None) -> None:
    text = json.dumps(doc, indent=2, ensure_ascii=False)
    if path:
        Path(path).write_text(text + "\n")


def load(path: str) -> dict:
    """A result file, checked enough that the reports can trust its shape; BenchError says what is wrong."""
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise BenchError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise BenchError(f"{path}: is a directory, not a result file") from None
    except OSError as exc:
        raise BenchError(f"{path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise BenchError(f"{path}: not a text file") from None
    except json.JSONDecodeError as exc:
        raise BenchError(f"{path}: not JSON ({exc.msg}, line {exc.lineno})") from None
    what = "not a hyocr bench result"
    if not isinstance(doc, dict) or not isinstance(doc.get("levels"), list) or not isinstance(
            doc.get("metadata"), dict):
        raise BenchError(f"{path}: {what} (expected 'metadata' and a 'levels' list)")
    for i, level in enumerate(doc["levels"]):
        missing = [k for k in _LEVEL_KEYS if not isinstance(level, dict) or k not in level]
        if missing:
            raise BenchError(f"{path}: {what} (level {i} lacks {', '.join(missing)})")
        wrong = [k for k in _LEVEL_KEYS if isinstance(level[k], bool) or not isinstance(
            level[k], int if k in ("concurrency", "requests", "errors") else (int, float))]
        if wrong:
            raise BenchError(f"{path}: {what} (level {i}: {', '.join(wrong)} not a number)")
        level.setdefault("peak_gpu_memory_bytes", None)
        level.setdefault("ttft_p50_s", None)
        level.setdefault("error_breakdown", {})
        level["error_rate"] = error_rate(level)
    if "workload" not in doc["metadata"]:
        raise BenchError(f"{path}: {what} (metadata lacks 'workload')")
    return doc
