"""The patch embedding and merger as matrix products (engines/vllm/vision_gemm.py) against vLLM 0.26's modules.

vLLM 0.26's HunYuanVisionPatchEmbed and HunYuanVisionPatchMerger exist only in its CUDA builds; their forward
code is copied here (vllm/model_executor/models/hunyuan_vision.py, small sizes, torch's RMSNorm for vLLM's) as the
reference. The real modules are compared on the GPU by the engine's start-up self test (vision.py).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

from hyocr.engines.vllm import vision as vllm_vision  # noqa: E402
from hyocr.engines.vllm import vision_gemm  # noqa: E402

C, D, PATCH, EDGE = 3, 24, 4, 8  # channels, width, patch size, position table edge


class PatchEmbed(nn.Module):
    """vLLM 0.26's HunYuanVisionPatchEmbed."""

    def __init__(self):
        super().__init__()
        self.embed_dim, self.patch_size, self.num_channels = D, PATCH, C
        self.interpolate_mode = "bilinear"
        self.patch_embedding = nn.Conv2d(C, D, kernel_size=PATCH, stride=PATCH, bias=True)
        self.num_positions = EDGE * EDGE + 1
        self.position_edge = EDGE
        self.position_embedding = nn.Embedding(self.num_positions, D)
        self.patch_pos_embed = None

    def forward(self, pixel_values, grid_thw):
        num_patches = pixel_values.size(0)
        pixel_values = pixel_values.reshape(num_patches, self.num_channels, self.patch_size, self.patch_size)
        patch_embeds = self.patch_embedding(pixel_values).squeeze(-1).squeeze(-1).unsqueeze(0)
        if self.patch_pos_embed is None:
            self.patch_pos_embed = (self.position_embedding.weight[1:, :]
                                    .reshape(1, self.position_edge, self.position_edge, self.embed_dim)
                                    .permute(0, 3, 1, 2).float())
        tables = []
        for _, h0, w0 in grid_thw:
            h0, w0 = h0 + 0.1, w0 + 0.1
            table = nn.functional.interpolate(self.patch_pos_embed,
                                              scale_factor=(h0 / self.position_edge, w0 / self.position_edge),
                                              mode=self.interpolate_mode, align_corners=False)
            tables.append(table.reshape(self.embed_dim, -1).transpose(0, 1).unsqueeze(0).to(patch_embeds.dtype))
        return patch_embeds + torch.cat(tables, dim=1)


class PatchMerger(nn.Module):
    """vLLM 0.26's HunYuanVisionPatchMerger."""

    def __init__(self, in_channels=D, out_channels=16, spatial_merge_size=2):
        super().__init__()
        self.spatial_merge_size = spatial_merge_size
        self.proj = nn.Sequential(
            nn.Conv2d(in_channels, in_channels * 2, kernel_size=spatial_merge_size, stride=spatial_merge_size),
            nn.GELU(),
            nn.Conv2d(in_channels * 2, in_channels * 4, kernel_size=1),
        )
        self.mlp = nn.Linear(in_channels * 4, out_channels)
        self.image_newline = nn.Parameter(torch.randn(in_channels * 4))
        self.image_begin = nn.Parameter(torch.randn(out_channels))
        self.image_end = nn.Parameter(torch.randn(out_channels))
        self.before_rms = nn.RMSNorm(in_channels, eps=1e-5)
        self.after_rms = nn.RMSNorm(out_channels, eps=1e-5)

    def forward(self, x, size=(16, 16)):
        x = self.before_rms(x)
        h, w = size
        dtype = x.dtype
        x = x.permute(0, 2, 1).reshape(x.shape[0], -1, h, w)
        x = self.proj(x)
        b, c, h, w = x.shape
        x = torch.cat([x, self.image_newline.reshape(1, c, 1, 1).expand(b, c, h, 1).to(dtype)], dim=-1)
        x = x.reshape(b, c, -1).permute(0, 2, 1)
        x = self.mlp(x)
        begin = self.image_begin.reshape(1, 1, -1).expand(b, 1, x.shape[-1]).to(dtype)
        end = self.image_end.reshape(1, 1, -1).expand(b, 1, x.shape[-1]).to(dtype)
        return self.after_rms(torch.cat([begin, x, end], dim=1))


class Visual(nn.Module):
    device, dtype = torch.device("cpu"), torch.float32

    def __init__(self):
        super().__init__()
        self.embeddings, self.perceive = PatchEmbed(), PatchMerger()
        self.layers = nn.ModuleList()


GRIDS = [
    [[1, 4, 6]],
    [[1, 5, 7], [1, 3, 3]],  # odd: the merger's last row and column dropped, as vLLM's convolution does
    [[1, 4, 6], [1, 8, 2], [1, 2, 2]],
    [[1, 6, 10]] * 3,
    [[1, 12, 8], [1, 4, 6], [1, 12, 8]],
]


@pytest.fixture
def visual():
    torch.manual_seed(0)
    vision_gemm._positions.clear()
    vision_gemm._plans.clear()
    return Visual().eval()


def pixels_for(grids):
    return torch.randn(sum(h * w for _, h, w in grids), C * PATCH * PATCH)


@pytest.mark.parametrize("grids", GRIDS)
def test_embed_equals_the_convolution(visual, grids):
    pixels = pixels_for(grids)
    with torch.no_grad():
        expected = visual.embeddings(pixels, grids)
        got = vision_gemm.embed(visual.embeddings, pixels, grids)
        again = vision_gemm.embed(visual.embeddings, pixels, grids)  # position tables from the cache
    assert got.shape == expected.shape == (1, pixels.shape[0], D)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(again, got, rtol=0, atol=0)


@pytest.mark.parametrize("grids", GRIDS)
def test_merge_equals_vllms_merger_image_by_image(visual, grids):
    hidden = torch.randn(1, sum(h * w for _, h, w in grids), D)
    with torch.no_grad():
        expected, start = [], 0
        for _, h, w in grids:
            expected.append(visual.perceive(hidden[:, start:start + h * w].contiguous(), size=(h, w)).squeeze(0))
            start += h * w
        got = vision_gemm.merge(visual.perceive, hidden, grids)
    assert [e.shape for e in expected] == [g.shape for g in got]
    for e, g in zip(expected, got):
        torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-5)


def test_the_window_order_matters(visual):
    """The check above has teeth: a merger reading windows in another order gives other outputs."""
    grids = [[1, 4, 6]]
    hidden = torch.randn(1, 24, D)
    with torch.no_grad():
        expected = visual.perceive(hidden, size=(4, 6)).squeeze(0)
        swapped = hidden.reshape(1, 4, 6, D).transpose(1, 2).reshape(1, 24, D)  # column-major patches
        got = vision_gemm.merge(visual.perceive, swapped, grids)[0]
    assert not torch.allclose(got, expected, atol=1e-3)


def stock(self, x, grid_thw):
    """vLLM 0.26's HunYuanVisionTransformer.forward with no layers: embed, then merge image by image."""
    hidden = self.embeddings(x, grid_thw)
    out, start = [], 0
    for _, h, w in grid_thw:
        out.append(self.perceive(hidden[:, start:start + h * w].contiguous(), size=(h, w)).squeeze(0))
        start += h * w
    return out


def test_the_batched_forward_uses_them_and_matches_vllms(visual, monkeypatch):
    monkeypatch.setitem(vllm_vision._state, "stock", stock)
    monkeypatch.setitem(vllm_vision._state, "gemm", True)
    monkeypatch.setattr(vllm_vision, "_flash_attention", lambda visual: True)
    calls = []
    monkeypatch.setattr(vision_gemm, "merge", lambda *a, _merge=vision_gemm.merge: calls.append(1) or _merge(*a))
    assert vision_gemm.fits(visual)
    assert vllm_vision.compare_forwards(visual, GRIDS[3]) < 1e-5
    assert calls  # the matrix-product merger ran
    monkeypatch.setitem(vllm_vision._state, "gemm", False)
    calls.clear()
    assert vllm_vision.compare_forwards(visual, GRIDS[3]) < 1e-5
    assert not calls


def test_modules_of_another_shape_keep_their_own_forward():
    class Other(nn.Module):
        def __init__(self):
            super().__init__()
            self.embeddings = nn.Linear(4, 4)
            self.perceive = nn.Linear(4, 4)

    assert not vision_gemm.fits(Other())
    visual = Visual()
    visual.embeddings.patch_embedding = nn.Conv2d(C, D, kernel_size=PATCH, stride=2)  # overlapping windows
    assert not vision_gemm.fits(visual)


def test_caches_are_bounded(visual, monkeypatch):
    monkeypatch.setattr(vision_gemm, "PLAN_CACHE_ENTRIES", 3)
    bound = 2 * 10 * 6 * D * 4  # two 10x6 float32 tables
    monkeypatch.setattr(vision_gemm, "POSITION_CACHE_BYTES", bound)
    with torch.no_grad():
        for h in (2, 4, 6, 8, 10):
            grids = [[1, h, 6]]
            vision_gemm.embed(visual.embeddings, pixels_for(grids), grids)
            vision_gemm.merge(visual.perceive, torch.randn(1, h * 6, D), grids)
    assert len(vision_gemm._plans) == 3
    assert [key[2:4] for key in vision_gemm._positions] == [(8, 6), (10, 6)]  # the newest that fit the bound


def test_embed_in_bf16_casts_the_float32_table_as_vllm_does(visual):
    visual = visual.to(torch.bfloat16)
    grids = [[1, 4, 6], [1, 6, 4]]
    pixels = pixels_for(grids).to(torch.bfloat16)
    with torch.no_grad():
        expected = visual.embeddings(pixels, grids)
        got = vision_gemm.embed(visual.embeddings, pixels, grids)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got, expected, rtol=2e-2, atol=2e-2)


class Extension(vllm_vision.VisionWorkerExtension):
    def __init__(self, visual):
        self.model_runner = type("Runner", (), {"model": type("Model", (), {"visual": visual})()})()


@pytest.fixture
def self_test(visual, monkeypatch):
    """The start-up self test on the modules above with no layers (vLLM 0.26's forward as the stock one)."""
    for key, value in {"stock": stock, "gemm": True, "mode": "batched", "status": "batched encoder installed"}.items():
        monkeypatch.setitem(vllm_vision._state, key, value)
    monkeypatch.setattr(vllm_vision, "_flash_attention", lambda visual: True)
    monkeypatch.setattr(vllm_vision.compat, "worker_model", lambda worker: worker.model_runner.model)
    monkeypatch.setattr(vllm_vision, "install", lambda mode=None: vllm_vision._state.update(mode=mode))
    return Extension(visual)


def test_the_self_test_keeps_the_matrix_products_when_they_agree(self_test):
    report = self_test.hyocr_vision_self_test()
    assert report["mode"] == "batched" and vllm_vision._state["gemm"]
    assert "as matrix products" in report["status"] and report["error"] < 1e-5


def test_a_disagreeing_merger_is_left_out_and_the_layers_stay_batched(self_test, monkeypatch):
    merge = vision_gemm.merge
    monkeypatch.setattr(vision_gemm, "merge", lambda *a: [t + 1 for t in merge(*a)])
    report = self_test.hyocr_vision_self_test()
    assert report["mode"] == "batched" and not vllm_vision._state["gemm"]
    assert "left out (differs from vLLM's by" in report["status"] and report["error"] < 1e-5


def test_a_raising_embedding_is_left_out_with_its_error(self_test, monkeypatch):
    def broken(*args):
        raise RuntimeError("no such shape")

    monkeypatch.setattr(vision_gemm, "embed", broken)
    report = self_test.hyocr_vision_self_test()
    assert report["mode"] == "batched" and not vllm_vision._state["gemm"]
    assert "left out (RuntimeError: no such shape)" in report["status"]
