"""Several processes opening one new jobs database at the same moment, as `--api-processes N` (or replicas
started together) do at start: each creates the tables it finds missing, and the losers of that race must
see the winner's tables, not stop the server ("table hyocr_jobs already exists" stopped a two-process server
at start before jobs/store.py tried again). Real processes, a real SQLite file and a real PostgreSQL."""

from __future__ import annotations

import subprocess
import sys
import time

from test_jobs_postgres import _pg_bin, postgres_url  # noqa: F401  (the module's PostgreSQL cluster)

OPEN_AT = """
import asyncio, sys, time
from hyocr.jobs.store import JobStore

async def main(url, at):
    store = JobStore(url)
    time.sleep(max(0.0, at - time.time()))  # every process at the same moment
    try:
        await store.open()
    finally:
        await store.close()

asyncio.run(main(sys.argv[1], float(sys.argv[2])))
print("opened")
"""


def _open_at_once(url: str, processes: int = 4) -> list[tuple[int, str]]:
    at = time.time() + 4.0  # after every interpreter has imported hyocr
    procs = [subprocess.Popen([sys.executable, "-c", OPEN_AT, url, str(at)], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for _ in range(processes)]
    return [(proc.wait(timeout=120), proc.stdout.read()[-400:]) for proc in procs]


def test_processes_opening_a_new_sqlite_database_at_once_all_open_it(tmp_path):
    for round_ in range(3):  # before the fix every round had a loser
        results = _open_at_once(f"sqlite+aiosqlite:///{tmp_path}/jobs-{round_}.db")
        assert all(code == 0 and "opened" in out for code, out in results), results


def test_processes_opening_a_new_postgres_database_at_once_all_open_it(postgres_url):  # noqa: F811
    port = postgres_url.rsplit(":", 1)[1].split("/", 1)[0]
    for round_ in range(2):
        name = f"race{round_}"
        subprocess.run([_pg_bin("createdb"), "-h", "127.0.0.1", "-p", port, "-U", "hyocr", name], check=True,
                       capture_output=True)
        results = _open_at_once(postgres_url.rsplit("/", 1)[0] + "/" + name)
        assert all(code == 0 and "opened" in out for code, out in results), results
