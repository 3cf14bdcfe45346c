"""``hyocr eval compare A.json B.json ...``: reports side by side in the shape of ``hyocr bench compare``:
the runs (engine, model, settings that differ, date), then each score with its difference from the first
report (the baseline), then speed and failures with pages/s as a ratio of the baseline's."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import report
from .report import HEADLINE, cell


@dataclass(frozen=True, slots=True)
class Run:
    name: str
    path: str
    doc: dict[str, Any]

    def score(self, family: str, key: str) -> float | None:
        value = (self.doc["scores"].get(family) or {}).get(key)
        return value if isinstance(value, int | float) and not isinstance(value, bool) else None


def load_runs(paths: list[str]) -> list[Run]:
    """Reports as named runs; a name shared by several gets its file name added."""
    docs = [report.load(p) for p in paths]
    names = [report.run_name(d) for d in docs]
    return [Run(report.md_cell(f"{n} ({Path(p).stem})" if names.count(n) > 1 else n), p, d)
            for n, p, d in zip(names, paths, docs)]


def settings_diff(runs: list[Run]) -> list[dict[str, Any]]:
    """Per run, the settings whose value is not the same in every run (what the comparison is about)."""
    every = [r.doc["metadata"].get("settings") or {} for r in runs]
    keys = sorted({k for s in every for k in s})
    varying = [k for k in keys if len({repr(s.get(k)) for s in every}) > 1]
    return [{k: s.get(k) for k in varying} for s in every]


def _delta(value: float | None, base: float | None, better: str) -> str:
    if value is None or base is None:
        return "-"
    diff = value - base
    if abs(diff) < 5e-4:
        return "="
    good = (diff < 0) == (better == "lower")
    return f"{diff:+.3f} ({'better' if good else 'worse'})"


def _runs_rows(runs: list[Run]) -> list[str]:
    rows = ["| run | engine / model | settings that differ | set | date | file |", "|---|---|---|---|---|---|"]
    for i, (run, diff) in enumerate(zip(runs, settings_diff(runs), strict=True)):
        meta = run.doc["metadata"]
        shown = ", ".join(f"{k}={v}" for k, v in diff.items()) or "-"
        name = f"{run.name} (baseline)" if i == 0 else run.name
        rows.append(f"| {name} | {report.md_cell(report.engine_line(meta))} | {report.md_cell(shown)} | "
                    f"{meta['set']['kind']}, {meta['set']['pages_with_reference']} pages | {meta.get('date', '-')} | "
                    f"{report.md_cell(Path(run.path).name)} |")
    return rows


def _score_rows(runs: list[Run]) -> list[str]:
    head = "| metric | " + " | ".join(r.name for r in runs) + " |"
    rows = [head, "|---|" + "---|" * len(runs)]
    for family, key, label, better in HEADLINE:
        values = [r.score(family, key) for r in runs]
        if all(v is None for v in values):
            continue
        cells = [cell(values[0])] + [f"{cell(v)} ({_delta(v, values[0], better)})" if v is not None else "-"
                                     for v in values[1:]]
        rows.append(f"| {label} ({better} is better) | " + " | ".join(cells) + " |")
    return rows


def _speed_rows(runs: list[Run]) -> list[str]:
    rows = [("| run | pages read | pages/s | pages/s vs baseline | failed pages | finish reasons | "
             "completion tokens/page |"), "|---|---|---|---|---|---|---|"]
    base = runs[0].doc["operational"].get("pages_per_s")
    for i, run in enumerate(runs):
        ops = run.doc["operational"]
        speed = ops.get("pages_per_s")
        versus = "baseline" if i == 0 else (f"{speed / base:.2f}x" if speed and base else "-")
        reasons = ", ".join(f"{k} {v}" for k, v in sorted((ops.get("finish_reasons") or {}).items())) or "-"
        rows.append(f"| {run.name} | {ops['pages']['read']} | {cell(speed, 2)} | {versus} | {ops['failures_total']} "
                    f"| {reasons} | {cell((ops.get('tokens_per_page') or {}).get('completion'), 1)} |")
    return rows


def set_warning(runs: list[Run]) -> str | None:
    """Scores compare only between runs on the same documents and truth."""
    prints = {r.doc["metadata"]["set"].get("fingerprint") for r in runs}
    if len(prints) > 1:
        return "**The sets differ** (their documents or truth are not the same): the scores compare different work."
    return None


def markdown(runs: list[Run]) -> str:
    lines = ["### Runs", "", *_runs_rows(runs), ""]
    if warning := set_warning(runs):
        lines += [warning, ""]
    lines += ["### Scores", "", *_score_rows(runs), "", "### Speed and failures", "", *_speed_rows(runs), "",
              "Differences are of the first report (baseline); pages/s above 1.00x is faster."]
    return "\n".join(lines)
