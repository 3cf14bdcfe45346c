"""``API_PROCESSES=N`` (vLLM engine): N HTTP server processes sharing one vLLM engine core.

At concurrency 64 on an H200 one hyocr process is the bound, not the GPU (benchmarks/NOTES.md, 10):
HTTP and JSON, image decoding, the image processor's Python glue, vLLM's output handling
for every stream and the SSE all run under one GIL, while the engine core and the GPU wait. vLLM's
own answer is ``vllm serve --api-server-count N``: one engine core process, N front-end processes,
each an ``AsyncLLM`` client of the core over ZMQ. hyocr drives the same machinery (vLLM's v1 launcher
and process manager: the engine core, the ZMQ endpoints, process monitoring, shutdown in order) as
``run_multi_api_server`` does, with hyocr's server as the function each front end runs. It does not
import vLLM's OpenAI server (``vllm.entrypoints``), which needs packages hyocr does not.

Each process is a complete hyocr server (auth, limits, pipeline, metrics) on its own socket of the port's
SO_REUSEPORT group (Linux, shares.py; elsewhere all on one shared socket): the kernel hands each new connection
to one of them, spread evenly, where one shared socket lets the process woken first take a burst of them
(benchmarks/accept_spread.py). What has to be shared between them is:
- admission: ``MAX_CONCURRENCY`` and ``MAX_QUEUE`` are totals, split evenly between the processes;
- rate limits: counted in the store they name; memory:// would count per process, so Settings refuses
  it with N > 1;
- metrics: prometheus_client's multiprocess mode (vLLM sets ``PROMETHEUS_MULTIPROC_DIR``), so a
  scrape of any process reports the sums over all (observability/metrics.py);
- failures: the engine core belongs to the parent. A process whose engine fails exits non-zero, and
  the parent stops the whole server (vLLM's process monitor), for the orchestrator to restart.

Each API process's engine side (its client of the shared core) is engines/vllm/shared_core.py; the vLLM
launcher internals used here are in engines/vllm/compat.py.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import signal
import sys
import threading
from typing import TYPE_CHECKING, Any

from ..engines.vllm import compat
from ..engines.vllm.shared_core import SharedEngineCore, engine_config
from .shares import ForeignWatch, hold_port, join_group, process_settings

if TYPE_CHECKING:
    from ..config import Settings

log = logging.getLogger(__name__)
# A front end whose first calls get no answer in time (shared_core.FIRST_REPLY_TIMEOUT) exits, and the
# parent starts the engine core and all the front ends again, up to START_ATTEMPTS times: the guard
# against a core that stays silent at start.
START_ATTEMPTS = 3


def serve(settings: Settings) -> int:
    """The parent: size the engine once, start its core and N hyocr front ends, wait for them."""

    from vllm import __version__

    from ..engines.vllm.engine import VllmEngine

    from ..engines.vllm.cores import core_count

    if core_count(settings) > 1:  # several engine cores of hyocr's own: each API process owns some
        from .core_processes import serve as serve_own_cores

        return serve_own_cores(settings)
    count = settings.api_processes
    engine = VllmEngine.from_settings(settings)
    compat.apply_version_workarounds(__version__, v2_runner=engine.v2_runner_measured)
    compat.setup_multiprocess_metrics()  # before any front end starts: they inherit the directory
    kwargs = engine.prepare_args()  # the same final arguments for the core and every front end
    # vLLM waits this long for the front ends to drain after SIGTERM before it kills them.
    if "shutdown_timeout" in _engine_fields():
        kwargs.setdefault("shutdown_timeout", math.ceil(settings.drain_timeout) + 5)
    held, shared = hold_port(settings)  # a socket each in the port's SO_REUSEPORT group, else one shared
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
            outcome = _run_once(kwargs, count, listen, (held, shared), settings, lambda: stopping)
            if outcome != "start failed":
                return 0 if outcome == "stopped" else 1
            log.warning("an API process did not come up (its first call to the engine core got no answer): "
                        "starting the engine core and every API process again")
        log.error("the server did not start in %d attempts", START_ATTEMPTS)
        return 1
    finally:
        held.close()


def _run_once(kwargs: dict[str, Any], count: int, listen: str, port: tuple[Any, Any], settings: Settings,
              stopping: Any) -> str:
    """One engine core and its front ends, until they end: "stopped" (a requested, drained stop),
    "failed" (something died while serving, or the launch itself failed: a bad checkpoint or too little
    memory fails again) or "start failed" (a front end never had its first answer: worth a new start)."""
    import argparse
    import multiprocessing

    config = engine_config(kwargs, count, -1)  # rank -1: the launcher's view of all the processes
    ready = multiprocessing.get_context("spawn").Value("i", 0)  # front ends whose engine answered
    frontend_args = argparse.Namespace(hyocr_frontend=(settings, kwargs), hyocr_ready=ready)
    held, shared = port  # shares.hold_port: shared is None in a port group (each front end joins it)
    launched = Launched()
    done = threading.Event()
    try:
        try:
            _launch(launched, config, count, listen, shared, frontend_args,
                    log_stats=not kwargs.get("disable_log_stats"))
        except RuntimeError as exc:  # the core or a front end died before the engine was up
            log.error("the engine core or an API process failed to start: %s", exc)
            return "failed"
        if shared is None:  # the parent blocks below: another program in the port's group is looked for aside
            threading.Thread(target=_watch_group, args=(settings.port, launched, done), daemon=True).start()
        compat.wait_for_processes(*launched.processes)
        return "stopped"
    except SystemExit:
        return "stopped"
    except RuntimeError as exc:  # a front end or the engine core died: everything is stopped below
        log.error("server stopping: %s", exc)
        return "start failed" if ready.value < count and not stopping() else "failed"
    finally:
        done.set()
        if stopping():
            # The parent's copy of the listening socket: without it, once the front ends stop accepting, a
            # connection still in the backlog is refused at once instead of waiting out the drain for a reset.
            held.close()
        launched.stop(getattr(config, "shutdown_timeout", None) if stopping() else None)


def _watch_group(port: int, launched: Launched, done: threading.Event) -> None:
    """Until ``done``: log another program's socket in the port's group (shares.ForeignWatch), every 10 s."""
    watch = ForeignWatch(port)
    while not done.wait(1.0):
        frontends = getattr(launched.frontends, "processes", None) or []
        watch.check([p.pid for p in frontends if p.pid])


@dataclasses.dataclass
class Launched:
    """What one start made, filled in by ``_launch`` as it goes, so that whatever exists is stopped and
    reaped, even when the launch fails half-way."""

    frontends: Any = None  # vLLM's APIServerProcessManager
    engines: Any = None  # its CoreEngineProcManager
    coordinator: Any = None
    # vLLM objects whose finalizers must not run while the processes serve (see compat.launch)
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


def _engine_fields() -> set[str]:
    from vllm import AsyncEngineArgs

    return {f.name for f in dataclasses.fields(AsyncEngineArgs)}


def _launch(launched: Launched, config: Any, count: int, listen: str, sock: Any, args: Any, *,
            log_stats: bool) -> None:
    """vLLM's engine core and ``count`` front ends running ``run_frontend`` (engines/vllm/compat.py: the
    launcher's interface differs between vLLM 0.26 and 0.3x), recorded in ``launched`` as each is made."""
    server = {"listen_address": listen, "sock": sock, "args": args, "num_servers": count,
              "target_server_fn": run_frontend}

    def on_engines(engine_manager: Any) -> None:  # the front ends watch the core processes
        args.hyocr_engine_pids = _pids(engine_manager)

    compat.launch(launched, config, count, server, log_stats=log_stats, on_engines=on_engines)


def _pids(engine_manager: Any) -> tuple[int, ...]:
    """The engine core processes, started before the front ends (which watch them)."""
    return tuple(p.pid for p in getattr(engine_manager, "processes", ()) if p.pid)


def run_frontend(listen_address: str, sock: Any, args: Any, client_config: dict[str, Any] | None = None,
                 **_: Any) -> None:
    """One front-end process (spawned by vLLM): a whole hyocr server on the shared socket, or on its own in the
    port's SO_REUSEPORT group (``sock`` None)."""
    import uvicorn

    from ..api.app import build_app
    from ..engines.vllm.engine import VllmEngine
    from ..observability.logs import setup_logging
    from .uvicorn import Server, uvicorn_options

    settings, kwargs = args.hyocr_frontend
    setup_logging(settings.log_level, settings.log_format)
    if sock is None:  # its own socket of the port's group; uvicorn listens once the engine answers
        sock = join_group(settings)
    if settings.gil_switch_interval:
        sys.setswitchinterval(settings.gil_switch_interval)
    core = SharedEngineCore(compat.frontend_client_config(client_config), engine_pids=getattr(args, "hyocr_engine_pids", ()),
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
