"""``hyocr bench compare A.json B.json ...``: runs side by side, in the shape of docs/benchmarks.md's
tables (a row per run and concurrency), with each run's throughput and latency as a ratio of the first
run's (the baseline) at the same concurrency. A level missing from a run reads "-"."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from . import report
from .report import errors_cell, gib, seconds


@dataclass(frozen=True, slots=True)
class Run:
    name: str
    path: str
    doc: dict

    def level(self, concurrency: int) -> dict | None:
        return next((lv for lv in self.doc["levels"] if lv["concurrency"] == concurrency), None)


def load_runs(paths: list[str]) -> list[Run]:
    """Result files as named runs; a name shared by several runs gets its file name added."""
    docs = [report.load(p) for p in paths]
    names = [report.run_name(d) for d in docs]
    return [Run(f"{n} ({Path(p).stem})" if names.count(n) > 1 else n, p, d) for n, p, d in zip(names, paths, docs)]


def ratio(value: float | None, base: float | None) -> float | None:
    if value is None or base is None or math.isnan(value) or math.isnan(base) or not base:
        return None
    return value / base


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def concurrencies(runs: list[Run]) -> list[int]:
    return sorted({lv["concurrency"] for run in runs for lv in run.doc["levels"]})


def _run_rows(runs: list[Run]) -> list[str]:
    rows = ["| run | engine | model | workload | GPU | date | file |", "|---|---|---|---|---|---|---|"]
    for i, run in enumerate(runs):
        meta, server = run.doc["metadata"], run.doc["metadata"].get("server") or {}
        name = f"{run.name} (baseline)" if i == 0 else run.name
        rows.append(f"| {name} | {server.get('engine') or '-'} | {server.get('model') or '-'} | "
                    f"{report.workload_line(meta)} | {meta.get('gpu') or 'none'} | {meta.get('date', '-')} | "
                    f"{Path(run.path).name} |")
    return rows


def _summary_rows(runs: list[Run]) -> list[str]:
    base = runs[0]
    rows = [("| run | sustained concurrency (< 2% errors) | best req/s | req/s vs baseline | "
             "peak GPU memory GiB | errors (OOM) |"), "|---|---|---|---|---|---|"]
    for i, run in enumerate(runs):
        levels = run.doc["levels"]
        best = max(levels, key=lambda lv: lv["throughput_rps"], default=None)
        shared = [c for c in concurrencies([run]) if base.level(c)]
        if i == 0:
            versus = "baseline"
        elif shared:  # at the highest concurrency both ran: where engines differ most
            top = shared[-1]
            versus = f"{_x(ratio(run.level(top)['throughput_rps'], base.level(top)['throughput_rps']))} at {top}"
        else:
            versus = "-"
        requests = sum(lv["requests"] for lv in levels)
        total = {"requests": requests, "errors": sum(lv["errors"] for lv in levels),
                 "error_breakdown": {"oom": sum((lv.get("error_breakdown") or {}).get("oom", 0) for lv in levels)}}
        peak = max((lv["peak_gpu_memory_bytes"] or 0 for lv in levels), default=0)
        top_rps = f"{best['throughput_rps']:.2f} at {best['concurrency']}" if best else "-"
        rows.append(f"| {run.name} | {report.sustained(levels) or '-'} | {top_rps} | {versus} | {gib(peak)} | "
                    f"{errors_cell(total)} |")
    return rows


def _level_rows(runs: list[Run]) -> list[str]:
    base = runs[0]
    rows = [("| run | concurrency | req/s | mean latency s | p99 s | TTFT p50 s | peak GPU memory GiB | errors "
             "| req/s vs baseline | latency vs baseline |"), "|---|---|---|---|---|---|---|---|---|---|"]
    for i, run in enumerate(runs):
        for c in concurrencies(runs):
            lv, b = run.level(c), base.level(c)
            if lv is None:
                rows.append(f"| {run.name} | {c} |" + " - |" * 8)
                continue
            if i == 0:
                versus = ["baseline", "baseline"]
            else:
                versus = [_x(ratio(lv["throughput_rps"], b and b["throughput_rps"])),
                          _x(ratio(lv["latency_mean_s"], b and b["latency_mean_s"]))]
            rows.append(f"| {run.name} | {c} | {lv['throughput_rps']:.2f} | {seconds(lv['latency_mean_s'])} | "
                        f"{seconds(lv['latency_p99_s'])} | {seconds(lv['ttft_p50_s'])} | "
                        f"{gib(lv['peak_gpu_memory_bytes'])} | {errors_cell(lv)} | {versus[0]} | {versus[1]} |")
    return rows


def workload_warning(runs: list[Run]) -> str | None:
    """Ratios mean something only between runs of the same work."""
    shapes = {report.workload_line(run.doc["metadata"]) for run in runs}
    if len(shapes) > 1:
        return f"**Workloads differ** ({'; '.join(sorted(shapes))}): the ratios compare different work."
    return None


def markdown(runs: list[Run]) -> str:
    lines = ["### Runs", "", *_run_rows(runs), ""]
    warning = workload_warning(runs)
    if warning:
        lines += [warning, ""]
    lines += ["### Summary", "", *_summary_rows(runs), "",
              "### Per concurrency level", "", *_level_rows(runs), "",
              ("Ratios are of the first run (baseline) at the same concurrency: req/s above 1.00x is faster, "
               "latency below 1.00x is faster.")]
    return "\n".join(lines)
