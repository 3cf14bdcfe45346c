"""What the jobs layer costs, and what a long job does to online latency, on the CPU engine (rapidocr).

    python benchmarks/jobs_overhead.py [--documents 6] [--pages 4] [--rounds 2] [--long-pages 40]
        [--out benchmarks/results/cpu-jobs-rapidocr.json]

One `hyocr serve --engine rapidocr` (its own data folder), seeded scanned PDFs (page-size images with text,
`hyocr.bench.workload`, saved as PDFs by Pillow). In alternating rounds, the same documents are read
  - direct: POST /v1/ocr per document, two documents at a time (what a caller of the sync API would do);
  - jobs: POST /v1/jobs for every document, then poll until all succeeded and fetch the results;
and pages/s is reported for both, with ratio = jobs / direct. Then online latency: sequential /v1/ocr
card requests, idle, and while a job of --long-pages pages runs (p50, p95, and the job's pages/s).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "tests"))

from servers import free_port, wait_ready  # noqa: E402

from hyocr.bench.workload import Workload  # noqa: E402

PAGE = Workload("page", prompt="", max_tokens=0, fixed_output=False, seed=7)
CARD = Workload("card", prompt="", max_tokens=0, fixed_output=False, seed=8)


def scanned_pdf(first: int, pages: int) -> bytes:
    images = [PAGE.image(first + i) for i in range(pages)]
    buf = io.BytesIO()
    images[0].save(buf, "PDF", save_all=True, append_images=images[1:], resolution=150)
    return buf.getvalue()


def upload(client: httpx.Client, url: str, doc: bytes) -> dict:
    """A PDF as a multipart upload (base64 in JSON would add a third to a 40-page scan's bytes)."""
    r = client.post(url, files={"file": ("doc.pdf", doc, "application/pdf")}, data={"task": "text"})
    assert r.status_code in (200, 202), r.text
    return r.json()


def direct(client: httpx.Client, url: str, docs: list[str]) -> float:
    started = time.perf_counter()
    with ThreadPoolExecutor(2) as pool:
        bodies = list(pool.map(lambda d: upload(client, f"{url}/v1/ocr", d), docs))
    assert all(len(b["pages"]) for b in bodies), bodies[0]
    return time.perf_counter() - started


def jobs(client: httpx.Client, url: str, docs: list[str]) -> float:
    started = time.perf_counter()
    ids = [upload(client, f"{url}/v1/jobs", d)["id"] for d in docs]
    waiting = set(ids)
    while waiting:
        for job_id in list(waiting):
            status = client.get(f"{url}/v1/jobs/{job_id}").json()["status"]
            assert status in ("queued", "running", "succeeded"), status
            if status == "succeeded":
                waiting.discard(job_id)
        time.sleep(0.5)  # as a client would poll: a tight loop of GETs would take the engine's CPU
    for job_id in ids:
        assert client.get(f"{url}/v1/jobs/{job_id}/result").json()["pages"]
    return time.perf_counter() - started


def online_latency(client: httpx.Client, url: str, n: int) -> list[float]:
    out = []
    for i in range(n):
        t0 = time.perf_counter()
        r = client.post(f"{url}/v1/ocr", json={"image": CARD.data_url(i), "task": "text"})
        assert r.status_code == 200, r.text
        out.append(time.perf_counter() - t0)
    return out


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return round(values[min(len(values) - 1, int(q * len(values)))], 3)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--documents", type=int, default=6)
    ap.add_argument("--pages", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--long-pages", type=int, default=40)
    ap.add_argument("--online", type=int, default=20)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "cpu-jobs-rapidocr.json"))
    args = ap.parse_args()

    port = free_port()
    data = tempfile.mkdtemp(prefix="hyocr-bench-jobs-")
    env = {**os.environ, "HYOCR_DATA_DIR": data, "HYOCR_UI": "false", "HYOCR_LOG_LEVEL": "warning"}
    proc = subprocess.Popen([sys.executable, "-m", "hyocr", "serve", "--engine", "rapidocr", "--port", str(port)],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    result: dict = {"hardware": f"{platform.machine()}, {os.cpu_count()} cores", "date": time.strftime("%Y-%m-%d"),
                    "engine": "rapidocr", "documents": args.documents, "pages_per_document": args.pages}
    try:
        wait_ready(proc, url)
        docs = [scanned_pdf(i * args.pages, args.pages) for i in range(args.documents)]
        pages = args.documents * args.pages
        with httpx.Client(timeout=600) as client:
            direct(client, url, docs[:1])  # warm-up: the render workers start on the first PDF
            jobs(client, url, docs[:1])
            rounds = []
            for n in range(args.rounds):  # alternating which goes first: drift hits both alike
                if n % 2:
                    j, d = jobs(client, url, docs), direct(client, url, docs)
                else:
                    d, j = direct(client, url, docs), jobs(client, url, docs)
                rounds.append({"direct_pages_per_s": round(pages / d, 3), "jobs_pages_per_s": round(pages / j, 3)})
                print(rounds[-1], flush=True)
            result["rounds"] = rounds
            result["ratio_jobs_to_direct"] = round(statistics.mean(r["jobs_pages_per_s"] / r["direct_pages_per_s"]
                                                                   for r in rounds), 3)
            idle = online_latency(client, url, args.online)
            long_doc = scanned_pdf(10_000, args.long_pages)
            job = upload(client, f"{url}/v1/jobs", long_doc)
            while client.get(f"{url}/v1/jobs/{job['id']}").json()["pages"]["done"] < 1:
                time.sleep(0.5)
            busy = online_latency(client, url, args.online)
            while (j := client.get(f"{url}/v1/jobs/{job['id']}").json())["status"] != "succeeded":
                time.sleep(0.5)
            job_s = j["finished_at"] - j["started_at"]
        result["online_card_latency_s"] = {
            "idle": {"p50": pct(idle, 0.5), "p95": pct(idle, 0.95)},
            "during_job": {"p50": pct(busy, 0.5), "p95": pct(busy, 0.95)},
        }
        result["long_job"] = {"pages": args.long_pages, "pages_per_s": round(args.long_pages / max(job_s, 1), 3)}
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    print(json.dumps(result, indent=1))
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(f"ratio={result['ratio_jobs_to_direct']}")


if __name__ == "__main__":
    main()
