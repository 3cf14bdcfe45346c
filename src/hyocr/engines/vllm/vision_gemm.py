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
POSITION_CACHE_BYTES = 32 << 20  # outside vLLM's memory profile: kept small (five card sizes, one or two pages)
PLAN_CACHE_ENTRIES = 256  # per grid size: small numpy arrays
_positions: OrderedDict = OrderedDict()
_plans: OrderedDict = OrderedDict()


def fits(visual: Any) -> bool:
    """The modules are vLLM 0.26's HunYuanVisionPatchEmbed and HunYuanVisionPatchMerger (by their parts)."""
    import torch

    embed, merger = getattr(visual, "embeddings", None), getattr(visual, "perceive", None)
    conv = getattr(embed, "patch_embedding", None)
    proj = getattr(merger, "proj", None)
    if not hasattr(embed, "position_embedding") or not isinstance(proj, torch.nn.Sequential) or len(proj) != 3:
        return False
    down, up = proj[0], proj[2]
    if not all(_plain_window(c) for c in (conv, down, up)):
        return False
    return (down.kernel_size == (merger.spatial_merge_size,) * 2 and up.kernel_size == (1, 1)
            and all(hasattr(merger, n) for n in ("mlp", "before_rms", "after_rms", "image_newline", "image_begin")))


def _plain_window(conv: Any) -> bool:
    """A convolution that is a matrix product over each window: stride = kernel, no padding, dilation, groups."""
    import torch

    return (isinstance(conv, torch.nn.Conv2d) and conv.stride == conv.kernel_size and conv.padding == (0, 0)
            and conv.dilation == (1, 1) and conv.groups == 1)


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

    # hyocr never reloads weights in place; the weight's address is in the key for a module rebuilt at the same id
    key = (id(embeddings), embeddings.position_embedding.weight.data_ptr(), h, w, dtype)
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
    # each image its own tensor, as vLLM's merger gives: the encoder cache frees them one by one
    return [part.clone() for part in y.split(sizes)]


def window_weight(conv: Any) -> Any:
    """The window convolution's weight (out, C, dy, dx) as (out, dy * dx * C): the order of a gathered window's
    rows. Made each pass (a 21 MB copy on the GPU, microseconds): nothing to go stale if weights are reloaded."""
    return conv.weight.permute(0, 2, 3, 1).reshape(conv.out_channels, -1)


def plan(grid_thw: list, s: int, device: Any) -> tuple:
    """Gather indices for merge: each image's s x s windows (rows in (dy, dx) order), its window rows each
    followed by the newline row (after all windows), its begin/end rows (after all tokens); one host-to-device
    copy that does not wait for the GPU (a pass's images vary, so they are composed each pass from per-grid
    parts)."""
    import numpy as np
    import torch

    grids = [(int(h), int(w)) for _, h, w in grid_thw]
    parts = [grid_plan(h, w, s) for h, w in grids]
    n_blocks = sum(len(windows) // (s * s) for windows, _ in parts)
    n_tokens = sum(len(rows) for _, rows in parts)
    blocks, rows, out, sizes = [], [], [], []
    patch0 = block0 = token0 = 0
    for (h, w), (windows, image_rows) in zip(grids, parts):
        blocks.append(windows + patch0)
        rows.append(np.where(image_rows < 0, n_blocks, image_rows + block0))
        out.append(np.concatenate([[n_tokens], np.arange(token0, token0 + len(image_rows)), [n_tokens + 1]]))
        sizes.append(len(image_rows) + 2)
        patch0, block0, token0 = patch0 + h * w, block0 + len(windows) // (s * s), token0 + len(image_rows)
    flat = [np.concatenate(v) for v in (blocks, rows, out)]
    on_device = torch.from_numpy(np.concatenate(flat).astype(np.int64)).to(device, non_blocking=True)
    return (*on_device.split([len(v) for v in flat]), sizes)


def grid_plan(h: int, w: int, s: int) -> tuple:
    """One h x w image's window indices (patch rows, window by window, (dy, dx) inside) and token rows (window
    indices row by row, -1 for each row's newline), kept per grid."""
    import numpy as np

    key = (h, w, s)
    found = _plans.get(key)
    if found is not None:
        _plans.move_to_end(key)
        return found
    hb, wb = h // s, w // s
    i, j, dy, dx = np.ix_(np.arange(hb), np.arange(wb), np.arange(s), np.arange(s))
    windows = ((i * s + dy) * w + j * s + dx).reshape(-1)
    rows = np.concatenate([np.arange(hb * wb).reshape(hb, wb), np.full((hb, 1), -1)], axis=1).reshape(-1)
    found = _plans[key] = (windows, rows)
    if len(_plans) > PLAN_CACHE_ENTRIES:
        _plans.popitem(last=False)
    return found
