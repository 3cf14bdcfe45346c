"""The ``hyocr eval`` command line: ``add_parser`` (hooked into hyocr's parser by cli.py) and ``main``."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path
from typing import Any

from ..cli_args import seconds, server_url
from . import EvalError

TRUTHS = ("manifest", "omnidocbench", "pdf-text")


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "eval", help="accuracy on labelled documents (or PDFs' text layers); 'eval compare' compares reports",
        description="Read a labelled SET with the configured engine (in-process) or a server (--url) and score "
        "it: text CER/WER/NED, boxes matched at IoU >= 0.5, extracted fields, tables by TEDS, markdown as "
        "OmniDocBench splits it, and pages/s. SET: a .jsonl manifest ({'path', 'pages'?, 'task'?, 'truth'} a "
        "line), an OmniDocBench folder, or PDFs (a file, folder or glob) with --truth pdf-text. A rerun reads "
        "only what is missing (REPORT.reads/). 'hyocr eval compare A.json B.json ...' puts reports side by "
        "side, the first the baseline.")
    p.add_argument("set", metavar="SET", help="what to evaluate (or 'compare', then the reports)")
    p.add_argument("reports", nargs="*", metavar="REPORT.json", help="compare: the reports, baseline first")
    p.add_argument("--output", "-o", metavar="PATH",
                   help="the JSON report (required); compare: the markdown comparison (as --markdown)")
    p.add_argument("--markdown", metavar="PATH", help="also write the report as markdown")
    p.add_argument("--plot", metavar="PATH", help="scores and pages/s as a PNG (extra bench)")
    p.add_argument("--truth", choices=TRUTHS, help="what SET is (default: told by it); pdf-text: PDFs whose "
                   "own text layer is the reference")
    p.add_argument("--reads", type=Path, metavar="DIR",
                   help="the documents' results and the resume state (default: REPORT.reads/ beside --output)")
    p.add_argument("--task", help="the task, where a manifest line names none (default: what its truth "
                   "scores: extract for fields, spotting for blocks, document for markdown, else text)")
    p.add_argument("--fields", help="comma-separated field names for --task extract (default: the truth's)")
    p.add_argument("--language", help="translation target for --task translate: en | zh")
    p.add_argument("--question", help="the question for --task vqa")
    p.add_argument("--pages", help="PDF files: the pages to read, 1-based, e.g. 1-3,8 (default all)")
    p.add_argument("--max-tokens", dest="max_tokens", type=int, help="generation cap per page")
    p.add_argument("--ignore-case", dest="fold_case", action="store_true", help="compare text case-folded")
    p.add_argument("--limit", type=int, help="only the first N documents of the set")
    p.add_argument("--filter", dest="filters", action="append", metavar="KEY=VALUE",
                   help="OmniDocBench: pages with this page attribute only, e.g. language=english (repeatable)")
    p.add_argument("--omnidocbench-pdfs", dest="omnidocbench_pdfs", action="store_true",
                   help="OmniDocBench: read its pdfs/ (the same pages as PDF) instead of images/")
    p.add_argument("--label", help="name of this run in reports")
    p.add_argument("--url", type=server_url, help="read through a running hyocr server's jobs API instead of in-process")
    p.add_argument("--api-key", dest="api_key", help="--url: the server's key (or HYOCR_CLIENT_API_KEY)")
    p.add_argument("--timeout", type=seconds, default=60.0, help="--url: seconds per request attempt")
    p.add_argument("--poll", type=seconds, default=1.0, help="--url: seconds between looks at a job")
    p.add_argument("--engine", metavar="NAME", help="in-process: the engine (default HYOCR_ENGINE, rapidocr)")
    p.add_argument("--model", help="in-process: the model id or path")
    p.add_argument("--set", dest="sets", action="append", metavar="KEY=VALUE",
                   help="in-process: any hyocr setting, e.g. --set pdf_detector_dpi=100 (repeatable)")
    p.add_argument("--workers", type=int, default=2, help="documents read at once")
    p.add_argument("--max-retries", dest="max_retries", type=int, default=2,
                   help="a failed document is read again by a rerun, up to 1 + this many attempts in all")
    return p


def main(args: argparse.Namespace) -> int:
    """Exit status: 0 every document read, 1 some failed, 2 nothing could be scored (bad SET or option)."""
    try:
        return compare_main(args) if args.set == "compare" else run_main(args)
    except EvalError as exc:
        print(f"hyocr eval: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # a path the filesystem refuses (a name over 255 bytes, a file where a folder goes)
        from ..batch.plan import shown

        where = f"{shown(exc.filename)}: " if exc.filename else ""
        print(f"hyocr eval: {where}{exc.strerror or type(exc).__name__}", file=sys.stderr)
        return 2


def _pairs(items: list[str] | None, flag: str) -> dict[str, str]:
    out = {}
    for item in items or ():
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise EvalError(f"{flag} {item!r}: expected KEY=VALUE")
        out[key.strip()] = value.strip()
    return out


PLOT_FORMATS = (".png", ".svg", ".pdf", ".jpg", ".jpeg")


def _check_destinations(*paths: str | Path | None, inputs: tuple[str | Path, ...] = (), plot: str | None = None
                        ) -> None:
    """Before reading anything: a typo in a folder name must not cost a finished evaluation, and no file the
    command writes may be one it reads, or another it writes (each would silently replace the other)."""
    given = [Path(p) for p in (*paths, plot) if p]
    for path in given:
        if not path.parent.is_dir():
            raise EvalError(f"{path}: folder {path.parent} does not exist")
        if path.is_dir():
            raise EvalError(f"{path}: a folder; name a file")
    resolved = [p.resolve() for p in given]
    if len(set(resolved)) < len(resolved):
        raise EvalError("--output, --markdown and --plot must name different files")
    for source in inputs:
        if Path(source).resolve() in resolved:
            raise EvalError(f"{source}: is read by this command; write the report elsewhere")
    if plot and Path(plot).suffix.lower() not in PLOT_FORMATS:
        raise EvalError(f"--plot {plot}: a {', '.join(PLOT_FORMATS)} file")


def _reads_folder(output: Path, reads: Path | None) -> Path:
    """The results and resume state: --reads, or REPORT.reads beside a report file. A report written to a device
    or pipe (-o /dev/stdout) has no folder beside it to take (it would be made in /dev)."""
    from .report import is_stream

    if reads is None:
        if is_stream(output):
            raise EvalError(f"{output}: not a file (a device or pipe); give --reads DIR for the documents' results "
                            "and the resume state")
        reads = output.with_suffix(".reads")
    if reads.resolve() == output.resolve():
        raise EvalError(f"{output}: the report and the reads folder would be one path; name the report otherwise "
                        "or give --reads DIR")
    return reads


def _settings(args: argparse.Namespace):
    from ..bench import BenchError
    from ..bench.server import parse_sets
    from ..config import SettingsError, load_settings

    if args.url and (args.engine or args.model or args.sets):
        raise EvalError("--engine, --model and --set configure the engine read in-process; with --url, "
                        "configure that server instead")
    try:
        overrides: dict[str, Any] = dict(parse_sets(args.sets))
    except BenchError as exc:
        raise EvalError(str(exc)) from None
    overrides.update({k: v for k, v in (("engine", args.engine), ("model", args.model),
                                        ("default_max_tokens", args.max_tokens)) if v is not None})
    try:
        return load_settings(**overrides)
    except SettingsError as exc:
        raise EvalError(str(exc)) from None


def run_main(args: argparse.Namespace) -> int:
    from . import metrics, plot, report
    from .run import Job, evaluate

    if args.reports:
        raise EvalError("one SET at a time (reports side by side: hyocr eval compare A.json B.json ...)")
    if not args.output:
        raise EvalError("--output REPORT.json is required")
    if args.workers < 1 or args.max_retries < 0 or (args.limit is not None and args.limit < 1):
        raise EvalError("--workers and --limit must be >= 1, --max-retries >= 0")
    output = Path(args.output)
    _check_destinations(output, args.markdown, inputs=(args.set,), plot=args.plot)
    reads = _reads_folder(output, args.reads)  # before anything is read
    metrics.require()
    if args.plot:
        plot.require_matplotlib()
    settings = _settings(args)
    defaults = {"task": args.task, "fields": args.fields, "language": args.language, "question": args.question,
                "pages": args.pages, "max_tokens": args.max_tokens}
    from ..batch.pages import check as check_pages
    from ..errors import HyocrError
    from ..hunyuan.prompts import parse_task

    try:
        if args.task:
            parse_task(args.task)
        check_pages(args.pages)
    except HyocrError as exc:
        raise EvalError(exc.message) from None
    job = Job(args.set, output, reads, defaults, settings, truth=args.truth,
              url=args.url, api_key=args.api_key or os.environ.get("HYOCR_CLIENT_API_KEY"), timeout=args.timeout,
              poll=args.poll, workers=args.workers, max_retries=args.max_retries, fold_case=args.fold_case,
              label=args.label, limit=args.limit, omnidocbench_pdfs=args.omnidocbench_pdfs,
              filters=_pairs(args.filters, "--filter"),
              writes=tuple(Path(p) for p in (output, args.markdown, args.plot) if p))
    doc = _evaluate(evaluate, job)
    report.write_json(doc, output)
    text = report.markdown(doc)
    report.write_text(args.markdown, text)
    if args.plot:
        plot.plot([(report.run_name(doc), doc)], args.plot)
    # -o /dev/stdout: stdout is the report's, whole JSON; the summary goes to stderr
    print(text, file=sys.stderr if report.is_stdout(output) else sys.stdout)
    ops = doc["operational"]
    if not doc["scores"] and ops["documents"]["done"]:  # read, but no truth of a kind its task outputs
        print("hyocr eval: nothing was scored: no page's truth is of a kind its task outputs (text and blocks: "
              "text, spotting; markdown and tables: document; fields: extract); choose the task with --task",
              file=sys.stderr)
        return 1
    if stopped := ops.get("stopped"):
        print(f"hyocr eval: stopped early ({stopped.get('message')}): the documents not read are left out; "
              "run again to resume", file=sys.stderr)
    return 1 if ops["failures_total"] or ops["documents"]["done"] < ops["documents"]["total"] else 0


def _evaluate(evaluate: Any, job: Any) -> dict[str, Any]:
    from ..config import SettingsError
    from ..errors import HyocrError
    from ..observability.logs import setup_logging

    setup_logging("warning", "text")
    try:
        return asyncio.run(evaluate(job))
    except KeyboardInterrupt:  # the documents read are kept in the reads folder
        print(f"hyocr eval: interrupted; run the same command again to resume ({job.reads} keeps what was read)",
              file=sys.stderr)
        raise
    except SettingsError as exc:  # the engine: unknown, its extra not installed, a setting it needs
        raise EvalError(str(exc)) from None
    except HyocrError as exc:  # the engine could not start
        raise EvalError(exc.message if exc.public else "the engine failed to start (see the log above)") from None


def compare_main(args: argparse.Namespace) -> int:
    from . import compare, plot, report

    if len(args.reports) < 2:
        raise EvalError("compare needs at least two reports (the first is the baseline)")
    if args.output and args.markdown and Path(args.output).resolve() == Path(args.markdown).resolve():
        args.markdown = None  # the same comparison twice to one file
    _check_destinations(args.output, args.markdown, inputs=tuple(args.reports), plot=args.plot)
    if args.plot:
        plot.require_matplotlib()
    runs = compare.load_runs(args.reports)
    try:
        text = compare.markdown(runs)
    except (TypeError, KeyError, AttributeError, ValueError) as exc:  # a report edited by hand
        raise EvalError(f"a report holds values hyocr eval does not write (edited by hand?): "
                        f"{type(exc).__name__}: {exc}") from None
    for path in {args.output, args.markdown} - {None}:  # the comparison is markdown: either flag names its file
        report.write_text(path, text)
    if args.plot:
        plot.plot([(run.name, run.doc) for run in runs], args.plot)
    print(text)
    return 0
