"""The bench reports: compare tables and ratios, sustained concurrency, error kinds, GPU memory parsing.

Synthetic result documents exercise the report code; the committed H200 results check it against the
ratios docs/benchmarks.md quotes.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from hyocr.bench import BenchError, compare, report
from hyocr.bench.gpu import PeakSampler, parse_gpu_memory
from hyocr.bench.load import LevelResult, error_kind
from hyocr.bench.server import parse_sets, public_settings
from hyocr.cli import build_parser

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"
GIB = 2**30


def level(c: int, rps: float, latency: float, *, requests: int = 100, errors: int = 0, oom: int = 0,
          memory: int | None = None) -> dict:
    breakdown = {"oom": oom} if oom else {}
    if errors > oom:
        breakdown["http_503"] = errors - oom
    return {"concurrency": c, "requests": requests, "errors": errors, "error_rate": errors / requests,
            "duration_s": requests / rps, "throughput_rps": rps, "output_tokens_per_s": rps * 150,
            "latency_mean_s": latency, "latency_p50_s": latency, "latency_p99_s": latency * 1.5,
            "ttft_p50_s": latency / 4, "ttft_p99_s": latency / 2, "prompt_tokens_mean": 691.0,
            "completion_tokens_mean": 150.0, "peak_gpu_memory_bytes": memory, "error_breakdown": breakdown,
            "peak_gpu_memory_source": "server_metrics" if memory else None}


def doc(label: str | None, levels: list[dict], *, max_tokens: int = 150, engine: str = "vllm") -> dict:
    meta = {"label": label, "target": "http://127.0.0.1:8000", "server": {"engine": engine, "model": "m"},
            "date": "2026-11-30T00:00:00+00:00", "gpu": "NVIDIA H200", "workload": {
                "name": "card", "image_size": [1024, 640], "prompt": "p", "max_tokens": max_tokens,
                "fixed_output": True, "seed": 1234}}
    return {"metadata": meta, "levels": levels, "sustained_concurrency": report.sustained(levels)}


def save(tmp_path: Path, name: str, document: dict) -> str:
    path = tmp_path / name
    path.write_text(json.dumps(document))
    return str(path)


def per_level(text: str) -> str:
    return text.split("### Per concurrency level")[1]


def row(text: str, *cells: str) -> list[str]:
    """The cells of the one table row that starts with these cells."""
    prefix = "| " + " | ".join(cells) + " |"
    matches = [line for line in text.splitlines() if line.startswith(prefix)]
    assert len(matches) == 1, (prefix, matches)
    return [c.strip() for c in matches[0].strip("|").split("|")]


# --- sustained concurrency and error rates ---

def test_sustained_is_the_highest_level_under_two_percent_errors():
    levels = [level(1, 1, 1), level(8, 5, 1, errors=1), level(32, 9, 2, errors=2), level(64, 9, 3, errors=30)]
    assert report.sustained(levels) == 8  # 1% passes; exactly 2% does not
    assert report.sustained([level(4, 1, 1, errors=50)]) is None


def test_files_without_error_rate_get_it_from_the_counts(tmp_path):
    legacy = level(8, 5, 1, requests=40, errors=4)
    del legacy["error_rate"], legacy["peak_gpu_memory_source"]
    loaded = report.load(save(tmp_path, "old.json", doc("old", [legacy])))
    assert loaded["levels"][0]["error_rate"] == pytest.approx(0.1)
    assert report.sustained(loaded["levels"]) is None


def test_level_result_derives_error_rate_and_keeps_old_callers_meaning():
    fields = {"concurrency": 4, "requests": 50, "errors": 3, "duration_s": 1.0, "throughput_rps": 47.0,
              "output_tokens_per_s": 0, "latency_mean_s": 0.1, "latency_p50_s": 0.1, "latency_p99_s": 0.2,
              "ttft_p50_s": None, "ttft_p99_s": None, "prompt_tokens_mean": 0, "completion_tokens_mean": 0}
    assert LevelResult(**fields, peak_gpu_memory_bytes=None).as_dict()["error_rate"] == 0.06
    # benchmarks/raw_vllm.py measures with nvidia-smi and predates the source field
    assert LevelResult(**fields, peak_gpu_memory_bytes=GIB).peak_gpu_memory_source == "nvidia-smi"
    measured = LevelResult(**fields, peak_gpu_memory_bytes=GIB, peak_gpu_memory_source="server_metrics")
    assert measured.as_dict()["peak_gpu_memory_source"] == "server_metrics"


@pytest.mark.parametrize(("status", "body", "kind"), [
    (500, '{"error": {"message": "CUDA out of memory. Tried to allocate 2.00 GiB", "type": "engine_error"}}', "oom"),
    (503, '{"error": {"message": "engine failed", "type": "service_unavailable", "code": "out_of_memory"}}', "oom"),
    (500, '{"object": "error", "message": "torch.OutOfMemoryError: ...", "type": "InternalServerError"}', "oom"),
    (503, '{"error": {"message": "the server is at capacity", "code": "overloaded"}}', "http_503"),
    (400, '{"error": {"message": "image too large: would run out of memory"}}', "http_400"),  # a client error
    (None, '{"message": "vLLM generation failed: OutOfMemoryError", "type": "engine_error"}', "oom"),
    (None, '{"message": "internal error (request id r1)", "type": "engine_error"}', "engine_error"),
    (500, "room temperature", "http_500"),
])
def test_error_kinds_count_engine_out_of_memory_as_oom(status, body, kind):
    assert error_kind(status, body) == kind


# --- GPU memory ---

def test_gpu_memory_is_summed_over_devices_from_the_metrics_text():
    text = (
        "# HELP hyocr_gpu_memory_used_bytes GPU memory in use\n# TYPE hyocr_gpu_memory_used_bytes gauge\n"
        'hyocr_gpu_memory_used_bytes{gpu="0"} 3.221225472e+09\nhyocr_gpu_memory_used_bytes{gpu="1"} 1073741824\n'
        "# HELP hyocr_gpu_memory_total_bytes GPU memory\n# TYPE hyocr_gpu_memory_total_bytes gauge\n"
        'hyocr_gpu_memory_total_bytes{gpu="0"} 1.5e+11\n'
        "# TYPE hyocr_requests_in_flight gauge\nhyocr_requests_in_flight 3\n"
    )
    assert parse_gpu_memory(text) == 4 * GIB
    assert parse_gpu_memory("# TYPE hyocr_requests_in_flight gauge\nhyocr_requests_in_flight 3\n") is None


def test_peak_sampler_keeps_the_largest_reading_and_reads_once_more_at_the_end():
    readings = iter([2 * GIB, 7 * GIB, None, 5 * GIB, 1 * GIB])

    async def read():
        return next(readings, 0)

    async def level(seconds):
        async with PeakSampler(read, interval=0.01) as sampler:
            await asyncio.sleep(seconds)
        return sampler.peak

    assert asyncio.run(level(0.2)) == 7 * GIB
    readings = iter([3 * GIB])  # a level shorter than the interval still gets a figure from the final read
    assert asyncio.run(level(0)) == 3 * GIB

    async def nothing():
        return None

    async def unmeasured():
        async with PeakSampler(nothing, interval=0.01) as sampler:
            await asyncio.sleep(0.03)
        return sampler.peak

    assert asyncio.run(unmeasured()) is None


# --- the run report ---

def test_run_markdown_shows_error_rates_oom_and_the_memory_source():
    text = report.markdown(doc("hyocr-vllm", [level(1, 2.9, 0.34, memory=129 * GIB),
                                              level(64, 20.0, 3.1, errors=4, oom=3, memory=130 * GIB)]))
    assert row(text, "1")[2:4] == ["0.0%", "2.90"]
    assert row(text, "64")[2] == "4.0% (3 OOM)"
    assert row(text, "64")[-1] == "130.0"
    assert "Highest concurrency with < 2% errors: 1" in text
    assert "Errors at concurrency 64: http_503 1, oom 3" in text
    assert "Peak GPU memory from: server_metrics" in text


# --- compare ---

def test_compare_ratios_per_level_and_dashes_for_levels_one_run_lacks(tmp_path):
    base = doc("raw", [level(1, 2.0, 0.5, memory=100 * GIB), level(8, 10.0, 0.8, memory=100 * GIB),
                       level(32, 16.0, 2.0, memory=101 * GIB)])
    other = doc("hyocr", [level(1, 3.0, 0.4, memory=90 * GIB), level(8, 20.0, 0.4, memory=92 * GIB),
                          level(64, 30.0, 2.0, errors=5, oom=5, memory=95 * GIB)])
    runs = compare.load_runs([save(tmp_path, "a.json", base), save(tmp_path, "b.json", other)])
    full = compare.markdown(runs)
    text = per_level(full)

    assert row(text, "hyocr", "1")[-2:] == ["1.50x", "0.80x"]
    assert row(text, "hyocr", "8")[-2:] == ["2.00x", "0.50x"]
    assert row(text, "raw", "8")[-2:] == ["baseline", "baseline"]
    assert row(text, "hyocr", "32")[2:] == ["-"] * 8  # only the baseline ran 32
    assert row(text, "raw", "64")[2:] == ["-"] * 8
    assert row(text, "hyocr", "64")[2:8] == ["30.00", "2.000", "3.000", "0.500", "95.0", "5.0% (5 OOM)"]
    assert row(text, "hyocr", "64")[-2:] == ["-", "-"]  # no baseline at 64

    summary = full.split("### Summary")[1].split("### Per concurrency level")[0]
    assert row(summary, "raw") == ["raw", "32", "16.00 at 32", "baseline", "101.0", "0.0%"]
    # sustained 8 (64 had 5% errors); the ratio at the highest level both ran
    assert row(summary, "hyocr") == ["hyocr", "8", "30.00 at 64", "2.00x at 8", "95.0", "1.7% (5 OOM)"]
    assert "raw (baseline)" in full.split("### Summary")[0]
    assert "Workloads differ" not in full


def test_compare_warns_when_workloads_differ_and_names_duplicate_labels_by_file(tmp_path):
    runs = compare.load_runs([save(tmp_path, "first.json", doc("vllm", [level(1, 1, 1)])),
                              save(tmp_path, "second.json", doc("vllm", [level(1, 2, 1)], max_tokens=64))])
    assert [r.name for r in runs] == ["vllm (first)", "vllm (second)"]
    text = compare.markdown(runs)
    assert "**Workloads differ**" in text and "64 output tokens" in text
    assert row(per_level(text), "vllm (second)", "1")[-2:] == ["2.00x", "1.00x"]


def test_compare_reproduces_the_h200_ratios_in_the_docs():
    runs = compare.load_runs([str(RESULTS / "h200-card-raw-vllm.json"), str(RESULTS / "h200-card-hyocr-vllm.json"),
                              str(RESULTS / "h200-card-hyocr-transformers.json")])
    text = per_level(compare.markdown(runs))
    # docs/benchmarks.md: hyocr vllm / raw vLLM = 1.10, 1.01, 1.23, 1.70 at concurrency 1, 8, 32, 64
    assert [row(text, "hyocr-vllm", c)[-2] for c in ("1", "8", "32", "64")] == ["1.10x", "1.01x", "1.23x", "1.70x"]
    assert row(text, "hyocr-transformers", "64")[2] == "2.47"


@pytest.mark.parametrize(("content", "message"), [
    (None, "no such file"),
    ("{not json", "not JSON"),
    ('{"levels": []}', "not a hyocr bench result"),
    ('{"metadata": {"workload": {}}, "levels": [{"concurrency": 1}]}', "level 0 lacks requests"),
    ("[1, 2]", "not a hyocr bench result"),
    # the right keys with the wrong types (another tool's file): a one-line reason, not a TypeError
    ('{"metadata": {"workload": {}}, "levels": [{"concurrency": "x", "requests": "a", "errors": {}, '
     '"throughput_rps": "fast", "latency_mean_s": null, "latency_p99_s": [1]}]}',
     "level 0: concurrency, requests, errors, throughput_rps, latency_mean_s, latency_p99_s not a number"),
    ('{"metadata": {"workload": {}}, "levels": [{"concurrency": 1, "requests": 1, "errors": true, '
     '"throughput_rps": 1.0, "latency_mean_s": 1.0, "latency_p99_s": 1.0}]}', "level 0: errors not a number"),
])
def test_unreadable_result_files_are_named_with_the_reason(tmp_path, content, message):
    path = tmp_path / "r.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(BenchError, match=message) as caught:
        report.load(str(path))
    assert str(path) in str(caught.value)


# --- the command line ---

def test_bench_parses_as_before_and_compare_is_its_own_path():
    args = build_parser().parse_args(["bench", "--url", "http://h:8000", "--concurrency", "1,8", "--output", "r.json"])
    assert (args.bench_command, args.url, args.engine, args.concurrency, args.output) == (
        None, "http://h:8000", None, "1,8", "r.json")
    args = build_parser().parse_args(["bench", "compare", "a.json", "b.json", "--output", "c.md", "--plot", "c.png"])
    assert (args.bench_command, args.files, args.output, args.plot) == ("compare", ["a.json", "b.json"], "c.md", "c.png")
    with pytest.raises(SystemExit):
        build_parser().parse_args(["bench", "--url", "http://h", "--engine", "fake"])


def test_set_accepts_known_settings_only():
    assert parse_sets(["max-num-seqs=32", "api_keys=a=b"]) == {"max_num_seqs": "32", "api_keys": "a=b"}
    with pytest.raises(BenchError, match="not a hyocr setting"):
        parse_sets(["max_num_seq=32"])
    with pytest.raises(BenchError, match="KEY=VALUE"):
        parse_sets(["max_num_seqs"])


def test_recorded_engine_settings_mask_secrets_only():
    shown = public_settings("vllm", "m", {"api_keys": "k1", "upstream_key": "k2", "max_tokens_limit": "512"})
    assert shown == {"engine": "vllm", "model": "m", "api_keys": "***", "upstream_key": "***",
                     "max_tokens_limit": "512"}
