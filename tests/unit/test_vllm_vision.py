"""The batched HunYuanVL vision forward (engines/vllm/vision.py) against the image-by-image one.

vLLM's native HunYuanVL modules exist only in vLLM <= 0.31 (CUDA builds); the CPU test stack has vLLM
0.32. So the layers here are small torch modules with the same call signatures as vLLM's (QKV and
output projections returning (out, bias), an attention taking cu_seqlens), and the reference is vLLM
0.26's forward, layer by layer and image by image. The real modules are compared on the GPU machine:
the engine's start-up self test and benchmarks/vit_cost.py.
"""

from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch")

from hyocr.engines.vllm import vision as vllm_vision  # noqa: E402

WIDTH, HEADS = 32, 4


class Projection(torch.nn.Linear):
    def forward(self, x):  # vLLM's parallel linears return (output, bias)
        return super().forward(x), None


class Attention(torch.nn.Module):
    is_flash_attn_backend = True

    def forward(self, q, k, v, cu_seqlens=None, max_seqlen=None):
        b, n, _ = q.shape
        split = (lambda t: t.view(b, n, HEADS, -1).transpose(1, 2))
        q, k, v = split(q), split(k), split(v)
        mask = None
        if cu_seqlens is not None:  # block-diagonal: each image attends to itself
            assert max_seqlen.device.type == "cpu"  # flash attention reads it with .item()
            segment = torch.repeat_interleave(torch.arange(len(cu_seqlens) - 1), torch.diff(cu_seqlens.long()))
            mask = segment[:, None] == segment[None, :]
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return out.transpose(1, 2).reshape(b, n, -1)


class SelfAttention(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv, self.o_proj, self.attn = Projection(WIDTH, 3 * WIDTH), Projection(WIDTH, WIDTH), Attention()

    def forward(self, x):  # vLLM 0.26's HunYuanVisionAttention.forward
        qkv, _ = self.qkv(x)
        q, k, v = qkv.chunk(3, dim=-1)
        out, _ = self.o_proj(self.attn(q, k, v))
        return out


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.input_layernorm, self.post_attention_layernorm = torch.nn.LayerNorm(WIDTH), torch.nn.LayerNorm(WIDTH)
        self.self_attn = SelfAttention()
        self.mlp = torch.nn.Sequential(torch.nn.Linear(WIDTH, 64), torch.nn.GELU(), torch.nn.Linear(64, WIDTH))

    def forward(self, x):
        x = x + self.self_attn(self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))


class Embeddings(torch.nn.Module):
    num_channels, patch_size = 3, 2

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(12, WIDTH)

    def forward(self, pixels, grid_thw):
        return self.proj(pixels).unsqueeze(0)


class Perceive(torch.nn.Module):
    """2x2 merge of the patch grid, then a projection: needs each image's own (h, w)."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(4 * WIDTH, 16)

    def forward(self, x, size):
        h, w = size
        x = x.reshape(1, h // 2, 2, w // 2, 2, WIDTH).permute(0, 1, 3, 2, 4, 5).reshape(1, -1, 4 * WIDTH)
        return self.proj(x)


class Visual(torch.nn.Module):
    device, dtype = torch.device("cpu"), torch.float32

    def __init__(self):
        super().__init__()
        self.embeddings, self.perceive = Embeddings(), Perceive()
        self.layers = torch.nn.ModuleList(Block() for _ in range(3))


def per_image_forward(self, x, grid_thw):
    """vLLM 0.26's HunYuanVisionTransformer.forward: every layer image by image."""
    hidden = self.embeddings(x.to(dtype=self.dtype), grid_thw)
    lengths = [int(h) * int(w) for _, h, w in grid_thw]
    for layer in self.layers:
        hidden = torch.cat([layer(p) for p in hidden.split(lengths, dim=1)], dim=1)
    return [self.perceive(p.contiguous(), size=g[1:]).squeeze(0) for g, p in zip(grid_thw, hidden.split(lengths, 1))]


@pytest.fixture
def visual(monkeypatch):
    monkeypatch.setitem(vllm_vision._state, "stock", per_image_forward)
    torch.manual_seed(0)
    return Visual().eval()


@pytest.mark.parametrize("grids", [
    [[1, 4, 6]],
    [[1, 4, 6], [1, 8, 2], [1, 2, 2]],
    [[1, 6, 6]] * 5,
])
def test_batched_forward_equals_the_image_by_image_forward(visual, grids):
    pixels = torch.randn(sum(h * w for _, h, w in grids), 12)
    with torch.no_grad():
        expected = per_image_forward(visual, pixels, grids)
        got = vllm_vision.batched_forward(visual, pixels, grids)
    assert [e.shape for e in expected] == [g.shape for g in got]
    for e, g in zip(expected, got):
        torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-5)
    assert vllm_vision.compare_forwards(visual, grids) < 1e-5


def test_without_a_cross_image_mask_images_would_mix(visual):
    """The check above has teeth: attention over the whole batch changes the outputs."""
    grids = [[1, 4, 6], [1, 8, 2]]
    pixels = torch.randn(40, 12)
    with torch.no_grad():
        expected = per_image_forward(visual, pixels, grids)
        hidden = visual.embeddings(pixels, grids)
        for layer in visual.layers:
            hidden = layer(hidden)  # one sequence: image 0 attends to image 1
        mixed = visual.perceive(hidden[:, :24].contiguous(), size=[4, 6]).squeeze(0)
    assert not torch.allclose(mixed, expected[0], atol=1e-4)


def test_other_backends_and_video_items_take_vllms_forward(visual, monkeypatch):
    calls = []
    monkeypatch.setitem(vllm_vision._state, "stock", lambda self, x, g: calls.append(g) or ["stock"])
    pixels = torch.randn(24, 12)
    assert vllm_vision.batched_forward(visual, pixels, [[2, 4, 3]]) == ["stock"]  # t = 2: a video
    monkeypatch.setattr(Attention, "is_flash_attn_backend", False)
    assert vllm_vision.batched_forward(visual, pixels, [[1, 4, 6]]) == ["stock"]
    assert len(calls) == 2


def test_lengths_and_boundaries():
    assert vllm_vision.image_lengths([[1, 40, 64], [1, 2, 3]]) == [2560, 6]
    assert vllm_vision.image_lengths([[2, 4, 4]]) is None
    assert vllm_vision.cumulative_lengths([2560, 6, 10]) == [0, 2560, 2566, 2576]


def test_install_without_vllms_native_encoder_leaves_it_alone():
    status = vllm_vision.install("batched")
    if vllm_vision._native_class() is None:  # vLLM 0.32+ (the CPU test stack): transformers backend
        assert "left as is" in status
    else:
        assert status == "batched encoder installed"
        vllm_vision.install("vllm")


def test_the_api_process_never_imports_the_engine_process_extension():
    """vision.py installs the encoder (and its byte normaliser) in the process that imports it, from the
    environment of that moment: imported in the API process before the environment is set, a forked engine
    core inherits vLLM's own encoder (seen on the H200, 2026-12-04: 'vllm encoder installed' with one core)."""
    import subprocess
    import sys

    code = ("import sys, hyocr.engines.vllm.engine, hyocr.engines.vllm.cores, hyocr.engines.vllm.startup; "
            "sys.exit('hyocr.engines.vllm.vision' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_the_native_models_forward_gets_the_defaults_v2s_capture_relies_on(monkeypatch):
    """vLLM 0.26's HunYuanVLForConditionalGeneration.forward takes intermediate_tensors and inputs_embeds without
    defaults; the V2 model runner captures CUDA graphs without intermediate_tensors (TypeError at start). The
    class here has that signature; the installed forward passes the arguments through, once, however often
    it is installed."""
    calls = []

    class Native:
        def forward(self, input_ids, positions, intermediate_tensors, inputs_embeds, **kwargs):
            calls.append((input_ids, positions, intermediate_tensors, inputs_embeds, kwargs))
            return "hidden"

    monkeypatch.setattr(vllm_vision.compat, "native_model_class", lambda: Native)
    assert vllm_vision.install_forward_defaults() == "forward defaults installed"
    vllm_vision.install_forward_defaults()
    model = Native()
    assert model.forward(input_ids="ids", positions="pos", inputs_embeds="emb") == "hidden"
    assert model.forward("ids", "pos", "it", None, extra=1) == "hidden"
    assert calls == [("ids", "pos", None, "emb", {}), ("ids", "pos", "it", None, {"extra": 1})]
    monkeypatch.setattr(vllm_vision.compat, "native_model_class", lambda: None)
    assert vllm_vision.install_forward_defaults() == "no native model"


@pytest.mark.parametrize(("version", "measured", "chosen", "runner"), [
    ("0.26.0", True, None, None),  # vLLM's own choice: V2 for HunYuanVL, the forward has its defaults
    ("0.26.0", False, None, "0"),  # e.g. LoRA or another worker extension: V1, as measured before
    ("0.26.0", False, "1", "1"),  # the user's choice stands
    ("0.32.0", False, None, None),
])
def test_vllm_026_runs_the_v2_model_runner_where_it_was_measured(monkeypatch, version, measured, chosen, runner):
    from hyocr.engines.vllm import compat
    from hyocr.engines.vllm.engine import VllmEngine

    monkeypatch.delenv("VLLM_USE_V2_MODEL_RUNNER", raising=False)
    if chosen is not None:
        monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", chosen)
    monkeypatch.setenv("VLLM_USE_FLASHINFER_SAMPLER", "0")
    compat.apply_version_workarounds(version, v2_runner=measured)
    assert os.environ.get("VLLM_USE_V2_MODEL_RUNNER") == runner
    engine = VllmEngine.__new__(VllmEngine)
    engine.engine_args = {}
    assert engine.v2_runner_measured
    for unmeasured in ({"worker_extension_cls": "mine.Extension"}, {"enable_lora": True},
                       {"speculative_config": {"method": "dflash"}}, {"data_parallel_size": 2}):
        engine.engine_args = unmeasured
        assert not engine.v2_runner_measured, unmeasured
