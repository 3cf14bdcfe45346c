"""``API_PROCESSES=K`` with ``ENGINES_PER_GPU``: K hyocr server processes on one port, each owning every
K-th of the server's engine cores (engines/vllm/cores.py), each listening on its own socket of the port's
SO_REUSEPORT group where the kernel has one (Linux; shares.py), else all on one shared socket.

With one engine core (processes.py) the API processes share it through vLLM's multi-API-server machinery.
Several cores of hyocr's own are not vLLM's to share, so each process runs a pool of its own cores: it
balances its requests over them and restarts one that dies while its others serve. The price is that
connections, which the kernel hands to the processes, decide which cores a request can reach: a busy
process's cores are not lent to an idle one. Hence the group: on one shared socket the process woken first
accepts a whole burst of new connections (twice another's share at 256 on an H100, session 22), while the
group's hash keeps them within ~1.2x (benchmarks/accept_spread.py). A process's socket listens once its cores
are up; the parent holds the port (shares.PortGroup) and looks for another program's socket in the group.
What is shared, as in processes.py: admission limits are split between the processes, rate limits need a
shared store, metrics are summed by prometheus_client's multiprocess mode (``hyocr_engine_replicas`` is then a
sum over the processes' own cores).

The parent holds the port, starts the processes and waits; SIGTERM or SIGINT is passed on (each drains), and
a process that exits with an error stops the others (the orchestrator restarts the whole server).
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import sys
import time
from typing import TYPE_CHECKING, Any

from .shares import ForeignWatch, hold_port, join_group, process_settings

if TYPE_CHECKING:
    from ..config import Settings

log = logging.getLogger(__name__)
OWN_CORES_ENV = "HYOCR_OWN_CORES"  # set in each process: its replicas are its own (metrics sum them)
FOREIGN_CHECK_S = 10.0  # how often the parent looks for another program's socket in the port's group


def serve(settings: Settings) -> int:
    from ..engines.vllm import compat
    from ..engines.vllm.args import check_kv_cache_dtype, vllm_engine_args
    from ..engines.vllm.cores import core_count

    check_kv_cache_dtype(vllm_engine_args(settings))  # a refusal here, once, not a traceback from each process
    count = settings.api_processes
    os.environ[OWN_CORES_ENV] = "1"
    compat.setup_multiprocess_metrics()  # before the processes start: they inherit the directory
    held, shared = hold_port(settings)  # a socket each in the port's SO_REUSEPORT group, else one shared
    cores = core_count(settings)
    log.info("starting %d hyocr API processes on %s:%d, each owning %s of %d engine cores", count, settings.host,
             settings.port, "one" if count == cores else f"about {cores // count}", cores)
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=run_process, args=(settings, shared, index, count),
                         name=f"hyocr-api-{index}") for index in range(count)]
    stopping = {"now": False}

    def on_signal(*_: object) -> None:
        stopping["now"] = True
        for proc in procs:
            if proc.pid and proc.is_alive():
                os.kill(proc.pid, signal.SIGTERM)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
    for proc in procs:
        proc.start()
    watch = ForeignWatch(settings.port, FOREIGN_CHECK_S) if shared is None else None
    try:
        while any(proc.is_alive() for proc in procs):
            failed = [p for p in procs if p.exitcode not in (None, 0)]
            if failed and not stopping["now"]:
                log.error("API process %s exited with %s: stopping the server", failed[0].name, failed[0].exitcode)
                on_signal()
            if watch is not None:
                watch.check([p.pid for p in procs if p.pid])
            time.sleep(0.2)
    finally:
        held.close()
        for proc in procs:
            proc.join(timeout=settings.drain_timeout + 30)
            if proc.is_alive():
                proc.kill()
    return 0 if all(p.exitcode == 0 for p in procs) else 1


def run_process(settings: Settings, sock: Any, index: int, count: int) -> None:
    """One API process (spawned): a whole hyocr server on the shared socket, or on its own in the port's
    SO_REUSEPORT group (``sock`` None), on its share of the cores."""
    import uvicorn

    from ..api.app import build_app
    from ..engines.vllm.cores import build, core_count
    from ..observability.logs import setup_logging
    from .uvicorn import Server, uvicorn_options

    setup_logging(settings.log_level, settings.log_format)
    if sock is None:  # its own socket of the port's group; uvicorn listens once the cores are up
        sock = join_group(settings)
    if settings.gil_switch_interval:
        sys.setswitchinterval(settings.gil_switch_interval)
    owned = range(index, core_count(settings), count)
    settings = process_settings(settings, index, count)
    app = build_app(settings, build(settings, only=owned))
    for sig in (signal.SIGTERM, signal.SIGINT):  # uvicorn drains, then re-raises: a drained stop exits 0
        signal.signal(sig, lambda *_: None)
    server = Server(uvicorn.Config(app, **uvicorn_options(settings)), drain=app.state.drain)
    log.info("API process %d of %d serving engine cores %s", index + 1, count, list(owned))
    server.run(sockets=[sock])
    if not server.started:  # the lifespan failed (its cores did not come up)
        logging.shutdown()
        os._exit(1)
