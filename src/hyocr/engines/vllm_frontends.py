"""``API_PROCESSES=N`` (vLLM engine): N HTTP server processes sharing one vLLM engine core.

At concurrency 64 on an H200 one hyocr process is the bound, not the GPU (benchmarks/NOTES.md,
session 3): HTTP and JSON, image decoding, the image processor's Python glue, vLLM's output handling
for every stream and the SSE all run under one GIL, while the engine core and the GPU wait. vLLM's
own answer is ``vllm serve --api-server-count N``: one engine core process, N front-end processes,
each an ``AsyncLLM`` client of the core over ZMQ. hyocr reuses that machinery rather than copy it
(``run_multi_api_server``: the engine core, the listening socket shared by every process, process
monitoring, shutdown in order), and gives vLLM hyocr's server as the function each front end runs.

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
import signal
import sys
from typing import TYPE_CHECKING, Any

from ..errors import ServiceUnavailable

if TYPE_CHECKING:
    from ..config import Settings

log = logging.getLogger(__name__)


@dataclasses.dataclass
class SharedEngineCore:
    """The engine core a front-end process connects to: the ZMQ addresses vLLM's launcher gave it."""

    client_config: dict[str, Any]
    connected: bool = False

    @property
    def index(self) -> int:
        return int(self.client_config.get("client_index", 0))

    @property
    def count(self) -> int:
        return int(self.client_config.get("client_count", 1))

    def connect(self, engine_kwargs: dict[str, Any]) -> Any:
        """An ``AsyncLLM`` client of the shared core (blocking: it waits for the core's handshake)."""
        from vllm import AsyncEngineArgs
        from vllm.usage.usage_lib import UsageContext
        from vllm.v1.engine.async_llm import AsyncLLM

        if self.connected:  # the core it knew is gone; only the parent can start another
            raise ServiceUnavailable("the shared vLLM engine core failed; the server restarts as a whole",
                                     code="engine_dead")
        self.connected = True
        args = AsyncEngineArgs(**engine_kwargs)
        args._api_process_count = self.count
        args._api_process_rank = self.index
        config = args.create_engine_config(usage_context=UsageContext.OPENAI_API_SERVER)
        addresses = {k: v for k, v in self.client_config.items() if k not in ("client_index", "client_count")}
        return AsyncLLM.from_vllm_config(
            vllm_config=config, usage_context=UsageContext.OPENAI_API_SERVER,
            disable_log_stats=args.disable_log_stats, client_addresses=addresses,
            client_count=self.count, client_index=self.index,
        )


def process_settings(settings: Settings, index: int, count: int) -> Settings:
    """One process's share of the server-wide limits. The separate metrics port (if any) is served by
    the first process only; in multiprocess mode it reports every process's figures anyway."""
    return settings.model_copy(update={
        "max_concurrency": math.ceil(settings.max_concurrency / count),
        "max_queue": math.ceil(settings.max_queue / count),
        "metrics_port": settings.metrics_port if index == 0 else None,
    })


def serve(settings: Settings) -> int:
    """The parent: size the engine once, start its core and N hyocr front ends, wait for them."""
    import vllm.v1.utils as vllm_utils
    from vllm import __version__
    from vllm.entrypoints.cli import serve as vllm_serve

    from .vllm import VllmEngine, apply_version_workarounds

    apply_version_workarounds(__version__)
    engine = VllmEngine.from_settings(settings)
    kwargs = engine.prepare_args()  # the same final arguments for the core and every front end
    args = vllm_serve.make_arg_parser(vllm_serve.FlexibleArgumentParser()).parse_args([])
    for name, value in kwargs.items():
        setattr(args, name, value)
    args.host, args.port, args.api_server_count = settings.host, settings.port, settings.api_processes
    # vLLM waits this long for the front ends to drain after SIGTERM before it kills them.
    args.shutdown_timeout = math.ceil(settings.drain_timeout) + 5
    args.hyocr_frontend = (settings, kwargs)
    # The one hook: vLLM's process manager starts ``run_api_server_worker_proc`` in each spawned process.
    # A spawned process imports the target by module and name, so the child runs hyocr's function.
    vllm_utils.run_api_server_worker_proc = run_frontend
    log.info("starting vLLM's engine core and %d hyocr API processes on %s:%d", settings.api_processes,
             settings.host, settings.port)
    try:
        vllm_serve.run_multi_api_server(args)
    except SystemExit:  # vLLM's SIGTERM/SIGINT handler: a requested, drained shutdown
        return 0
    except RuntimeError as exc:  # a front end or the engine core died: everything has been stopped
        log.error("server stopped: %s", exc)
        return 1
    return 0


def run_frontend(listen_address: str, sock: Any, args: Any, client_config: dict[str, Any] | None = None,
                 **_: Any) -> None:
    """One front-end process (spawned by vLLM): a whole hyocr server on the shared socket."""
    import uvicorn

    from ..api.app import build_app
    from ..cli import uvicorn_options
    from ..observability.logs import setup_logging
    from .vllm import VllmEngine

    settings, kwargs = args.hyocr_frontend
    setup_logging(settings.log_level, settings.log_format)
    if settings.gil_switch_interval:
        sys.setswitchinterval(settings.gil_switch_interval)
    client = dict(client_config or {})
    client.pop("api_server_loads", None)  # vLLM 0.3x's own accept balancing, for its server only
    core = SharedEngineCore(client)
    settings = process_settings(settings, core.index, core.count)
    engine = VllmEngine.from_settings(settings)
    engine.engine_args, engine._prepared = dict(kwargs), True
    engine.shared_core = core
    app = build_app(settings, engine)
    # uvicorn drains on SIGTERM, then re-raises it; a no-op handler there makes a drained stop exit 0,
    # which vLLM's monitor reads as a clean stop (non-zero would read as a crash).
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: None)
    server = uvicorn.Server(uvicorn.Config(app, **uvicorn_options(settings)))
    log.info("API process %d of %d serving on %s", core.index + 1, core.count, listen_address)
    asyncio.run(server.serve(sockets=[sock]))
    if not server.started:  # the lifespan failed (the engine did not come up): a crash, for the parent
        raise SystemExit(1)
