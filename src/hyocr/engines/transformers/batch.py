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
- what choosing the next tokens needs per row lives on the device beside the cache (the EOS ids, and for
  penalties the tokens each row has seen and how often: ``Penalties``), so a step costs the same few device
  calls at any size;
- every forward runs with SDPA's cuDNN backend excluded (``attention_kernels``): torch picks it on Hopper,
  and it builds a cuDNN graph for every new key length, i.e. at every decode step: 2.1 ms of CPU per layer
  call, 51 of a step's 61 ms at 32 rows on an H200 (benchmarks/NOTES.md, change 17).
"""

from __future__ import annotations

from typing import Any, NamedTuple

from .prompts import Prompt


def attention_kernels(device: Any, cudnn: bool = False) -> Any:
    """The context every forward of the batch runs in: on CUDA, SDPA may pick flash, memory-efficient
    or math attention but not cuDNN (unless ``cudnn``); elsewhere nothing changes."""
    import contextlib

    if cudnn or getattr(device, "type", str(device).split(":")[0]) != "cuda":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])


class Penalties(NamedTuple):
    """Per-row penalty state on the device, kept only while some row has a penalty: HF's repetition penalty
    over the tokens seen (prompt and output), OpenAI's presence and frequency penalties over the output's
    token counts. A row without one has 1.0, 0.0 and 0.0, which leave its logits exactly as they are."""

    seen: Any  # [rows, vocab] bool
    counts: Any  # [rows, vocab] float: output tokens only
    repetition: Any  # [rows, 1]
    presence: Any  # [rows, 1]
    frequency: Any  # [rows, 1]

    @classmethod
    def of(cls, rows: list[Any], vocab: int, device: Any, prompts: list[Prompt] | None = None) -> Penalties:
        import torch

        seen = torch.zeros(len(rows), vocab, dtype=torch.bool, device=device)
        for i, row in enumerate(rows):
            if row.penalty is not None and prompts is not None:
                seen[i, prompts[i].ids.to(device)] = True

        def column(values: list[float]) -> Any:
            return torch.tensor([[v] for v in values], dtype=torch.float32, device=device)

        return cls(seen, torch.zeros(len(rows), vocab, device=device), column([r.penalty or 1.0 for r in rows]),
                   column([r.presence for r in rows]), column([r.frequency for r in rows]))

    def select(self, index: Any) -> Penalties:
        return Penalties(*(t.index_select(0, index) for t in self))

    def tail(self, start: int) -> Penalties:
        return Penalties(*(t[start:] for t in self))

    def cat(self, other: Penalties) -> Penalties:
        import torch

        return Penalties(*(torch.cat([a, b]) for a, b in zip(self, other, strict=True)))

    def apply(self, logits: Any) -> Any:
        import torch

        r = self.repetition  # HF's RepetitionPenaltyLogitsProcessor, then vLLM's (= OpenAI's) other two
        logits = torch.where(self.seen, torch.where(logits < 0, logits * r, logits / r), logits)
        logits = logits - self.frequency * self.counts - self.presence * (self.counts > 0)
        # A penalty near 0 (1e-300 is 0.0 in float32) makes inf and, for 0 / 0 or a masked -inf * 0, NaN, which
        # argmax would pick: NaN is never chosen, inf stays the likeliest
        return logits.nan_to_num(nan=float("-inf"), posinf=float("inf"), neginf=float("-inf"))


class RunningBatch:
    def __init__(self, model: Any, device: Any) -> None:
        self.model = model
        self.device = device
        self.rows: list[Any] = []
        self.cache: Any = None
        self.mask: Any = None  # [rows, length] 1 where a cached token is real, 0 where it is padding
        self.positions: Any = None  # [rows] the rotary position of each row's next token
        self.last: Any = None  # [rows] each row's latest token (the next step's input)
        self.penalties: Penalties | None = None  # only while some row has a penalty
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
        return {"eos": self.eos, "penalties": None if self.penalties is None else self.penalties.tail(start)}

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
        penalties = Penalties.of(rows, self.vocab, self.device, prompts) if any(r.penalised for r in rows) else None
        self._append(rows, out.past_key_values, mask, nxt, penalties)
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
        if self.penalties is not None:
            index = torch.arange(start, start + len(tokens), device=self.device)
            self.penalties.seen[index, chosen] = True
            self.penalties.counts[index, chosen] += 1

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
        if self.penalties is not None:
            self.penalties = self.penalties.select(index)
        lead = int(self.mask.any(dim=0).long().argmax())  # first column some row still uses
        for layer in self.cache.layers:
            layer.keys = layer.keys.index_select(0, index)[:, :, lead:]
            layer.values = layer.values.index_select(0, index)[:, :, lead:]
        self.mask = self.mask[:, lead:]

    def clear(self) -> None:
        self.rows, self.cache, self.mask, self.positions, self.last = [], None, None, None, None
        self.penalties = None

    def _append_penalties(self, penalties: Penalties | None, rows: list[Any]) -> None:
        """Stack the newcomers' penalties under the running rows', neutral ones for whoever has none."""
        if penalties is None and self.penalties is None:
            return
        mine = self.penalties if self.penalties is not None else Penalties.of(self.rows, self.vocab, self.device)
        self.penalties = mine.cat(penalties if penalties is not None else Penalties.of(rows, self.vocab, self.device))

    def _append(self, rows: list[Any], cache: Any, mask: Any, positions: Any, penalties: Penalties | None) -> None:
        import torch
        import torch.nn.functional as F  # noqa: N812

        if self.cache is None:
            self.rows, self.cache, self.mask, self.positions = list(rows), cache, mask, positions
            self.penalties = penalties
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
        self._append_penalties(penalties, rows)
        self.rows += rows
