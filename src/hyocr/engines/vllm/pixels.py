"""HunyuanOCR's image processor on the serving path: the same pixel values for a fraction of the CPU.

transformers' ``HunYuanVLImageProcessorPil`` (the backend vLLM pins for HunyuanOCR) turns an 8-bit
image into patches in four passes over it: rescale (in float64), normalize, patchify's cast and its
transpose. For a 1024x640 card that is the largest part of what the API process spends on a request
(benchmarks/NOTES.md). Rescaling and normalising are elementwise, per channel: for 8-bit input a
pixel's value depends only on its channel and its byte, so a 3 x 256 table made by the processor's
own ``rescale`` and ``normalize`` gives bit-identical values. The patch layout is then a transpose of
the bytes (a quarter of the memory traffic) and one table lookup writes the float patches.

``install()`` replaces the class's ``_preprocess`` (hf_compat.PREPROCESS_METHOD) in this process, for every user of the class (the
values are the same, so the transformers engine in the same process is unaffected); whatever the fast
path does not cover (input that is not 8-bit, video frames) goes to the original.

``install(uint8=True)`` goes one step further for the vLLM engine: the patches leave as their bytes, a
quarter of the float32 and half of the bf16 vLLM would carry, and vLLM's engine process looks them up in
the same table on the GPU (vision.py ``normalised``) before the encoder. Only vLLM's own calls of the processor
(``InputProcessingContext.call_hf_processor``, marked by a context variable) get bytes: another user of the
class in the process (the transformers engine, a test) still gets floats. vLLM only casts floating tensors,
so the bytes cross to the engine core, its batch and its pinned-memory copy as they are; the engine core's
thread copies 1.9 MiB a card instead of 3.75 (benchmarks/NOTES.md, 13). The values the encoder sees are
the same float32 ones, cast to the model's dtype as before.
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np

from . import hf_compat

_lock = threading.Lock()
_original: dict[str, Any] = {}
_tables: dict[tuple, np.ndarray] = {}
_bytes = {"on": False}  # install(uint8=True): the patches leave as bytes, normalised in the engine process
_in_vllm = contextvars.ContextVar("hyocr_vllm_processor_call", default=False)  # inside vLLM's processor call


def _processor_class() -> Any:
    return hf_compat.image_processor_class()  # None: transformers without HunYuanVL or its PIL backend


def install(*, uint8: bool | None = None) -> bool:
    """Use the fast path for HunyuanOCR's processor in this process (idempotent); False if unavailable.
    ``uint8``: patches as bytes (only where the engine process normalises them: vision.py); None keeps
    what was set (another engine core of this process may be serving with it)."""
    cls = _processor_class()
    if cls is None:
        return False
    if uint8 is not None:
        _bytes["on"] = uint8
    with _lock:
        if "preprocess" not in _original:
            _original["preprocess"] = hf_compat.preprocess_method(cls)
            hf_compat.set_preprocess_method(cls, fast_preprocess)
        if uint8 and "vllm_call" not in _original:
            _mark_vllm_calls()
    return True


def _mark_vllm_calls() -> None:
    """vLLM's processor calls run with ``_in_vllm`` set: the only calls that may send bytes."""
    from . import compat

    owner = compat.hf_processor_call_class()
    if owner is None:
        return
    original = _original["vllm_call"] = owner.call_hf_processor

    def call_hf_processor(self: Any, *args: Any, **kwargs: Any) -> Any:
        with for_vllm():
            return original(self, *args, **kwargs)

    owner.call_hf_processor = call_hf_processor


def sends_bytes() -> bool:
    return _bytes["on"]


def _bytes_now() -> bool:
    """Bytes for this call: on, and called by vLLM's renderer (or inside ``for_vllm``)."""
    return _bytes["on"] and _in_vllm.get()


def uninstall() -> None:
    _bytes["on"] = False
    cls = _processor_class()
    with _lock:
        if cls is not None and "preprocess" in _original:
            hf_compat.set_preprocess_method(cls, _original.pop("preprocess"))


def value_table(processor: Any, channels: int, do_rescale: bool, rescale_factor: float, do_normalize: bool,
                image_mean: Any, image_std: Any) -> np.ndarray:
    """Float32 value of every byte in every channel, computed by the processor's own operations."""
    key = (channels, do_rescale, float(rescale_factor), do_normalize, _key(image_mean), _key(image_std))
    table = _tables.get(key)
    if table is None:
        values = np.broadcast_to(np.arange(256, dtype=np.uint8), (channels, 1, 256)).copy()  # (C, H=1, W=256)
        out: np.ndarray = values
        if do_rescale:
            out = processor.rescale(out, rescale_factor)
        if do_normalize:
            out = processor.normalize(out, image_mean, image_std)
        table = np.ascontiguousarray(np.asarray(out, dtype=np.float32).reshape(channels, 256))
        _tables[key] = table
    return table


def image_processor_config(config: dict) -> dict:
    """The image processor's settings in a checkpoint's config file: preprocessor_config.json is them (1.0),
    processor_config.json holds them under ``image_processor`` (1.5, newer transformers)."""
    section = config.get("image_processor")
    return section if isinstance(section, dict) else config


@contextlib.contextmanager
def for_vllm() -> Iterator[None]:
    """Calls in this block count as vLLM's own (tests; vLLM's are marked by ``_mark_vllm_calls``)."""
    token = _in_vllm.set(True)
    try:
        yield
    finally:
        _in_vllm.reset(token)


def checkpoint_table(config: dict) -> np.ndarray:
    """The table of a checkpoint's preprocessor_config.json, made as ``fast_preprocess`` makes it from the
    processor the config builds (rescale and normalise are the processor's own operations): what the
    engine process normalises bytes with."""
    cls = _processor_class()
    if cls is None:
        raise RuntimeError("transformers has no HunYuanVL PIL image processor here")
    processor = cls(**{k: v for k, v in config.items() if k in ("do_rescale", "rescale_factor", "do_normalize",
                                                                     "image_mean", "image_std")})
    return value_table(processor, 3, processor.do_rescale, processor.rescale_factor, processor.do_normalize,
                       processor.image_mean, processor.image_std)


def _key(value: Any) -> Any:
    return tuple(np.atleast_1d(value).tolist()) if value is not None else None


def patch_bytes(image: np.ndarray, patch_size: int, merge_size: int) -> np.ndarray:
    """(C, H, W) bytes -> (patches, C * patch_size**2) in the processor's patch order (its ``patchify``
    with one temporal frame)."""
    channels, height, width = image.shape
    gh, gw = height // patch_size, width // patch_size
    patches = image.reshape(channels, gh // merge_size, merge_size, patch_size, gw // merge_size, merge_size,
                            patch_size)
    return patches.transpose(1, 2, 4, 5, 0, 3, 6).reshape(gh * gw, channels * patch_size * patch_size)


def fast_preprocess(self: Any, images: list, do_resize: bool, size: Any, resample: Any, do_rescale: bool,
                    rescale_factor: float, do_normalize: bool, image_mean: Any, image_std: Any, patch_size: int,
                    temporal_patch_size: int, merge_size: int, return_tensors: Any, **kwargs: Any) -> Any:
    original = _original["preprocess"]
    if temporal_patch_size != 1 or any(getattr(im, "dtype", None) != np.uint8 or im.ndim != 3
                                       or (_bytes_now() and im.shape[0] != 3) for im in images):
        return original(self, images, do_resize, size, resample, do_rescale, rescale_factor, do_normalize,
                        image_mean, image_std, patch_size, temporal_patch_size, merge_size, return_tensors, **kwargs)
    from transformers.image_processing_utils import BatchFeature

    smart_resize = hf_compat.smart_resize()

    all_patches, grids = [], []
    factor = patch_size * merge_size
    for image in images:
        if do_resize:
            target = smart_resize(image.shape[1], image.shape[2], factor=factor,
                                  min_pixels=size.shortest_edge, max_pixels=size.longest_edge)
            if target != tuple(image.shape[1:]):  # hyocr's engines hand over images already this size
                image = self.resize(image, size=size, resample=resample, factor=factor)
        flat = patch_bytes(np.asarray(image), patch_size, merge_size)
        if _bytes_now():  # RGB bytes, for vLLM: its engine process looks them up (vision.py)
            all_patches.append(np.ascontiguousarray(flat))
        else:
            table = value_table(self, image.shape[0], do_rescale, rescale_factor, do_normalize, image_mean,
                                image_std)
            # Row c of the table for the bytes of channel c: one gather into the flattened table.
            offsets = np.repeat(np.arange(image.shape[0], dtype=np.uint16) * 256, patch_size * patch_size)
            all_patches.append(table.reshape(-1)[flat.astype(np.uint16) + offsets])
        grids.append([1, image.shape[1] // patch_size, image.shape[2] // patch_size])
    pixel_values = np.concatenate(all_patches, axis=0) if len(all_patches) > 1 else all_patches[0]
    data = {"pixel_values": pixel_values, "image_grid_thw": np.array(grids, dtype=np.int64)}
    return BatchFeature(data=data, tensor_type=return_tensors)
