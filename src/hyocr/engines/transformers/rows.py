"""One request being decoded (a row of the running batch): its stream back to the caller, when it stops,
and how its next token is chosen. Rows with different sampling settings share one batch."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field
from typing import Any

from ...errors import engine_failure
from ...hunyuan.chat import sampling_defaults
from ...types import EngineChunk, EngineRequest, FinishReason, SamplingParams
from .prompts import Prompt

DEFAULT_MAX_TOKENS = 4096
# Below this a temperature is greedy (vLLM's _SAMPLING_EPS): dividing logits by 1e-300 overflows to inf
SAMPLING_EPS = 1e-5


@dataclass(eq=False)
class Job:
    """A request waiting for the model thread, with its prompt already encoded."""

    request: EngineRequest
    prompt: Prompt
    loop: asyncio.AbstractEventLoop
    out: asyncio.Queue
    cancelled: threading.Event = field(default_factory=threading.Event)
    waited_steps: int = 0  # decode steps it has waited to join the running batch
    matcher: Any = None  # xgrammar's GrammarMatcher when the output is constrained (engines/grammar.py)
    sampling: SamplingParams = field(init=False)

    def __post_init__(self) -> None:
        self.sampling = sampling_defaults(self.request.sampling)

    def emit(self, item: object) -> None:
        self.loop.call_soon_threadsafe(self.out.put_nowait, item)


class IncrementalDecoder:
    """Token ids -> text deltas without re-decoding the whole output each step, and without
    emitting half a multi-byte character (the vLLM detokenizer's prefix/read offsets)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.prefix = 0
        self.read = 0

    def add(self, token: int) -> None:
        self.ids.append(token)

    def flush(self) -> str:
        """Text of the tokens added since the last flush that can be shown now."""
        if self.read == len(self.ids):
            return ""
        decode = self.tokenizer.decode
        prefix_text = decode(self.ids[self.prefix : self.read], skip_special_tokens=True)
        new_text = decode(self.ids[self.prefix :], skip_special_tokens=True)
        if len(new_text) > len(prefix_text) and not new_text.endswith("\ufffd"):
            self.prefix, self.read = self.read, len(self.ids)
            return new_text[len(prefix_text) :]
        return ""


class Row:
    def __init__(self, job: Job, tokenizer: Any, eos_ids: set[int], max_model_len: int | None, device: Any) -> None:
        import torch

        self.job = job
        s = job.sampling
        self.decoder = IncrementalDecoder(tokenizer)
        self.eos_ids = eos_ids
        self.prompt_tokens = job.prompt.length
        self.max_tokens = s.max_tokens or DEFAULT_MAX_TOKENS
        if max_model_len:
            self.max_tokens = max(1, min(self.max_tokens, max_model_len - self.prompt_tokens))
        self.min_tokens = self.max_tokens if s.ignore_eos else (s.min_tokens or 0)
        self.count = 0
        self.done = False
        self.greedy = not s.temperature or s.temperature < SAMPLING_EPS
        self.penalty = s.repetition_penalty if s.repetition_penalty and s.repetition_penalty != 1.0 else None
        self.presence = s.presence_penalty or 0.0
        self.frequency = s.frequency_penalty or 0.0
        # OpenAI's stop: the output ends before the first stop string. The text is kept to find one that
        # spans tokens, and its last ``hold`` characters are held back while they may begin one.
        self.stops = [stop for stop in s.stop if stop]
        self.hold = max((len(stop) for stop in self.stops), default=1) - 1
        self.text = ""
        self.sent = 0  # characters of ``text`` emitted
        self.matcher = job.matcher
        self.generator = None
        if not self.greedy and s.seed is not None:
            self.generator = torch.Generator(device=device).manual_seed(s.seed)

    @property
    def cancelled(self) -> bool:
        return self.job.cancelled.is_set()

    @property
    def penalised(self) -> bool:
        return self.penalty is not None or bool(self.presence) or bool(self.frequency)

    def accept(self, token: int, stream: bool) -> bool:
        """Take the row's next token; True when the row is finished."""
        if self.done:  # failed while its token was chosen
            return True
        if token in self.eos_ids and self.count >= self.min_tokens:
            self.finish(FinishReason.STOP)
            return True
        if self.matcher is not None and not self.matcher.accept_token(token):  # nothing the grammar allows
            self.finish(FinishReason.STOP)
            return True
        self.count += 1
        self.decoder.add(token)
        # A row with stop strings looks at every token, so that it ends at its stop string, not steps later
        if (stream or self.stops) and self.emit_text():
            return True
        if self.count >= self.max_tokens:
            self.finish(FinishReason.LENGTH)
            return True
        return False

    def emit_text(self, final: bool = False) -> bool:
        """Send the text that can be shown now; True when it reached a stop string (the row is then finished)."""
        text, stopped = self.decoder.flush(), False
        if self.stops:
            start = max(0, len(self.text) - self.hold)  # a stop string may begin in the held-back tail
            self.text += text
            cut = min((at for at in (self.text.find(stop, start) for stop in self.stops) if at >= 0), default=-1)
            stopped = cut >= 0
            end = cut if stopped else len(self.text) if final else max(self.sent, len(self.text) - self.hold)
            text, self.sent = self.text[self.sent : end], end
        if text:
            self.job.emit(EngineChunk(text=text, prompt_tokens=self.prompt_tokens, completion_tokens=self.count))
        if stopped:
            self._end(FinishReason.STOP)
        return stopped

    def finish(self, reason: FinishReason) -> None:
        if not self.emit_text(final=True):
            self._end(reason)

    def fail(self, error: Exception) -> None:
        self.done = True
        self.job.emit(error)

    def _end(self, reason: FinishReason) -> None:
        self.done = True
        self.job.emit(EngineChunk(finish_reason=reason, prompt_tokens=self.prompt_tokens, completion_tokens=self.count))


def choose_tokens(logits: Any, rows: list[Row], eos: Any = None, penalties: Any = None) -> list[int]:
    """The next token of every row from its logits ([rows, vocab]), in a fixed number of device calls
    whatever the batch size (a per-row index copy to the GPU waits for the GPU, once per row per step):
    EOS (``eos``, ids on the device) held back for rows below their min_tokens; the rows' penalties
    (``penalties``, batch.Penalties); greedy rows by argmax, the rest sampled with their own temperature,
    min-p, top-k, top-p and seed. A row whose sampling fails is failed alone (``Row.fail``), not the batch."""
    import torch

    logits = logits.float()
    if eos is not None and len(eos):
        below = [row.count < row.min_tokens for row in rows]
        if all(below):
            logits[:, eos] = float("-inf")
        elif any(below):
            block = _on_device(torch.tensor(below), logits.device)
            logits[:, eos] = logits[:, eos].masked_fill(block[:, None], float("-inf"))
    if penalties is not None:
        logits = penalties.apply(logits)
    _constrain(logits, rows)
    tokens = logits.argmax(dim=-1).tolist()
    for i, row in enumerate(rows):
        if row.greedy:
            continue
        try:
            tokens[i] = _sample(logits[i], row.job.sampling, row.generator)
        except Exception as exc:  # the shared forward succeeded: only this row's own sampling went wrong
            # (the parameters themselves are made safe above: a vanishing temperature is greedy, non-finite
            # probabilities take the argmax), so this is the engine's failure, a 500, but this row's alone
            row.fail(engine_failure(exc, f"sampling request {row.job.request.request_id}"))
    return tokens


def _constrain(logits: Any, rows: list[Row]) -> None:
    """Mask, in place, every token a constrained row's grammar does not allow next (one bitmask for the
    batch, filled on the CPU row by row, applied on the device in one call)."""
    constrained = [i for i, row in enumerate(rows) if row.matcher is not None]
    if not constrained:
        return
    import xgrammar as xgr

    # The grammars' vocabulary is the model's (engine.py: text_config.vocab_size, the logits' width)
    bitmask = xgr.allocate_token_bitmask(len(rows), logits.shape[-1])
    for i in constrained:
        rows[i].matcher.fill_next_token_bitmask(bitmask, i)
    xgr.apply_token_bitmask_inplace(logits, _on_device(bitmask, logits.device), indices=constrained)


def _on_device(values: Any, device: Any) -> Any:
    """A small CPU tensor on ``device`` without waiting for the GPU (pinned, non-blocking copy)."""
    if getattr(device, "type", str(device)) == "cpu":
        return values
    return values.pin_memory().to(device, non_blocking=True)


def _sample(logits: Any, s: SamplingParams, generator: Any) -> int:
    import torch

    logits = logits / s.temperature
    if s.min_p:  # vLLM's order: after the temperature, before top-k and top-p
        probs = logits.softmax(-1)
        logits = logits.masked_fill(probs < s.min_p * probs.max(), float("-inf"))
    if s.top_k and 0 < s.top_k < logits.shape[-1]:
        kth = torch.topk(logits, s.top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if s.top_p is not None and s.top_p < 1.0:
        ordered, order = torch.sort(logits, descending=True)
        cumulative = ordered.softmax(-1).cumsum(-1)
        drop = cumulative - ordered.softmax(-1) > s.top_p  # keep the smallest set reaching top_p
        logits = logits.scatter(0, order, ordered.masked_fill(drop, float("-inf")))
    probs = logits.softmax(-1)
    if not bool(torch.isfinite(probs).all()):  # inf logits (a huge penalty): the likeliest, as greedy would
        return int(logits.argmax())
    return int(torch.multinomial(probs, 1, generator=generator))
