"""API_PROCESSES: the settings it needs, each process's share of the limits, metrics summed over
processes, and a process that cannot restart its shared engine exiting instead.

The real thing (hyocr serve --api-processes 2 on vLLM with a tiny checkpoint) is in
tests/models/test_shared_engine_core.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
import socket
import subprocess
import sys
import textwrap

import pytest

from hyocr.config import SettingsError, load_settings
from hyocr.engines.base import SharedEngine
from hyocr.engines.fake import FakeEngine
from hyocr.engines.vllm.shared_core import SharedEngineCore
from hyocr.pipeline.service import OcrService
from hyocr.pipeline.supervisor import EngineSupervisor
from hyocr.server.shares import close_in_forks, process_settings


def test_several_api_processes_need_the_vllm_engine():
    with pytest.raises(SettingsError, match="api_processes > 1 needs the vllm engine"):
        load_settings(engine="rapidocr", api_processes=2)
    assert load_settings(engine="vllm", model="m", api_processes=4).api_processes == 4
    assert load_settings(engine="rapidocr").api_processes == 1


def test_rate_limits_across_processes_need_a_shared_store():
    with pytest.raises(SettingsError, match="shared store"):
        load_settings(engine="vllm", model="m", api_processes=2, rate_limit="10/second")
    shared = load_settings(engine="vllm", model="m", api_processes=2, rate_limit="10/second",
                           rate_limit_storage="redis://127.0.0.1:6379")
    assert shared.rate_limit == "10/second"


def test_each_process_gets_its_share_of_the_limits():
    settings = load_settings(engine="vllm", model="m", api_processes=3, max_concurrency=64, max_queue=256,
                             metrics_port=9400)
    shares = [process_settings(settings, i, 3) for i in range(3)]
    assert [s.max_concurrency for s in shares] == [22, 21, 21]  # exactly the total (ceil gave 66)
    assert [s.max_queue for s in shares] == [86, 85, 85]
    assert [s.metrics_port for s in shares] == [9400, None, None]  # one server for the separate port
    assert settings.max_concurrency == 64  # the original is untouched


@pytest.mark.parametrize("total", [1, 2, 3, 4, 5, 7, 63, 64, 65, 100, 256])
@pytest.mark.parametrize("count", [1, 2, 3, 4, 5, 8])
def test_the_shares_sum_to_exactly_the_setting_and_none_is_below_one(total, count):
    if total < count:
        with pytest.raises(SettingsError, match="at least api_processes"):
            load_settings(engine="vllm", model="m", api_processes=count, max_concurrency=total)
        return
    settings = load_settings(engine="vllm", model="m", api_processes=count, max_concurrency=total,
                             max_queue=total - 1)
    shares = [process_settings(settings, i, count) for i in range(count)]
    assert sum(s.max_concurrency for s in shares) == total and min(s.max_concurrency for s in shares) >= 1
    assert sum(s.max_queue for s in shares) == total - 1  # a queue share may be 0 (503 when full)
    assert max(s.max_concurrency for s in shares) - min(s.max_concurrency for s in shares) <= 1


def test_a_shared_engine_core_is_connected_to_once():
    core = SharedEngineCore({"client_index": 1, "client_count": 2, "input_address": "tcp://x"})
    assert (core.index, core.count) == (1, 2)
    core.connected = True  # as after the first start
    with pytest.raises(Exception, match="restarts as a whole"):
        core.connect({"model": "m"})


class _SharedFake(FakeEngine, SharedEngine):
    restartable = False


def test_an_engine_owned_by_the_parent_makes_the_process_exit_not_restart():
    engine = _SharedFake()
    supervisor = EngineSupervisor(engine, service=OcrService(engine))
    exits: list[int] = []
    supervisor.exit = exits.append  # os._exit in production
    assert asyncio.run(supervisor.restart("the readiness probe failed")) is False
    assert exits == [3] and engine.starts == 0 and supervisor.last_failure == "the readiness probe failed"


_PROCESS = textwrap.dedent("""
    import sys
    from hyocr.observability.metrics import Metrics

    class Admission:
        waiting, in_flight = 1, int(sys.argv[1])

    class Service:
        admission = Admission()

    metrics = Metrics(Service())
    metrics.observe("/v1/ocr", 200, 0.3, {"images": 2, "output_tokens": 10})
    metrics.refresh()
    if sys.argv[2] == "scrape":
        from prometheus_client import generate_latest
        sys.stdout.write(generate_latest(metrics.scrape_registry()).decode())
""")


def test_metrics_are_summed_over_processes(tmp_path):
    """Two processes record in prometheus_client's multiprocess mode; a scrape of a third reports the sums."""
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    for in_flight in ("3", "4"):
        subprocess.run([sys.executable, "-c", _PROCESS, in_flight, "record"], env=env, check=True)
    body = subprocess.run([sys.executable, "-c", _PROCESS, "5", "scrape"], env=env, check=True,
                          capture_output=True, text=True).stdout
    lines = {line.split(" ")[0]: float(line.split(" ")[1]) for line in body.splitlines()
             if line and not line.startswith("#")}
    assert lines['hyocr_requests_total{route="/v1/ocr",status="200"}'] == 3
    assert lines["hyocr_pages_total"] == 6
    assert lines["hyocr_output_tokens_total"] == 30
    assert lines['hyocr_request_duration_seconds_count{route="/v1/ocr"}'] == 3
    # livesum: the gauges of processes that are gone still count until vLLM's launcher removes them
    # with its directory; here all three wrote one value each.
    assert lines["hyocr_requests_in_flight"] == 12 and lines["hyocr_queue_length"] == 3


_ADMITTING = textwrap.dedent("""
    import asyncio, sys, time
    from hyocr.observability.metrics import Metrics
    from hyocr.pipeline.admission import Admission

    class Service:
        admission = Admission(max_concurrency=2, max_queue=4)

    async def main():
        metrics = Metrics(Service())  # never refreshed here: each change is written as it happens
        tickets = [await Service.admission.acquire() for _ in range(int(sys.argv[1]))]
        waiter = asyncio.ensure_future(Service.admission.acquire())  # no slot left: it waits
        await asyncio.sleep(0)
        print("admitted", flush=True)
        sys.stdin.readline()  # the scrape happens now
        tickets[0].release()  # the slot goes to the waiter: still two in flight, none waiting
        (await waiter).release()
        tickets[1].release()
        print("released", flush=True)
        sys.stdin.readline()

    asyncio.run(main())
""")


def test_admission_gauges_summed_over_processes_are_exact_at_any_moment(tmp_path):
    """Refreshed only once a second, a process's in-flight gauge still counted a request that had finished
    (counted in the requests total too): each change is written when it happens instead."""
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    scrape = textwrap.dedent("""
        from prometheus_client import CollectorRegistry, generate_latest, multiprocess
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
        print(generate_latest(registry).decode())
    """)

    def gauges() -> dict[str, float]:
        body = subprocess.run([sys.executable, "-c", scrape], env=env, check=True, capture_output=True,
                              text=True).stdout
        return {line.split(" ")[0]: float(line.split(" ")[1]) for line in body.splitlines()
                if line.startswith(("hyocr_requests_in_flight", "hyocr_queue_length"))}

    proc = subprocess.Popen([sys.executable, "-c", _ADMITTING, "2"], env=env, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "admitted"
        assert gauges() == {"hyocr_requests_in_flight": 2, "hyocr_queue_length": 1}
        proc.stdin.write("\n")
        proc.stdin.flush()
        assert proc.stdout.readline().strip() == "released"
        assert gauges() == {"hyocr_requests_in_flight": 0, "hyocr_queue_length": 0}
        proc.stdin.write("\n")
        proc.stdin.flush()
        assert proc.wait(timeout=30) == 0
    finally:
        proc.kill()


def test_a_killed_start_attempt_leaves_no_zombie():
    import signal
    import time
    from types import SimpleNamespace

    import psutil

    from hyocr.server.processes import Launched

    proc = multiprocessing.get_context("spawn").Process(target=time.sleep, args=(60,))
    proc.start()
    os.kill(proc.pid, signal.SIGKILL)  # what vLLM's shutdown does to a straggler, without waiting
    Launched(engines=SimpleNamespace(processes=[proc])).reap()
    assert proc.exitcode == -signal.SIGKILL
    assert proc.pid not in [p.pid for p in psutil.Process().children()]


def test_a_launch_that_fails_half_way_is_stopped_and_not_retried(monkeypatch):
    """The engine core dies while loading (a bad checkpoint, no memory): what was started is stopped,
    and the outcome is a failure, not a start to try again (that would load the model three times)."""
    from hyocr.server import processes as vllm_frontends

    stopped = []

    class Manager:
        processes = ()

        def shutdown(self, timeout=None):
            stopped.append(timeout)

    def launch(launched, *args, **kwargs):
        launched.engines = Manager()
        launched.keep.append(object())
        raise RuntimeError("Engine core initialization failed")

    monkeypatch.setattr(vllm_frontends, "engine_config", lambda *a: None)
    monkeypatch.setattr(vllm_frontends, "_launch", launch)
    settings = load_settings(engine="vllm", model="m", api_processes=2)
    outcome = vllm_frontends._run_once({}, 2, "http://x", (None, None), settings, lambda: False)
    assert outcome == "failed" and stopped == [None]


def test_ready_waits_for_every_api_process():
    """Until each process has had its first answer, the parent may start them all again: /ready says so
    (503), while the supervisor, which probes the engine itself, sees a healthy engine and leaves it be."""
    import httpx
    from servers import LiveServer

    class Peered(FakeEngine, SharedEngine):
        peers = False

        def peers_ready(self) -> bool:
            return self.peers

    engine = Peered()
    server = LiveServer(load_settings(engine="fake"), engine).start()
    try:
        first = httpx.get(server.url + "/ready", timeout=10)
        assert first.status_code == 503
        assert first.json()["reason"] == "waiting for the server's other API processes"
        assert asyncio.run(server.app.state.supervisor.healthy()) is True
        engine.peers = True
        assert httpx.get(server.url + "/ready", timeout=10).status_code == 200
    finally:
        server.stop()


def test_all_up_counts_the_front_ends_the_parent_heard_from():
    import multiprocessing

    counter = multiprocessing.get_context("spawn").Value("i", 0)
    core = SharedEngineCore({"client_index": 0, "client_count": 2}, ready_count=counter)
    assert not core.all_up
    counter.value = 2
    assert core.all_up
    assert SharedEngineCore({}).all_up  # a lone process has no peers to wait for


def test_the_client_state_note_never_raises():
    core = SharedEngineCore({"client_index": 0, "client_count": 2})
    assert core.client_state() == {}  # not connected yet
    core.engine = type("Client", (), {"engine_core": object()})()  # a vLLM whose client lacks .resources
    assert "unreadable" in core.client_state()


def _held(inodes: set[int]) -> None:
    """In a forked child: exit with how many of ``inodes`` (sockets) it holds open."""
    held = set()
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            held.add(os.stat(f"/proc/self/fd/{fd}").st_ino)
    os._exit(len(held & inodes))


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="no /proc")
def test_a_forked_engine_core_does_not_hold_the_listening_socket():
    # vLLM forks its engine core on a GPU: there the socket would stay open after the front ends stopped,
    # with connections queued where nobody accepts them.
    sock = socket.create_server(("127.0.0.1", 0))
    try:
        close_in_forks(sock)
        inode = os.fstat(sock.fileno()).st_ino
        child = multiprocessing.get_context("fork").Process(target=_held, args=({inode},))
        child.start()
        child.join(30)
        assert child.exitcode == 0
    finally:
        sock.close()
