"""/metrics: exact counters, the documented metric names, and what the dashboard queries."""

from __future__ import annotations

import base64
import json
import re
import time
from pathlib import Path

import requests
from imaging import card
from prometheus_client.parser import text_string_to_metric_families

IMAGE = base64.b64encode(card().png()).decode()
ROOT = Path(__file__).resolve().parents[2]


def _scrape(server, headers=None) -> dict[tuple[str, tuple], float]:
    r = requests.get(f"{server.url}/metrics", headers=headers or {}, timeout=10)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    out = {}
    for family in text_string_to_metric_families(r.text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def _value(samples, name, **labels) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def test_counters_are_exact(fake_server_factory):
    server = fake_server_factory()
    before = _scrape(server)
    good, bad = 5, 3
    for _ in range(good):
        assert requests.post(f"{server.url}/v1/ocr", json={"image": IMAGE, "task": "text"}, timeout=30).ok
    for _ in range(bad):
        assert requests.post(f"{server.url}/v1/ocr", json={"image": "%%%", "task": "text"}, timeout=30).status_code == 400
    after = _scrape(server)
    delta = lambda name, **labels: _value(after, name, **labels) - _value(before, name, **labels)  # noqa: E731
    assert delta("hyocr_requests_total", route="/v1/ocr", status="200") == good
    assert delta("hyocr_requests_total", route="/v1/ocr", status="400") == bad
    assert delta("hyocr_errors_total", type="invalid_request") == bad
    assert delta("hyocr_pages_total") == good
    assert delta("hyocr_request_duration_seconds_count", route="/v1/ocr") == good + bad
    assert delta("hyocr_stage_duration_seconds_count", stage="engine") == good
    assert delta("hyocr_output_tokens_total") > 0 and delta("hyocr_time_to_first_token_seconds_count") == good
    assert _value(after, "hyocr_requests_in_flight") == 0 and _value(after, "hyocr_queue_length") == 0


def test_sheds_timeouts_and_loops_are_counted(fake_server_factory):
    server = fake_server_factory(rate_limit="2/minute", request_timeout=0.3)
    post = lambda q: requests.post(f"{server.url}/v1/ocr", json={"image": IMAGE, "task": "vqa", "question": q},  # noqa: E731
                                   timeout=30)
    assert post("[[fake:hang]]").status_code == 504
    assert post("[[fake:loop]]").json()["pages"][0]["finish_reason"] == "repetition"
    assert post("x").status_code == 429
    samples = _scrape(server)
    assert _value(samples, "hyocr_timeouts_total") == 1
    assert _value(samples, "hyocr_repetition_stops_total") == 1
    assert _value(samples, "hyocr_rejected_total", reason="rate_limit") == 1


def test_metrics_need_a_key_unless_public(fake_server_factory):
    closed = fake_server_factory(api_keys="k")
    assert requests.get(f"{closed.url}/metrics", timeout=5).status_code == 401
    assert _scrape(closed, {"Authorization": "Bearer k"})
    public = fake_server_factory(api_keys="k", public_metrics=True)
    text = requests.get(f"{public.url}/metrics", timeout=5).text
    assert "hyocr_requests_total" in text and "k" not in re.findall(r'key="([^"]*)"', text)


def test_metrics_keys_keep_tenants_out_of_metrics(fake_server_factory):
    """With METRICS_API_KEYS, /metrics answers the scrapers only: a tenant's key would show it every tenant's
    volumes. The scraper's key is no API key, and the rest of the API is as it was."""
    server = fake_server_factory(api_keys="tenant-a,tenant-b", metrics_api_keys="scraper-1")
    tenant, scraper = {"Authorization": "Bearer tenant-a"}, {"Authorization": "Bearer scraper-1"}
    assert requests.get(f"{server.url}/metrics", timeout=5).status_code == 401
    forbidden = requests.get(f"{server.url}/metrics", headers=tenant, timeout=5)
    assert forbidden.status_code == 403 and forbidden.json()["error"]["code"] == "metrics_forbidden"
    assert _scrape(server, scraper)
    assert requests.get(f"{server.url}/metrics", headers={"X-API-Key": "scraper-1"}, timeout=5).status_code == 200
    assert requests.get(f"{server.url}/v1/models", headers=tenant, timeout=5).status_code == 200
    assert requests.get(f"{server.url}/v1/models", headers=scraper, timeout=5).status_code == 401
    # without API keys, metrics keys change nothing else: callers stay one (anonymous) owner
    open_api = fake_server_factory(metrics_api_keys="scraper-1")
    assert requests.get(f"{open_api.url}/metrics", timeout=5).status_code == 401
    assert _scrape(open_api, scraper)
    job = requests.post(f"{open_api.url}/v1/jobs", json={"image": IMAGE, "task": "text"}, timeout=30).json()
    assert requests.get(f"{open_api.url}/v1/jobs/{job['id']}", timeout=5).status_code == 200


def test_no_gpu_gauges_without_a_gpu(fake_server_factory):
    text = requests.get(f"{fake_server_factory().url}/metrics", timeout=5).text
    assert "hyocr_gpu_memory_used_bytes" not in text  # absent, not faked


def test_dashboard_queries_only_exported_metrics(fake_server_factory):
    server = fake_server_factory()
    requests.post(f"{server.url}/v1/ocr", json={"image": IMAGE, "task": "text"}, timeout=30)
    text = requests.get(f"{server.url}/metrics", timeout=10).text
    exported = set()
    for family in text_string_to_metric_families(text):  # families with no samples yet count too
        suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_count", "_sum"]}.get(family.type, [""])
        exported |= {family.name + s for s in suffixes}
    exported |= {
        "hyocr_gpu_memory_used_bytes", "hyocr_gpu_memory_total_bytes", "hyocr_gpu_utilization_ratio"}  # GPU hosts
    dashboard = json.loads((ROOT / "deploy" / "grafana" / "hyocr.json").read_text())
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel.get("targets", [])]
    assert len(exprs) >= 10
    used = {m for expr in exprs for m in re.findall(r"\b(hyocr_[a-z_]+)", expr)}
    assert used and used <= exported, used - exported
    assert "hyocr" in (ROOT / "deploy" / "prometheus.yml").read_text()


def test_metrics_on_their_own_port(fake_server_factory):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = fake_server_factory(api_keys="k", metrics_port=port)
    requests.post(f"{server.url}/v1/ocr", json={"image": IMAGE, "task": "text"},
                  headers={"Authorization": "Bearer k"}, timeout=30)
    text = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    assert 'hyocr_requests_total{route="/v1/ocr",status="200"} 1.0' in text


def test_jobs_are_counted_by_status_pages_and_webhooks(fake_server_factory):
    server = fake_server_factory(webhook_secret="whsec_" + base64.b64encode(b"s" * 32).decode())
    job = requests.post(f"{server.url}/v1/jobs", json={"images": [IMAGE, IMAGE], "task": "text"}, timeout=30).json()
    deadline = time.monotonic() + 30
    while requests.get(f"{server.url}/v1/jobs/{job['id']}", timeout=10).json()["status"] != "succeeded":
        assert time.monotonic() < deadline
        time.sleep(0.1)
    deadline = time.monotonic() + 30
    while True:  # the status gauge is refreshed by the runner's dispatch loop
        text = requests.get(f"{server.url}/metrics", timeout=10).text
        if 'hyocr_jobs{status="succeeded"} 1.0' in text:
            break
        assert time.monotonic() < deadline, text
        time.sleep(0.2)
    assert "hyocr_job_pages_total 2.0" in text
    assert 'hyocr_jobs{status="queued"} 0.0' in text
    assert "hyocr_webhook_deliveries" in text


def test_batches_are_counted_by_status_and_their_routes_by_name(fake_server_factory):
    server = fake_server_factory()
    line = json.dumps({"custom_id": "one", "method": "POST", "url": "/v1/ocr", "body": {"image": IMAGE, "task": "text"}})
    file_id = requests.post(f"{server.url}/v1/files", files={"file": ("in.jsonl", line.encode())},
                            data={"purpose": "batch"}, timeout=30).json()["id"]
    batch = requests.post(f"{server.url}/v1/batches", json={"input_file_id": file_id, "endpoint": "/v1/ocr",
                                                             "completion_window": "24h"}, timeout=30).json()
    deadline = time.monotonic() + 60
    while True:  # the status gauge is refreshed by the runner's dispatch loop
        status = requests.get(f"{server.url}/v1/batches/{batch['id']}", timeout=10).json()["status"]
        text = requests.get(f"{server.url}/metrics", timeout=10).text
        if status == "completed" and 'hyocr_batches{status="completed"} 1.0' in text:
            break
        assert time.monotonic() < deadline, (status, [x for x in text.splitlines() if "batches" in x])
        time.sleep(0.2)
    assert 'hyocr_batches{status="in_progress"} 0.0' in text
    assert 'hyocr_requests_total{route="/v1/files",status="200"} 1.0' in text
    assert 'route="/v1/batches/{batch_id}"' in text and 'route="other"' not in text
