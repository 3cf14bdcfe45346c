"""The engine core's batching of an encoder pass's byte pixels, timed (a benchmark's diagnosis, off unless asked).

Before each encoder pass vLLM concatenates the pass's images' pixel rows into a pinned buffer
(``MultiModalFlatField._reduce_data``, ``torch.concat(out=pinned)``) on the engine core's only thread, then copies
it to the GPU. With ``HYOCR_ENCODER_TIMING_FILE`` set, vision.py installs this wrapper in the engine process and the
batching of byte pixels is timed (passes, bytes, seconds) into the encoder's timing file: what
benchmarks/request_time_breakdown.py reports as the core's batching cost.

A py-spy of one core at c=64 had put 15% of that thread there (H100, benchmarks/NOTES.md entry 33). Timed on the
device it was torch's intra-op thread pool, not the copy: with the engine process on one torch thread (threads.py)
the batching takes 1.6-2.4 ms a pass of 7-10 MB, under 1% of the core's wall time, and reused pinned buffers
(tried in session 27) gained nothing, so vLLM's own path is kept (NOTES entries 34-35).
"""

from __future__ import annotations

import time
from typing import Any

_original: dict[str, Any] = {}


def install(timing: dict | None) -> str:
    """Wrap vLLM's flat-field batching in this process to time byte pixels into ``timing`` (its ``batch_*``
    keys). Returns what was done."""
    from . import compat

    cls = compat.flat_field_class()
    if cls is None:
        return "vLLM has no flat multimodal field here: batching left as is"
    if timing is None:
        return "batching left as is"
    original = _original.setdefault("reduce", cls._reduce_data)

    def reduce_data(self: Any, batch: list, *, pin_memory: bool) -> Any:
        if not (pin_memory and batch and _all_cpu_bytes(batch)):
            return original(self, batch, pin_memory=pin_memory)
        started = time.perf_counter()
        out = original(self, batch, pin_memory=pin_memory)
        timing["batch_passes"] = timing.get("batch_passes", 0) + 1
        timing["batch_bytes"] = timing.get("batch_bytes", 0) + out.numel()
        timing["batch_s"] = timing.get("batch_s", 0.0) + time.perf_counter() - started
        return out

    cls._reduce_data = reduce_data
    return "byte pixel batching timed"


def _all_cpu_bytes(batch: list) -> bool:
    import torch

    return all(isinstance(t, torch.Tensor) and t.dtype == torch.uint8 and t.device.type == "cpu" for t in batch)
