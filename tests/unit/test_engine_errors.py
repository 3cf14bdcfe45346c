"""Engine exceptions as clients see them: GPU out-of-memory is a retryable 503, not an opaque 500."""

from __future__ import annotations

from hyocr.errors import EngineError, ServiceUnavailable, engine_failure


class OutOfMemoryError(RuntimeError):  # the name torch.OutOfMemoryError has
    pass


def test_gpu_out_of_memory_is_a_503_with_its_own_code():
    for exc in (OutOfMemoryError("CUDA error"), RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")):
        error = engine_failure(exc, "generation failed")
        assert isinstance(error, ServiceUnavailable)
        assert error.status == 503 and error.code == "out_of_memory" and error.public


def test_other_failures_stay_internal_engine_errors():
    error = engine_failure(ValueError("shape mismatch"), "generation failed")
    assert isinstance(error, EngineError) and not isinstance(error, ServiceUnavailable)
    assert "generation failed: ValueError: shape mismatch" in error.message
