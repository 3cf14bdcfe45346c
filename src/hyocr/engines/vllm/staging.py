"""The engine core's batching of an encoder pass's byte pixels: timed, and optionally into reused pinned buffers.

Before each encoder pass vLLM concatenates the pass's images' pixel rows into a freshly allocated pinned buffer
(``MultiModalFlatField._reduce_data``, ``torch.concat(out=pinned)``) on the engine core's only thread, then copies
it to the GPU. A py-spy of one core at c=64 (H100, benchmarks/NOTES.md entry 33) put 15% of that thread there,
~9 ms for ~11 MB of bytes a pass, where a concat into memory written before takes ~1 ms on a CPU here (the cause
on the device is open). So, in the engine process (vision.py installs it, with the encoder):

- with ``HYOCR_ENCODER_TIMING_FILE`` set, the batching of byte pixels is timed (passes, bytes, seconds) into the
  encoder's timing file: what benchmarks/request_time_breakdown.py reports as the core's batching cost;
- with ``HYOCR_PIXEL_STAGING=ring`` the bytes go into one of a few pinned buffers kept across passes instead. A
  buffer is written again only once the copy out of it has run: when a buffer is handed out, an event is recorded
  on the current stream for the one handed out before (whose copy to the GPU vLLM queued right after taking it),
  and a buffer's last event is waited for before it is written (with three buffers, two passes ago).

Anything else (floats, several dimensions differing, no pinning: vLLM's CPU platform) takes vLLM's own path.
The ring relies on what vLLM 0.26-0.32 do: the engine core's one thread reduces a field and queues its copy to the
GPU right after (``reduce_data`` -> ``_nested_tensors_h2d``) on the stream current at the next reduce, and keeps
no reference to the CPU batch; a vLLM that copied on a side stream would need the event recorded there.
"""

from __future__ import annotations

import math
import os
import time
from typing import Any

ENV_STAGING = "HYOCR_PIXEL_STAGING"  # "ring": reused pinned buffers (a benchmark's A/B until measured)
SLOTS = 3
GRANULE = 16 << 20  # buffers grow in 16 MiB steps (a card's bytes are ~1.9 MiB)

_original: dict[str, Any] = {}


class PinnedRing:
    """A few pinned byte buffers used in turn, each written again only after the copy out of it ran.
    ``allocate(n)`` and ``event()`` are torch's (pinned empty tensor, CUDA event) unless a test gives others."""

    def __init__(self, slots: int = SLOTS, allocate: Any = None, event: Any = None) -> None:
        self.buffers: list[Any] = [None] * slots
        self.events: list[Any] = [None] * slots
        self.turn = -1
        self.allocate = allocate or _pinned_bytes
        self.event = event or _cuda_event

    def take(self, nbytes: int) -> Any:
        """A pinned uint8 tensor of at least nbytes that nothing still reads."""
        if self.turn >= 0:  # the previous buffer's copy was queued on this stream since it was handed out
            previous = self.events[self.turn] = self.event()
            previous.record()
        self.turn = (self.turn + 1) % len(self.buffers)
        pending = self.events[self.turn]
        if pending is not None:
            pending.synchronize()
            self.events[self.turn] = None
        buffer = self.buffers[self.turn]
        if buffer is None or buffer.numel() < nbytes:
            buffer = self.buffers[self.turn] = self.allocate(-(-nbytes // GRANULE) * GRANULE)
        return buffer[:nbytes]


def _pinned_bytes(n: int) -> Any:
    import torch

    return torch.empty(n, dtype=torch.uint8, pin_memory=True)


def _cuda_event() -> Any:
    import torch

    return torch.cuda.Event()


def concat_into(ring: PinnedRing, batch: list, dim: int) -> Any:
    """torch.concat(batch, dim) written into the ring's next buffer; None when the batch is not byte rows
    stacked along their first dimension (vLLM's own path then)."""
    import torch

    first = batch[0]
    if dim != 0 or any(t.dim() != first.dim() or t.shape[1:] != first.shape[1:] for t in batch):
        return None
    rows = sum(int(t.shape[0]) for t in batch)
    out = ring.take(rows * math.prod(first.shape[1:])).view(rows, *first.shape[1:])
    return torch.concat(batch, dim=0, out=out)


def install(timing: dict | None, ring: PinnedRing | None = None) -> str:
    """Wrap vLLM's flat-field batching in this process: time byte pixels into ``timing`` (its ``batch_*``
    keys) and, with a ring, stage them there. Returns what was done."""
    from . import compat

    cls = compat.flat_field_class()
    if cls is None:
        return "vLLM has no flat multimodal field here: batching left as is"
    if timing is None and ring is None:
        return "batching left as is"
    original = _original.setdefault("reduce", cls._reduce_data)

    def reduce_data(self: Any, batch: list, *, pin_memory: bool) -> Any:
        if not (pin_memory and batch and _all_cpu_bytes(batch)):
            return original(self, batch, pin_memory=pin_memory)
        started = time.perf_counter()
        out = concat_into(ring, batch, self.dim) if ring is not None else None
        if out is None:
            out = original(self, batch, pin_memory=pin_memory)
        if timing is not None:
            timing["batch_passes"] = timing.get("batch_passes", 0) + 1
            timing["batch_bytes"] = timing.get("batch_bytes", 0) + out.numel()
            timing["batch_s"] = timing.get("batch_s", 0.0) + time.perf_counter() - started
        return out

    cls._reduce_data = reduce_data
    return "byte pixels batched into reused pinned buffers" if ring is not None else "byte pixel batching timed"


def _all_cpu_bytes(batch: list) -> bool:
    import torch

    return all(isinstance(t, torch.Tensor) and t.dtype == torch.uint8 and t.device.type == "cpu" for t in batch)


def ring_from_env() -> PinnedRing | None:
    return PinnedRing() if os.environ.get(ENV_STAGING, "").lower() == "ring" else None
