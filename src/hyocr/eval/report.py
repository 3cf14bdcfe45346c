"""The report: a JSON document headed like a bench result (engine, model, revision, settings, hyocr version,
date, machine), the set's scores per metric family, the operational figures and a row per page; its
markdown; reading reports back (for ``hyocr eval compare``)."""

from __future__ import annotations

import datetime as dt
import json
import os
import stat
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .. import __version__
from ..config import Settings
from . import EvalError

OBJECT = "hyocr.eval.report"
# Settings that do not change what an engine reads or how fast: left out of a report's settings.
_NOT_READING = ("host", "port", "log_", "otel_", "drain_", "ui", "api_keys", "jwt_", "allowed_ips",
                "trusted_proxies", "public_", "metrics_", "rate_limit", "jobs", "data_dir", "job_", "webhook_", "ray")

# (family, key, label, better): the figures shown in tables and compared, in order
HEADLINE = (
    ("text", "cer", "CER", "lower"), ("text", "wer", "WER", "lower"), ("text", "ned", "NED", "lower"),
    ("text", "cer_macro", "CER (page mean)", "lower"), ("text", "word_f1", "word F1 (any order)", "higher"),
    ("spotting", "precision", "box precision", "higher"), ("spotting", "recall", "box recall", "higher"),
    ("spotting", "f1", "box F1 (IoU >= 0.5)", "higher"), ("spotting", "mean_iou", "mean IoU of matches", "higher"),
    ("spotting", "matched_text_exact", "matched boxes' text exact", "higher"),
    ("extraction", "exact_match", "field exact match", "higher"), ("extraction", "similarity", "field similarity",
                                                                   "higher"),
    ("extraction", "f1", "field F1", "higher"), ("extraction", "schema_valid_rate", "schema-valid outputs", "higher"),
    ("tables", "teds", "TEDS", "higher"), ("tables", "teds_structure", "TEDS-S (structure)", "higher"),
    ("markdown", "text_ned", "markdown text NED", "lower"), ("markdown", "formula_ned", "formula NED", "lower"),
)
LIBRARIES = {"text": "rapidfuzz (Levenshtein)", "spotting": "hyocr's greedy IoU matcher", "extraction":
             "rapidfuzz, jsonschema", "tables": "apted + lxml (TEDS, as PubTabNet)", "markdown": "rapidfuzz"}


# Always shown, default or not: what a comparison of settings is usually about (how pages are rendered).
_ALWAYS = ("engine", "model", "pdf_detector_dpi", "pdf_max_dpi", "pdf_max_visual_tokens", "max_pixels",
           "default_max_tokens")


def reading_settings(settings: Settings) -> dict[str, Any]:
    """The engine, the model, the render settings, and every other setting that differs from its default
    and bears on reading (secrets masked)."""
    shown: dict[str, Any] = {name: getattr(settings, name) for name in _ALWAYS}
    for name, field in Settings.model_fields.items():
        if name in shown or name.startswith(_NOT_READING):
            continue
        value = getattr(settings, name)
        if value == field.get_default(call_default_factory=True):
            continue
        if "SecretStr" in str(field.annotation):
            value = "***"
        shown[name] = value if isinstance(value, str | int | float | bool | type(None)) else str(value)
    return shown


def header(*, label: str | None, target: str, engine: Mapping[str, Any], settings: Mapping[str, Any],
           options: Mapping[str, Any], set_info: Mapping[str, Any]) -> dict[str, Any]:
    from ..bench.report import cpu_name, gpu_name, library_versions

    return {"label": label, "target": target, "engine": dict(engine), "settings": dict(settings),
            "options": {k: v for k, v in options.items() if v not in (None, False)}, "set": dict(set_info),
            "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"), "hyocr": __version__,
            "gpu": gpu_name(), "cpu": cpu_name(), "cpus": os.cpu_count(), "python": sys.version.split()[0],
            "versions": {**library_versions(), **_metric_versions()}}


def _metric_versions() -> dict[str, str]:
    from importlib import metadata as md

    out = {}
    for name in ("rapidfuzz", "apted", "lxml", "jsonschema"):
        try:
            out[name] = md.version(name)
        except md.PackageNotFoundError:
            continue
    return out


def md_cell(text: str) -> str:
    """``text`` inside a markdown table cell: a "|" (a label "run|A") would start another column."""
    return str(text).replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")


def run_name(doc: Mapping[str, Any]) -> str:
    meta = doc["metadata"]
    return meta.get("label") or meta.get("engine", {}).get("engine") or meta.get("target") or "run"


def cell(value: Any, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def engine_line(meta: Mapping[str, Any]) -> str:
    engine = meta.get("engine") or {}
    parts = [engine.get("engine") or "?", engine.get("model") or "?"]
    if engine.get("revision"):
        parts.append(f"revision {engine['revision']}")
    return " / ".join(parts)


def markdown(doc: Mapping[str, Any]) -> str:
    meta, scores, ops = doc["metadata"], doc["scores"], doc["operational"]
    s = meta["set"]
    lines = [(f"**{run_name(doc)}**: {engine_line(meta)}; set {s['kind']} {s['path']} ({s['documents']} "
              f"documents, {s['pages_with_reference']} pages with a reference); hyocr {meta['hyocr']}; "
              f"{meta['date']}"), ""]
    shown = {k: v for k, v in meta["settings"].items() if k not in ("engine", "model") and v is not None}
    if shown:
        lines += ["Settings: " + ", ".join(f"{k}={v}" for k, v in shown.items()), ""]
    lines += ["| family | metric | value |", "|---|---|---|"]
    for family, key, label, better in HEADLINE:
        if family in scores and scores[family].get(key) is not None:
            lines.append(f"| {family} | {label} ({better} is better) | {cell(scores[family][key])} |")
    counts = [f"{f}: {scores[f].get('pages', scores[f].get('tables'))} {'tables' if f == 'tables' else 'pages'}"
              for f in scores]
    lines += ["", "Scored: " + "; ".join(counts) + ". Computed with "
              + ", ".join(LIBRARIES[f] for f in scores) + ".", ""]
    docs = ops["documents"]
    lines += [f"Read {ops['pages']['read']} pages of {docs['done']}/{docs['total']} documents "
              f"({docs['resumed']} from an earlier run, {docs['failed']} failed); "
              f"{cell(ops['pages_per_s'], 2)} pages/s over {ops['timed_pages']} timed pages; finish reasons: "
              + (", ".join(f"{k} {v}" for k, v in sorted(ops["finish_reasons"].items())) or "-")
              + f"; completion tokens per page {cell(ops['tokens_per_page']['completion'], 1)}."]
    if ops["pages"]["without_reference"]:
        lines.append(f"{ops['pages']['without_reference']} pages had no reference and were not read.")
    skipped = ops.get("skipped_documents") or []
    if skipped:
        lines.append(f"{len(skipped)} document(s) of the set not scored: "
                     + "; ".join(f"{Path(s['path']).name} ({s['why']})" for s in skipped[:10])
                     + (f"; ... {len(skipped) - 10} more in the JSON report" if len(skipped) > 10 else "") + ".")
    for failure in ops["failures"][:20]:
        where = failure["document"] + (f" page {failure['page']}" if failure.get("page") else "")
        lines.append(f"- failed: {where}: {failure['error']}")
    if ops["failures_total"] > 20:
        lines.append(f"- ... {ops['failures_total'] - 20} more in the JSON report")
    return "\n".join(lines)


def write_json(doc: Mapping[str, Any], path: Path) -> None:
    """The report, replacing a file whole (through a temp file); standard output, a descriptor (/dev/fd/N), a
    device or a pipe is written through, never replaced (as root, a rename over -o /dev/stdout replaced the node
    for the whole machine; over stdout's file, the log it appended to), and a link's target is written."""
    from ..batch.state import write_atomic
    from ..jobs.codec import json_text

    try:
        fd = _descriptor(path)
        if fd is None and not is_stream(path):
            write_atomic(Path(os.path.realpath(path)), doc)
            return
        if fd is not None:  # a descriptor: O_APPEND and the rest as the shell opened it
            stream = os.fdopen(os.dup(fd), "w", encoding="utf-8")
        else:
            stream = open(path, "w", encoding="utf-8")
        with stream as f:
            f.write(json_text(doc, indent=1) + "\n")
    except OSError as exc:
        raise EvalError(f"{path}: {exc.strerror or exc}") from None


_STANDARD = {"/dev/stdin": 0, "/dev/stdout": 1, "/dev/stderr": 2}
_DESCRIPTORS = ("/dev/fd/", "/proc/self/fd/")  # then a descriptor's number


def _descriptor(path: str | Path) -> int | None:
    """The open descriptor ``path`` names: /dev/stdout, /dev/stderr, /dev/fd/N, /proc/self/fd/N, or any path to
    the file standard output goes to."""
    text = os.path.abspath(path)
    named = _STANDARD.get(text)
    if named is not None:
        return named
    for prefix in _DESCRIPTORS:
        if text.startswith(prefix) and text[len(prefix):].isascii() and text[len(prefix):].isdigit():
            return int(text[len(prefix):])
    return 1 if is_stdout(path) else None


def is_stream(path: str | Path) -> bool:
    """Not a file to replace: an open descriptor's name (/dev/stdout, /dev/fd/N), or a path that exists and is not
    a regular file (a device, a FIFO), following links."""
    text = os.path.abspath(path)
    if text in _STANDARD or text.startswith(_DESCRIPTORS):
        return True
    try:
        return not stat.S_ISREG(os.stat(path).st_mode)
    except OSError:  # not there (yet): a file to create
        return False


def is_stdout(path: str | Path) -> bool:
    """``path`` is where this process's standard output goes (/dev/stdout, or the file it was redirected to)."""
    if os.path.abspath(path) == "/dev/stdout":
        return True
    try:
        mine, there = os.fstat(sys.stdout.fileno()), os.stat(path)
    except (OSError, ValueError, AttributeError):  # no stdout, or nothing at path
        return False
    return (mine.st_dev, mine.st_ino) == (there.st_dev, there.st_ino)


def write_text(path: str | Path | None, text: str) -> None:
    if not path:
        return
    try:
        Path(path).write_text(text if text.endswith("\n") else text + "\n", encoding="utf-8",
                              errors="backslashreplace")  # a file name that is not UTF-8 (PEP 383)
    except OSError as exc:
        raise EvalError(f"{path}: {exc.strerror or exc}") from None


def load(path: str) -> dict[str, Any]:
    """A report, checked enough for compare to trust its shape; EvalError says what is wrong."""
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise EvalError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise EvalError(f"{path}: is a directory, not a report") from None
    except OSError as exc:
        raise EvalError(f"{path}: {exc.strerror}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise EvalError(f"{path}: not a JSON report ({exc})") from None
    if not isinstance(doc, dict) or doc.get("object") != OBJECT:
        raise EvalError(f"{path}: not a hyocr eval report (expected \"object\": \"{OBJECT}\")")
    for key in ("metadata", "scores", "operational"):
        if not isinstance(doc.get(key), dict):
            raise EvalError(f"{path}: not a hyocr eval report (no {key!r} object)")
    return doc
