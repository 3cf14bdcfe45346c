"""HunYuanVL's patch embedding and patch merger as matrix products over a whole encoder pass.

vLLM 0.26 runs both as convolutions, the merger image by image. On an H100 (session 23's profile,
benchmarks/NOTES.md entry 29) cuDNN took the 16x16 stride-16 patch convolution at ~36 TFLOP/s through an
Ampere kernel, changed every convolution's input layout first (NCHW -> NHWC, ~13 times a pass) and the
position table was interpolated again for each image of each pass: ~0.4 ms of a card's 7.2 ms of encoder.

A convolution whose stride is its kernel is a matrix product over each flattened window, so:
- embed: the patch rows (C x P x P, channel-major: exactly the convolution weight's order) times the
  flattened weight, plus each image's interpolated position table, kept per grid size;
- merge: every image's 2x2 windows gathered into rows at once (the weight permuted to the rows' order), the
  1x1 convolution a matrix product, the row-end ("newline") and begin/end embeddings placed by one gather
  each. The same arithmetic in the same dtype; only the order of the sums inside a product differs.

Used by vision.batched_forward when the modules have vLLM 0.26's shape (``fits``), checked against vLLM's
own forward at start by the encoder self test (vision.py), which puts vLLM's forward back on a mismatch.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

# Interpolated position tables kept per (module, grid, dtype), bounded by bytes: a card's is 5.9 MB (bf16)
POSITION_CACHE_BYTES = 96 << 20
PLAN_CACHE_ENTRIES = 256
_positions: OrderedDict = OrderedDict()
_plans: OrderedDict = OrderedDict()


def fits(visual: Any) -> bool:
    """The modules are vLLM 0.26's HunYuanVisionPatchEmbed and HunYuanVisionPatchMerger (by their parts)."""
    import torch

    embed, merger = getattr(visual, "embeddings", None), getattr(visual, "perceive", None)
    conv = getattr(embed, "patch_embedding", None)
    proj = getattr(merger, "proj", None)
    if not isinstance(conv, torch.nn.Conv2d) or conv.kernel_size != conv.stride or conv.padding != (0, 0):
        return False
    if not hasattr(embed, "position_embedding") or not isinstance(proj, torch.nn.Sequential) or len(proj) != 3:
        return False
    down, up = proj[0], proj[2]
    return (isinstance(down, torch.nn.Conv2d) and down.kernel_size == down.stride == (merger.spatial_merge_size,) * 2
            and down.padding == (0, 0) and isinstance(up, torch.nn.Conv2d) and up.kernel_size == (1, 1)
            and all(hasattr(merger, n) for n in ("mlp", "before_rms", "after_rms", "image_newline", "image_begin")))


def embed(embeddings: Any, pixels: Any, grid_thw: list) -> Any:
    """HunYuanVisionPatchEmbed.forward: (patches, C*P*P) -> (1, patches, D)."""
    import torch
    import torch.nn.functional as F

    conv = embeddings.patch_embedding
    x = F.linear(pixels.reshape(pixels.shape[0], -1), conv.weight.reshape(conv.out_channels, -1), conv.bias)
    tables = [position_table(embeddings, int(h), int(w), x.dtype) for _, h, w in grid_thw]
    pos = tables[0] if len(tables) == 1 else torch.cat(tables)
    return (x + pos).unsqueeze(0)


def position_table(embeddings: Any, h: int, w: int, dtype: Any) -> Any:
    """The position embedding interpolated to an h x w grid, as vLLM 0.26 computes it (float32, then dtype)."""
    import torch

    key = (id(embeddings), h, w, dtype)
    found = _positions.get(key)
    if found is not None:
        _positions.move_to_end(key)
        return found
    edge, dim = embeddings.position_edge, embeddings.embed_dim
    table = embeddings.position_embedding.weight[1:, :].reshape(1, edge, edge, dim).permute(0, 3, 1, 2).float()
    # + 0.1 as vLLM (and DINO) do against floating-point error in the scale factor
    table = torch.nn.functional.interpolate(table, scale_factor=((h + 0.1) / edge, (w + 0.1) / edge),
                                            mode=embeddings.interpolate_mode, align_corners=False)
    table = table.reshape(dim, -1).transpose(0, 1).to(dtype).contiguous()
    _positions[key] = table
    while sum(t.numel() * t.element_size() for t in _positions.values()) > POSITION_CACHE_BYTES and len(_positions) > 1:
        _positions.popitem(last=False)
    return table


def merge(merger: Any, hidden: Any, grid_thw: list) -> list:
    """HunYuanVisionPatchMerger.forward over every image of a pass: hidden (1, patches, C) -> per image
    (1 + rows x (cols + 1) + 1, D)."""
    import torch
    import torch.nn.functional as F

    x = merger.before_rms(hidden.reshape(hidden.shape[-2], hidden.shape[-1]))
    down, act, up = merger.proj
    blocks, rows, out, sizes = plan(grid_thw, merger.spatial_merge_size, x.device)
    weight = window_weight(down)
    y = F.linear(x[blocks].reshape(-1, weight.shape[1]), weight, down.bias)
    y = F.linear(act(y), up.weight.reshape(up.out_channels, -1), up.bias)
    y = torch.cat([y, merger.image_newline.reshape(1, -1).to(y.dtype)])[rows]
    y = merger.mlp(y)
    ends = torch.stack([merger.image_begin, merger.image_end]).to(y.dtype)
    y = merger.after_rms(torch.cat([y, ends])[out])
    return list(y.split(sizes))


def window_weight(conv: Any) -> Any:
    """The window convolution's weight (out, C, dy, dx) as (out, dy * dx * C): the order of a gathered
    window's rows; made once per weight tensor."""
    kept = getattr(conv, "_hyocr_window_weight", None)
    if kept is None or kept[0] != conv.weight.data_ptr():
        kept = (conv.weight.data_ptr(), conv.weight.permute(0, 2, 3, 1).reshape(conv.out_channels, -1).contiguous())
        conv._hyocr_window_weight = kept
    return kept[1]


def plan(grid_thw: list, s: int, device: Any) -> tuple:
    """Gather indices for merge, kept per (grids, merge size, device): each image's s x s windows (rows in
    (dy, dx) order), its window rows each followed by the newline row, and its begin/end rows."""
    import torch

    key = (tuple((int(h), int(w)) for _, h, w in grid_thw), s, device)
    found = _plans.get(key)
    if found is not None:
        _plans.move_to_end(key)
        return found
    blocks, rows, out, sizes = [], [], [], []
    patch0 = block0 = token0 = 0
    n_blocks = sum((h // s) * (w // s) for h, w in key[0])
    newline = n_blocks
    n_tokens = sum((h // s) * (w // s + 1) for h, w in key[0])
    begin, end = n_tokens, n_tokens + 1
    for h, w in key[0]:
        hb, wb = h // s, w // s
        for i in range(hb):
            for j in range(wb):
                for dy in range(s):
                    start = patch0 + (i * s + dy) * w + j * s
                    blocks.extend(range(start, start + s))
            rows.extend(range(block0 + i * wb, block0 + (i + 1) * wb))
            rows.append(newline)
        n = hb * (wb + 1)
        out.extend([begin, *range(token0, token0 + n), end])
        sizes.append(n + 2)
        patch0, block0, token0 = patch0 + h * w, block0 + hb * wb, token0 + n
    found = tuple(torch.tensor(v, dtype=torch.long).to(device) for v in (blocks, rows, out)) + (sizes,)
    _plans[key] = found
    if len(_plans) > PLAN_CACHE_ENTRIES:
        _plans.popitem(last=False)
    return found
