"""``hyocr bench`` end to end: the real CLI against hyocr started in-process (--engine fake) and against
a live server (--url), its JSON, markdown and PNG outputs, ``bench compare``, peak GPU memory from the
server's /metrics (a GPU gauge registered on the app's own registry) or nvidia-smi, and OOM counting."""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

import pytest
from PIL import Image
from prometheus_client.core import GaugeMetricFamily

from hyocr.bench.gpu import GPU_MEMORY_METRIC
from hyocr.cli import main
from hyocr.engines.fake import FakeEngine
from hyocr.errors import ServiceUnavailable

GIB = 2**30
SMALL = ["--workload", "card", "--concurrency", "1,2", "--requests", "4", "--max-tokens", "16", "--warmup", "1"]


class FakeGpu:
    """What GpuCollector exports on a two-GPU server."""

    def collect(self):
        used = GaugeMetricFamily(GPU_MEMORY_METRIC, "GPU memory in use", labels=["gpu"])
        used.add_metric(["0"], 3 * GIB)
        used.add_metric(["1"], 1 * GIB)
        yield used


class OomEngine(FakeEngine):
    """Every second request fails as a model engine out of GPU memory does."""

    calls = 0

    async def generate(self, request):
        self.calls += 1
        if self.calls % 2 == 0:
            raise ServiceUnavailable("CUDA out of memory. Tried to allocate 2.00 GiB", code="out_of_memory")
        async for chunk in super().generate(request):
            yield chunk


def bench(*argv: str) -> int:
    return main(["bench", *argv])


def read(path: Path) -> dict:
    return json.loads(path.read_text())


@pytest.fixture
def no_gpu_tools(monkeypatch, tmp_path):
    """A PATH without nvidia-smi, so the test does not depend on the machine having a GPU."""
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))


def test_engine_fake_run_writes_json_markdown_and_plot(tmp_path, capsys):
    out, md, png = tmp_path / "fake.json", tmp_path / "fake.md", tmp_path / "fake.png"
    assert bench("--engine", "fake", "--model", "token_delay=0.001", "--set", "max_concurrency=8", *SMALL,
                 "--label", "fake", "--output", str(out), "--markdown", str(md), "--plot", str(png)) == 0

    doc = read(out)
    meta = doc["metadata"]
    assert meta["target"] == "engine:fake" and meta["label"] == "fake"
    assert meta["server"]["engine"] == "fake" and meta["server"]["model"] == "fake-ocr"
    assert meta["engine_settings"] == {"engine": "fake", "model": "token_delay=0.001", "max_concurrency": "8"}
    from importlib.metadata import version
    assert meta["versions"]["httpx"] == version("httpx") and meta["hyocr"]  # the versions that explain a result
    assert meta["workload"] == {"name": "card", "image_size": [1024, 640], "prompt": "提取图中的文字。",
                                "max_tokens": 16, "fixed_output": False, "seed": 1234}
    assert [lv["concurrency"] for lv in doc["levels"]] == [1, 2]
    for lv in doc["levels"]:
        assert (lv["requests"], lv["errors"], lv["error_rate"], lv["error_breakdown"]) == (4, 0, 0.0, {})
        assert lv["throughput_rps"] > 0 and 0 < lv["latency_mean_s"] <= lv["latency_p99_s"]
        assert lv["ttft_p50_s"] is not None and lv["completion_tokens_mean"] > 0
        assert "peak_gpu_memory_source" in lv
    assert doc["sustained_concurrency"] == 2

    printed = capsys.readouterr().out
    assert md.read_text().strip() == printed.strip()
    assert "| 2 | 4 | 0.0% |" in printed and "Highest concurrency with < 2% errors: 2" in printed
    with Image.open(png) as image:
        assert image.format == "PNG" and image.width > 0 and image.height > 0
        image.load()  # the whole file decodes


def test_url_run_reads_peak_gpu_memory_from_authenticated_metrics_then_compares(
        fake_server_factory, tmp_path, capsys, no_gpu_tools):
    server = fake_server_factory(ui=False, api_keys="bench-key")
    server.app.state.metrics.registry.register(FakeGpu())
    first, second = tmp_path / "a.json", tmp_path / "b.json"
    assert bench("--url", server.url, *SMALL, "--api-key", "bench-key", "--label", "first", "--output", str(first)) == 0
    assert bench("--url", server.url + "/v1", *SMALL, "--concurrency", "2,4", "--api-key", "bench-key",
                 "--label", "second", "--output", str(second)) == 0
    a, b = read(first), read(second)
    assert a["metadata"]["target"] == server.url and a["metadata"]["server"]["engine"] == "fake"
    for lv in a["levels"] + b["levels"]:
        assert lv["peak_gpu_memory_bytes"] == 4 * GIB
        assert lv["peak_gpu_memory_source"] == "server_metrics"
    capsys.readouterr()

    md, png = tmp_path / "compare.md", tmp_path / "compare.png"
    assert bench("compare", str(first), str(second), "--output", str(md), "--plot", str(png)) == 0
    text = capsys.readouterr().out
    assert md.read_text().strip() == text.strip()
    level_rows = text.split("### Per concurrency level")[1].splitlines()
    ratio = b["levels"][0]["throughput_rps"] / a["levels"][1]["throughput_rps"]
    assert any(r.startswith("| second | 2 |") and r.endswith(f"| {ratio:.2f}x | "
               f"{b['levels'][0]['latency_mean_s'] / a['levels'][1]['latency_mean_s']:.2f}x |") for r in level_rows)
    assert "| first | 4 | - | - | - | - | - | - | - | - |" in level_rows
    assert "| second | 1 | - | - | - | - | - | - | - | - |" in level_rows
    assert "| first (baseline) |" in text
    with Image.open(png) as image:
        assert image.format == "PNG" and image.width > 0


def test_a_level_spread_over_client_processes_counts_every_request_once(
        fake_server_factory, tmp_path, no_gpu_tools):
    server = fake_server_factory(ui=False)
    out = tmp_path / "clients.json"
    assert bench("--url", server.url, "--workload", "card", "--concurrency", "3,6", "--requests", "7,13",
                 "--clients", "2", "--max-tokens", "8", "--warmup", "0", "--output", str(out)) == 0
    levels = read(out)["levels"]
    assert [(lv["clients"], lv["requests"], lv["errors"]) for lv in levels] == [(2, 7, 0), (2, 13, 0)]
    assert all(lv["completion_tokens_mean"] > 0 and lv["ttft_p50_s"] is not None for lv in levels)
    # the server saw exactly those requests, each once (its own counter, not the client's)
    metrics = __import__("httpx").get(server.url + "/metrics").text
    line = next(x for x in metrics.splitlines()
                if x.startswith("hyocr_requests_total{") and "chat/completions" in x and 'status="200"' in x)
    assert float(line.rsplit(" ", 1)[1]) == 20


def test_automatic_client_processes_follow_the_concurrency():
    from hyocr.bench.load import client_processes

    assert [client_processes(c) for c in (1, 8, 16, 17, 32, 64)] == [1, 1, 1, 2, 2, 4]
    assert client_processes(64, requested=1) == 1 and client_processes(2, requested=8) == 2


def test_metrics_without_a_gpu_gauge_fall_back_to_nvidia_smi(fake_server_factory, tmp_path, monkeypatch, capsys):
    tools = tmp_path / "bin"
    tools.mkdir()
    smi = tools / "nvidia-smi"
    smi.write_text('#!/bin/sh\ncase "$*" in *name*) echo "Test GPU";; *) printf "1000\\n24\\n";; esac\n')
    smi.chmod(smi.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{tools}{os.pathsep}{os.environ['PATH']}")
    server = fake_server_factory(ui=False)
    out = tmp_path / "smi.json"
    assert bench("--url", server.url, *SMALL, "--output", str(out)) == 0
    doc = read(out)
    assert doc["metadata"]["gpu"] == "Test GPU"
    for lv in doc["levels"]:
        assert (lv["peak_gpu_memory_bytes"], lv["peak_gpu_memory_source"]) == (1024 * 2**20, "nvidia-smi")
    assert "peak GPU memory: from local nvidia-smi" in capsys.readouterr().err


def test_metrics_that_need_a_key_are_not_measured_without_one(fake_server_factory, tmp_path, capsys, monkeypatch,
                                                              no_gpu_tools):
    server = fake_server_factory(ui=False, api_keys="k")
    server.app.state.metrics.registry.register(FakeGpu())
    out = tmp_path / "r.json"
    with monkeypatch.context() as env:  # the key from the environment reaches the API and --metrics-url
        env.setenv("HYOCR_CLIENT_API_KEY", "k")
        assert bench("--url", server.url, *SMALL, "--metrics-url", f"{server.url}/metrics?from=bench",
                     "--output", str(out)) == 0
    assert read(out)["levels"][0]["peak_gpu_memory_source"] == "server_metrics"
    capsys.readouterr()
    assert bench("--url", server.url, *SMALL, "--output", str(out)) == 1  # every request 401
    assert "HTTP 401 (pass --api-key" in capsys.readouterr().err
    lv = read(out)["levels"][0]
    assert lv["error_breakdown"] == {"http_401": 4} and lv["error_rate"] == 1.0
    assert (lv["peak_gpu_memory_bytes"], lv["peak_gpu_memory_source"]) == (None, None)


def test_engine_out_of_memory_is_counted_as_oom(fake_server_factory, tmp_path, capsys, no_gpu_tools):
    server = fake_server_factory(OomEngine(), ui=False)
    out, md = tmp_path / "oom.json", tmp_path / "oom.md"
    assert bench("--url", server.url, *SMALL, "--warmup", "0", "--output", str(out), "--markdown", str(md)) == 0
    doc = read(out)
    for lv in doc["levels"]:
        assert lv["error_breakdown"] == {"oom": 2} and lv["error_rate"] == 0.5 and lv["errors"] == 2
    assert doc["sustained_concurrency"] is None
    assert "| 1 | 4 | 50.0% (2 OOM) |" in md.read_text()


def test_bad_inputs_exit_2_with_one_line_and_no_traceback(tmp_path, capsys):
    broken = tmp_path / "broken.json"
    broken.write_text("{")
    cases = [
        (["compare", str(broken), str(broken)], f"{broken}: not JSON"),
        (["compare", str(tmp_path / "missing.json"), str(broken)], "missing.json: no such file"),
        (["--concurrency", "1"], "give --url URL"),
        (["--engine", "no-such-engine"], "unknown engine 'no-such-engine'"),
        (["--engine", "fake", "--set", "max_queue=-1"], "max_queue"),
        (["--url", "http://127.0.0.1:9", "--output", str(tmp_path / "nope" / "r.json")], "does not exist"),
    ]
    for argv, message in cases:
        assert bench(*argv) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith("hyocr bench: ") and message in err and "Traceback" not in err, err


def test_missing_matplotlib_is_an_install_hint(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import fails, as when the extra is not installed
    runs = [tmp_path / "a.json", tmp_path / "b.json"]
    for path in runs:
        path.write_text(json.dumps({"metadata": {"workload": {}}, "levels": []}))
    assert bench("compare", *map(str, runs), "--plot", str(tmp_path / "c.png")) == 2
    assert "pip install 'hyocr[bench]'" in capsys.readouterr().err
    assert bench("--url", "http://127.0.0.1:9", "--plot", str(tmp_path / "r.png")) == 2  # before any request
    assert "hyocr[bench]" in capsys.readouterr().err
