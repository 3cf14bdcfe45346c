"""``hyocr serve --ray``: hyocr as a Ray Serve application on a Ray cluster (extra ``hyocr[ray]``).

Two deployments: ``Api``, hyocr's whole FastAPI app (auth, limits, admission, metrics, jobs, unchanged) as
the HTTP ingress behind Serve's proxy, and ``EngineReplica`` (ray/replica.py), the engine, with
``RAY_REPLICAS`` replicas (one GPU each for the model engines, CPU for rapidocr), autoscaled up to
``RAY_MAX_REPLICAS`` on requests in flight. The API reaches the replicas through ``RayServeEngine``
(ray/engine.py).

    hyocr serve --ray --ray-replicas 2                          a local Ray cluster, started here
    hyocr serve --ray --ray-address auto --engine vllm ...      an existing cluster (ray start --head ...)
    serve run hyocr.ray.serve:app_builder engine=rapidocr ray_replicas=2   Serve's own CLI (or a config file:
                                                                 deploy/ray/serve.yaml)

On SIGTERM the API starts hyocr's own drain (requests still running at DRAIN_TIMEOUT get the JSON 503
``shutting_down``), then the application is deleted the way Serve rolls replicas: each finishes what it holds,
then stops its engine.
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
import time
from typing import Any

from ..config import Settings, SettingsError, load_settings
from . import LOCAL, cluster_address
from .engine import APP, ENGINE_DEPLOYMENT, RayServeEngine
from .replica import EngineReplica

log = logging.getLogger(__name__)
API_DEPLOYMENT = "Api"
HEALTH_CHECK_PERIOD_S = 5.0
# A model engine's first start (weights, compilation, CUDA graphs) takes minutes on a cold machine: Serve must
# not give up on a replica that is still loading (the lesson of the 139 s cold start).
HEALTH_CHECK_TIMEOUT_S = 60.0
# After the API replica's graceful timeout: the replicas stopping and Serve noting the application gone.
DELETE_MARGIN_S = 20.0


def engine_options(settings: Settings) -> dict[str, Any]:
    """The engine deployment's Serve options from the settings: replicas (or autoscaling), resources, the
    per-replica request bound, health checks and the drain."""
    options: dict[str, Any] = {
        "name": ENGINE_DEPLOYMENT,
        "ray_actor_options": {"num_cpus": settings.ray_cpus_per_replica, "num_gpus": settings.ray_gpus},
        # A replica takes what its engine batches at once; more wait in Serve's queue (the API's admission
        # limit bounds the total).
        "max_ongoing_requests": settings.max_concurrency,
        "health_check_period_s": HEALTH_CHECK_PERIOD_S,
        "health_check_timeout_s": HEALTH_CHECK_TIMEOUT_S,
        # After the API's own drain deadline (it answers what is left with a JSON 503, cancelling those
        # streams), so a replica is never killed under a request the API has not answered.
        "graceful_shutdown_timeout_s": settings.drain_timeout + 5,
        "graceful_shutdown_wait_loop_s": 1.0,
    }
    if settings.ray_max_replicas is not None and settings.ray_max_replicas > settings.ray_replicas:
        target = settings.ray_target_ongoing_requests or max(1.0, settings.max_concurrency / 2)
        options["autoscaling_config"] = {"min_replicas": settings.ray_replicas,
                                         "max_replicas": settings.ray_max_replicas,
                                         "target_ongoing_requests": target}
    else:
        options["num_replicas"] = settings.ray_replicas
    return options


def api_options(settings: Settings) -> dict[str, Any]:
    """The API deployment: one replica (its admission limit is the server's; more API replicas would each
    admit MAX_CONCURRENCY, and need Redis for rate limits and PostgreSQL for jobs, as API_PROCESSES do)."""
    return {"name": API_DEPLOYMENT, "num_replicas": 1, "ray_actor_options": {"num_cpus": 0},
            "max_ongoing_requests": settings.max_concurrency + settings.max_queue + 64,
            "graceful_shutdown_timeout_s": settings.drain_timeout + 10, "graceful_shutdown_wait_loop_s": 1.0}


class Api:
    """The ingress: hyocr's app on the engine handle. Serve builds the ASGI app in the replica, after this
    constructor (``__serve_build_asgi_app__``), and runs its lifespan (engine start, jobs) as uvicorn would."""

    def __init__(self, engine: Any, settings: Settings) -> None:
        # A stalled replica is Serve's to replace (check_health); the API's watchdog would fail every
        # replica's requests at once, so it is off here.
        self.settings = settings.model_copy(update={"stall_timeout": 0.0})
        self.engine = engine

    def __serve_build_asgi_app__(self) -> Any:
        from ..api.app import build_app

        self.hyocr_app = build_app(self.settings, engine=RayServeEngine(self.engine, APP))  # (`app` is Serve's)
        return self.hyocr_app

    async def begin_drain(self) -> None:
        """The stop begins (``run`` calls this before deleting the application): DRAIN_TIMEOUT from now the
        requests still running get hyocr's JSON 503 ``shutting_down``, as a drained ``hyocr serve`` answers.
        Serve alone would kill the replicas under them, and its proxy answer a plain-text 500."""
        self.hyocr_app.state.drain.begin()


def build_application(settings: Settings) -> Any:
    """The bound Serve application (``serve.run`` it, or return it from a ``serve run`` builder)."""
    from ray import serve

    replica = serve.deployment(**engine_options(settings))(EngineReplica)
    api = serve.deployment(**api_options(settings))(serve.ingress()(Api))
    return api.bind(replica.bind(settings), settings)


def app_builder(args: dict[str, Any]) -> Any:
    """``serve run hyocr.ray.serve:app_builder key=value ...`` (or a config file's ``args``): the settings
    by name, over the HYOCR_* environment."""
    try:
        return build_application(load_settings(**args))
    except SettingsError as exc:
        raise ValueError(str(exc)) from None


def _wait_deleted(serve: Any, timeout: float) -> None:
    """Until the application is gone (its replicas drained and stopped), at most ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while APP in serve.status().applications:
        if time.monotonic() > deadline:
            raise TimeoutError(f"the application was not deleted within {timeout:g} s")
        time.sleep(0.5)


def run(settings: Settings) -> int:
    """``hyocr serve --ray``: join (or start) the cluster, run the application behind Serve's proxy on
    HOST:PORT, and on SIGTERM/SIGINT drain it and stop. Exit status 0 after a clean drain."""
    try:
        import ray
        from ray import serve
    except ImportError:
        print('hyocr: --ray needs Ray: pip install "hyocr[ray]"', file=sys.stderr)
        return 2
    address = cluster_address(settings)
    owned = address == LOCAL  # a cluster of ours: Serve and Ray stop with this process
    if owned and settings.engine == "vllm":  # replicas on this machine: what it cannot run is refused here, at once
        from ..engines.vllm.args import check_kv_cache_dtype, vllm_engine_args

        check_kv_cache_dtype(vllm_engine_args(settings))
    ray.init(address=address, namespace="hyocr", include_dashboard=False,
             log_to_driver=settings.log_level == "debug", configure_logging=False)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        serve.start(http_options={"host": settings.host, "port": settings.port})
        serve.run(build_application(settings), name=APP, route_prefix="/")
        log.info("hyocr on Ray Serve at http://%s:%d: %s", settings.host, settings.port,
                 engine_options(settings))
        while not stop.wait(1.0):
            pass
        log.info("draining the Ray Serve application (up to %gs)", settings.drain_timeout)
        try:
            serve.get_deployment_handle(API_DEPLOYMENT, app_name=APP).begin_drain.remote().result(timeout_s=10)
        except Exception as exc:  # the API replica gone already: Serve's own drain still applies
            log.warning("the API replica did not start its drain: %s", exc)
        # Each replica finishes its requests in flight, then stops. Not serve.delete's own wait: it gives up
        # after 60 s, and the shutdown below would then cut a longer drain's requests off with no answer.
        serve.delete(APP, _blocking=False)
        # The API replica's graceful timeout is the longest (the engine replicas' is shorter), then their stops.
        _wait_deleted(serve, api_options(settings)["graceful_shutdown_timeout_s"] + DELETE_MARGIN_S)
        return 0
    except Exception as exc:
        log.error("the Ray Serve application failed: %s", exc)
        return 3
    finally:
        if owned:  # Serve on a shared cluster is not ours to stop: only our application went
            serve.shutdown()
        ray.shutdown()
