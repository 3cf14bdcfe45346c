"""Continuous batching on plain transformers: the rows being decoded share one KV cache, and new requests
join it between two decode steps instead of waiting for a whole static batch to finish.

transformers' own continuous batching (``generate_batch``, ``ContinuousBatchingManager``) takes token ids
only: no pixels, no multimodal rotary positions, so it cannot serve HunYuanVL. This is the small part of
it HunyuanOCR needs, on the model's ordinary forward and ``DynamicCache``:

- a join prefills the new requests together (left-padded, their images in one vision pass) into a cache
  of their own, then pads the running cache or theirs on the left to one length and stacks the two;
- a decode step runs every row one token forward with its own rotary position and padding mask;
- a finished row is dropped from the cache (``index_select``), and padding that no row needs any more is
  cut from the left, so the cache stays as long as its longest row;
- what choosing the next tokens needs per row lives on the device beside the cache (the EOS ids, and for a
  repetition penalty the tokens each row has seen), so a step costs the same few device calls at any size;
- every forward runs with SDPA's cuDNN backend excluded (``attention_kernels``): torch picks it on Hopper,
  and it builds a cuDNN graph for every new key length, i.e. at every decode step: 2.1 ms of CPU per layer
  call, 51 of a step's 61 ms at 32 rows on an H200 (benchmarks/NOTES.md, change 17).
"""

from __future__ import annotations

from typing import Any

from .prompts import Prompt


def attention_kernels(device: Any, cudnn: bool = False) -> Any:
    """The context every forward of the batch runs in: on CUDA, SDPA may pick flash, memory-efficient
    or math attention but not cuDNN (unless ``cudnn``); elsewhere nothing changes."""
    import contextlib

    if cudnn or getattr(device, "type", str(device).split(":")[0]) != "cuda":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])


class RunningBatch:
    def __init__(self, model: Any, device: Any) -> None:
        self.model = model
        self.device = device
        self.rows: list[Any] = []
        self.cache: Any = None
        self.mask: Any = None  # [rows, length] 1 where a cached token is real, 0 where it is padding
        self.positions: Any = None  # [rows] the rotary position of each row's next token
        self.last: Any = None  # [rows] each row's latest token (the next step's input)
        # Only while some row has a repetition penalty: [rows, vocab] tokens seen, [rows, 1] its penalty (1.0: none)
        self.seen: Any = None
        self.penalty: Any = None
        self.eos: Any = None  # the EOS ids on the device (set by the engine)
        self.vocab = 0
        self.cudnn_attention = False  # benchmarks: let SDPA pick cuDNN again (the measured alternative)
        rope = model.config.text_config.rope_parameters or {}
        self.axes = len(rope.get("mrope_section", [])) or 1  # rotary position axes (XD-RoPE: 4)

    def __len__(self) -> int:
        return len(self.rows)

    def set_eos(self, eos_ids: set[int]) -> None:
        import torch

        self.eos = torch.tensor(sorted(eos_ids), dtype=torch.long, device=self.device)

    def choice_inputs(self, start: int = 0) -> dict[str, Any]:
        """choose_tokens' device tensors for rows ``start``.."""
        seen = None if self.seen is None else self.seen[start:]
        penalty = None if self.penalty is None else self.penalty[start:]
        return {"eos": self.eos, "seen": seen, "penalty": penalty}

    def prefill(self, rows: list[Any], prompts: list[Prompt]) -> Any:
        """Prefill ``prompts`` into a cache of their own and append them to the batch. Returns their
        next-token logits ([len(prompts), vocab]). On failure the running rows are left as they were."""
        import torch
        from transformers import DynamicCache

        length = max(p.length for p in prompts)
        axes = prompts[0].positions.shape[0]
        ids = torch.zeros(len(prompts), length, dtype=torch.long)
        positions = torch.zeros(axes, len(prompts), length, dtype=torch.long)
        mask = torch.zeros(len(prompts), length, dtype=torch.long)
        for i, p in enumerate(prompts):
            ids[i, length - p.length :] = p.ids
            positions[:, i, length - p.length :] = p.positions
            mask[i, length - p.length :] = 1
        inputs: dict[str, Any] = {}
        pixels = [p.pixel_values for p in prompts if p.pixel_values is not None]
        if pixels:
            inputs["pixel_values"] = torch.cat(pixels).to(self.device, self.model.dtype)
            inputs["image_grid_thw"] = torch.cat([p.image_grid_thw for p in prompts if p.image_grid_thw is not None])
            inputs["image_grid_thw"] = inputs["image_grid_thw"].to(self.device)
        cache = DynamicCache(config=self.model.config)
        mask = mask.to(self.device)
        with attention_kernels(self.device, self.cudnn_attention):
            out = self.model(
                input_ids=ids.to(self.device), attention_mask=mask, position_ids=positions.to(self.device),
                past_key_values=cache, use_cache=True, logits_to_keep=1, **inputs,
            )
        nxt = torch.tensor([p.next_position for p in prompts], device=self.device)
        logits = out.logits[:, -1]
        self.vocab = logits.shape[-1]
        self._append(rows, out.past_key_values, mask, nxt, self._seen_prompts(rows, prompts, logits.shape[-1]))
        return logits

    def step(self) -> Any:
        """One decode step for every row: [rows, vocab] logits of each row's next token."""
        import torch

        self.mask = torch.cat([self.mask, self.mask.new_ones(len(self.rows), 1)], dim=1)
        position_ids = self.positions.view(1, -1, 1).expand(self.axes, -1, 1)
        with attention_kernels(self.device, self.cudnn_attention):
            out = self.model(
                input_ids=self.last.view(-1, 1), attention_mask=self.mask, position_ids=position_ids,
                past_key_values=self.cache, use_cache=True,
            )
        self.positions = self.positions + 1
        return out.logits[:, -1]

    def set_last(self, tokens: list[int], start: int = 0) -> None:
        """The tokens just chosen for rows ``start``.. (the next step's input)."""
        import torch

        chosen = torch.tensor(tokens, dtype=torch.long, device=self.device)
        self.last = chosen if start == 0 or self.last is None else torch.cat([self.last[:start], chosen])
        if self.seen is not None:
            self.seen[torch.arange(start, start + len(tokens), device=self.device), chosen] = True

    def keep(self, indices: list[int]) -> None:
        """Keep only these rows (in this order); cut the padding no remaining row needs."""
        if len(indices) == len(self.rows):
            return
        if not indices:
            self.clear()
            return
        import torch

        index = torch.tensor(indices, device=self.device)
        self.rows = [self.rows[i] for i in indices]
        self.mask = self.mask.index_select(0, index)
        self.positions = self.positions.index_select(0, index)
        self.last = self.last.index_select(0, index)
        if self.seen is not None:
            self.seen, self.penalty = self.seen.index_select(0, index), self.penalty.index_select(0, index)
        lead = int(self.mask.any(dim=0).long().argmax())  # first column some row still uses
        for layer in self.cache.layers:
            layer.keys = layer.keys.index_select(0, index)[:, :, lead:]
            layer.values = layer.values.index_select(0, index)[:, :, lead:]
        self.mask = self.mask[:, lead:]

    def clear(self) -> None:
        self.rows, self.cache, self.mask, self.positions, self.last = [], None, None, None, None
        self.seen = self.penalty = None

    def _seen_prompts(self, rows: list[Any], prompts: list[Prompt], vocab: int) -> Any:
        """(seen, penalty) of the newcomers, or None when none has a repetition penalty. HF's penalty
        covers the prompt's tokens as well as the output's."""
        if all(row.penalty is None for row in rows):
            return None
        import torch

        seen = torch.zeros(len(rows), vocab, dtype=torch.bool, device=self.device)
        for i, (row, prompt) in enumerate(zip(rows, prompts, strict=True)):
            if row.penalty is not None:
                seen[i, prompt.ids.to(self.device)] = True
        penalty = torch.tensor([[row.penalty or 1.0] for row in rows], device=self.device)
        return seen, penalty

    def _append_choices(self, old_rows: int, choices: Any, new_rows: int, vocab: int) -> None:
        """Stack the newcomers' (seen, penalty) under the running rows', zeros and 1.0 for whoever has none."""
        import torch

        if choices is None and self.seen is None:
            return
        seen, penalty = choices if choices is not None else (
            torch.zeros(new_rows, vocab, dtype=torch.bool, device=self.device),
            torch.ones(new_rows, 1, device=self.device),
        )
        if self.seen is None:
            self.seen = torch.zeros(old_rows, vocab, dtype=torch.bool, device=self.device)
            self.penalty = torch.ones(old_rows, 1, device=self.device)
        self.seen, self.penalty = torch.cat([self.seen, seen]), torch.cat([self.penalty, penalty])

    def _append(self, rows: list[Any], cache: Any, mask: Any, positions: Any, choices: Any) -> None:
        import torch
        import torch.nn.functional as F  # noqa: N812

        if self.cache is None:
            self.rows, self.cache, self.mask, self.positions = list(rows), cache, mask, positions
            self.seen, self.penalty = choices if choices is not None else (None, None)
            return
        old, new = self.mask.shape[1], mask.shape[1]
        length = max(old, new)
        for mine, theirs in zip(self.cache.layers, cache.layers, strict=True):
            # [rows, heads, length, dim]: pad the length dimension on the left
            mine.keys = torch.cat([F.pad(mine.keys, (0, 0, length - old, 0)), F.pad(theirs.keys, (0, 0, length - new, 0))])
            mine.values = torch.cat(
                [F.pad(mine.values, (0, 0, length - old, 0)), F.pad(theirs.values, (0, 0, length - new, 0))]
            )
        self.mask = torch.cat([F.pad(self.mask, (length - old, 0)), F.pad(mask, (length - new, 0))])
        self.positions = torch.cat([self.positions, positions])
        self._append_choices(len(self.rows), choices, len(rows), self.vocab)
        self.rows += rows
