"""The transformers engine's continuous batching, in-process on the tiny random-weight checkpoint: requests
join a running batch between decode steps, and a row's output does not depend on who it shared the batch
with (random weights: any mix-up of rows, positions or padding shows as different text)."""

from __future__ import annotations

import asyncio

import pytest
from PIL import Image, ImageDraw

from hyocr.errors import HyocrError
from hyocr.types import EngineRequest, FinishReason, PageImage, SamplingParams, Task

pytest.importorskip("transformers")


def _page(width: int, height: int, text: str) -> PageImage:
    image = Image.new("RGB", (width, height), "white")
    ImageDraw.Draw(image).text((12, 12), text, fill="black")
    return PageImage(image)


def _request(i: int, tokens: int, priority: int = 0, **sampling) -> EngineRequest:
    return EngineRequest(
        request_id=f"r{i}", task=Task.SPOTTING, prompt="Detect and recognize text in the image.",
        images=(_page(160 + 48 * i, 120 + 32 * i, f"line {i}"),), priority=priority,
        sampling=SamplingParams(max_tokens=tokens, ignore_eos=True, **sampling),
    )


async def _read(engine, request: EngineRequest, delay: float = 0.0, log: list | None = None):
    await asyncio.sleep(delay)
    text, last = [], None
    async for chunk in engine.generate(request):
        text.append(chunk.text)
        last = chunk
    if log is not None:
        log.append(request.request_id)
    return "".join(text), last


@pytest.fixture(scope="module")
async def engine(tiny_checkpoint):
    from hyocr.engines.transformers import TransformersEngine

    engine = TransformersEngine(str(tiny_checkpoint), max_batch_size=4, max_model_len=8192, batch_wait_ms=0)
    await engine.start()
    yield engine
    await engine.stop()


async def test_a_request_joins_a_running_batch_and_reads_as_it_would_alone(engine):
    requests = [_request(0, 300), _request(1, 12), _request(2, 40, temperature=0.8, seed=7)]
    alone = [await _read(engine, r) for r in requests]
    joined_before = engine.joined_running
    order: list[str] = []
    started = asyncio.Event()

    async def first():
        text, last = [], None
        async for chunk in engine.generate(requests[0]):
            started.set()
            text.append(chunk.text)
            last = chunk
        order.append("r0")
        return "".join(text), last

    async def later(request):
        await started.wait()  # r0 is decoding
        return await _read(engine, request, log=order)

    together = await asyncio.gather(first(), later(requests[1]), later(requests[2]))
    assert engine.joined_running - joined_before >= 1  # someone was admitted while the long one decoded
    assert order.index("r1") < order.index("r0")  # the short late one did not wait for the long one
    for (text_alone, last_alone), (text, last) in zip(alone, together, strict=True):
        assert text == text_alone and text
        assert last.finish_reason is FinishReason.LENGTH
        assert last.completion_tokens == last_alone.completion_tokens
        assert last.prompt_tokens == last_alone.prompt_tokens
    assert [last.completion_tokens for _, last in together] == [300, 12, 40]


async def test_a_closed_stream_leaves_the_batch_and_the_others_go_on(engine):
    long, other = _request(0, 120), _request(3, 30)
    expected, _ = await _read(engine, other)
    cancelled_before = engine.cancelled_rows

    async def abandon():
        stream = engine.generate(long)
        async for _chunk in stream:
            break
        await stream.aclose()

    _, (text, last) = await asyncio.gather(abandon(), _read(engine, other, delay=0.1))
    assert text == expected and last.completion_tokens == 30
    for _ in range(50):  # the model thread notices at its next step
        if engine.cancelled_rows > cancelled_before:
            break
        await asyncio.sleep(0.1)
    assert engine.cancelled_rows == cancelled_before + 1


async def test_waiting_online_requests_are_admitted_before_background_ones(tiny_checkpoint):
    from hyocr.engines.transformers import TransformersEngine

    engine = TransformersEngine(str(tiny_checkpoint), max_batch_size=1, batch_wait_ms=0)
    await engine.start()
    try:
        order: list[str] = []
        first_token = asyncio.Event()

        async def long_running():
            async for chunk in engine.generate(_request(0, 300)):
                first_token.set()
                if chunk.finish_reason:
                    order.append("r0")

        async def queued(request, delay):
            await first_token.wait()  # r0 holds the only row: both wait in the queue
            await asyncio.sleep(delay)
            await _read(engine, request, log=order)

        await asyncio.gather(long_running(), queued(_request(1, 5, priority=1), 0.0),  # a job's page, first
                             queued(_request(2, 5), 0.1))  # a caller waiting, second
        assert order == ["r0", "r2", "r1"]
    finally:
        await engine.stop()


async def test_a_failed_join_fails_only_the_newcomers(engine, monkeypatch):
    from hyocr.engines.transformers import batch as batch_module

    running = _request(0, 60)
    expected, _ = await _read(engine, running)
    real_prefill = batch_module.RunningBatch.prefill

    def prefill(self, rows, prompts):
        if any(row.job.request.request_id == "bad" for row in rows):
            raise RuntimeError("CUDA out of memory (injected)")
        return real_prefill(self, rows, prompts)

    monkeypatch.setattr(batch_module.RunningBatch, "prefill", prefill)
    bad = EngineRequest(request_id="bad", task=Task.SPOTTING, prompt="x", images=(_page(200, 150, "bad"),),
                        sampling=SamplingParams(max_tokens=10))
    first, second = await asyncio.gather(_read(engine, running), _read(engine, bad, delay=0.3), return_exceptions=True)
    assert first[0] == expected
    assert isinstance(second, HyocrError) and second.status == 503 and second.code == "out_of_memory"


async def test_the_model_thread_keeps_no_autograd_state(engine):
    """Every step's tensors are inference tensors: with autograd on, each token's activations would stay
    alive through the cache (the GPU ran out of memory at concurrency 8 before this was found)."""
    import torch

    from hyocr.engines.transformers import batch as batch_module

    seen = []
    real_step = batch_module.RunningBatch.step

    def step(self):
        logits = real_step(self)
        seen.append((torch.is_inference(logits), torch.is_inference(self.cache.layers[0].keys)))
        return logits

    batch_module.RunningBatch.step = step
    try:
        await _read(engine, _request(1, 5))
    finally:
        batch_module.RunningBatch.step = real_step
    assert seen and all(a and b for a, b in seen)


async def test_a_prompt_the_processor_refuses_is_an_engine_error_not_a_crash(engine, monkeypatch):
    from hyocr.engines.transformers import engine as engine_module

    def refuse(*args):
        raise ValueError("image has 0 pixels (injected)")

    monkeypatch.setattr(engine_module, "encode", refuse)
    with pytest.raises(HyocrError) as caught:
        await _read(engine, _request(1, 5))
    assert caught.value.status == 500 and "could not prepare the prompt" in str(caught.value)
    monkeypatch.undo()
    text, last = await _read(engine, _request(1, 5))  # the engine serves on
    assert last.completion_tokens == 5


def _hf_generate(engine, request: EngineRequest, **options) -> str:
    """transformers' own generate() on the same prompt, alone: the reference a row must match."""
    import torch

    from hyocr.hunyuan.geometry import fit_image

    content = [{"type": "image"}, {"type": "text", "text": request.prompt}]
    messages = [{"role": "system", "content": request.system}, {"role": "user", "content": content}]
    text = engine.processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    image = fit_image(request.images[0], engine.bounds)
    inputs = engine.processor(text=[text], images=[image], return_tensors="pt")
    length = inputs["input_ids"].shape[1]
    tokens = request.sampling.max_tokens
    with torch.inference_mode():
        out = engine.model.generate(**inputs, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False,
                                    temperature=None, top_p=None, top_k=None, **options)
    return engine.processor.tokenizer.decode(out[0, length:], skip_special_tokens=True)


PENALTY = 3.0  # 1.3 does not change the tiny random model's greedy loop


async def test_repetition_penalty_and_min_tokens_match_generate_in_a_shared_batch(engine):
    """A row with HF's repetition penalty (HunyuanOCR 1.5 defaults to 1.08; a large one here, so that random
    weights feel it) decodes in one batch with rows without it, EOS masked and penalties applied for all rows
    at once on the device: every row reads as generate() alone."""
    penalised = _request(3, 48, repetition_penalty=PENALTY)
    plain = [_request(4, 48), _request(5, 20)]
    want = [_hf_generate(engine, penalised, repetition_penalty=PENALTY)] + [_hf_generate(engine, r) for r in plain]
    assert want[0] != _hf_generate(engine, _request(3, 48))  # the penalty changes this row's text
    got = await asyncio.gather(*(_read(engine, r) for r in (penalised, *plain)))
    assert [text for text, _ in got] == want


# ------------------------------------------------------------------ sampling parameters (hostile client round)


async def test_a_vanishing_temperature_is_greedy_and_fails_no_one_sharing_its_batch(engine):
    """temperature=1e-300 overflowed logits / temperature to inf, the softmax to NaN, torch.multinomial raised
    and the step failed every row of the batch: now it is greedy (below vLLM's 1e-5), and a repetition penalty
    of 1e-300 (0.0 in float32: inf logits) falls back to the likeliest token instead of raising."""
    tiny, vanishing = _request(0, 20, temperature=1e-300), _request(1, 20, temperature=1.0, repetition_penalty=1e-300)
    others = [_request(2, 20, temperature=0.8, seed=7), _request(3, 20)]
    greedy = [await _read(engine, _request(0, 20))] + [await _read(engine, r) for r in others]
    got = await asyncio.gather(*(_read(engine, r) for r in (tiny, vanishing, *others)), return_exceptions=True)
    assert not [e for e in got if isinstance(e, BaseException)]
    assert [text for text, _ in got[:1] + got[2:]] == [text for text, _ in greedy]
    assert all(last.finish_reason is FinishReason.LENGTH and last.completion_tokens == 20 for _, last in got)


async def test_a_row_whose_sampling_fails_fails_alone(engine, monkeypatch):
    from hyocr.engines.transformers import rows as rows_module

    real_sample = rows_module._sample

    def sample(logits, s, generator):
        if s.seed == 13:
            raise RuntimeError("probability tensor contains either inf, nan or element < 0 (injected)")
        return real_sample(logits, s, generator)

    others = [_request(1, 24, temperature=0.8, seed=7), _request(2, 24)]
    alone = [await _read(engine, r) for r in others]
    monkeypatch.setattr(rows_module, "_sample", sample)
    bad = _request(0, 24, temperature=0.8, seed=13)
    got = await asyncio.gather(_read(engine, bad), *(_read(engine, r) for r in others), return_exceptions=True)
    assert isinstance(got[0], HyocrError) and got[0].status == 500 and got[0].cause_type == "RuntimeError"
    assert [text for text, _ in got[1:]] == [text for text, _ in alone]


async def _chunks(engine, request: EngineRequest) -> list:
    return [chunk async for chunk in engine.generate(request)]


async def test_stop_strings_end_the_output_before_them_streamed_alone_and_in_a_batch(engine):
    sampled = {"temperature": 1.0, "seed": 5}  # greedy, the tiny model repeats 4 characters
    full, _ = await _read(engine, _request(3, 48, **sampled))
    stop = full[20:23]
    assert stop.strip() and full.find(stop) >= 8, full  # the tiny model's text has a stop string to find
    want = full[: full.find(stop)]
    never = "\x00never\x00"
    for together in (0, 3):  # alone: text every token; four rows: text every fourth step
        crowd = [_request(10 + i, 60) for i in range(together)]
        results = await asyncio.gather(_chunks(engine, _request(3, 48, stop=(never, stop), **sampled)),
                                       *(_read(engine, r) for r in crowd))
        chunks = results[0]
        sent = ""
        for chunk in chunks:  # never a character past the stop string, in any chunk
            sent += chunk.text
            assert want.startswith(sent)
        assert sent == want and chunks[-1].finish_reason is FinishReason.STOP
        assert chunks[-1].completion_tokens < 48
    text, last = await _read(engine, _request(3, 48, stop=(never,), **sampled))  # a stop string it never writes
    assert text == full and last.finish_reason is FinishReason.LENGTH


class _OpenAIPenalties:
    """OpenAI's presence and frequency penalties as a generate() logits processor, over the output only."""

    def __init__(self, prompt_length: int, presence: float, frequency: float) -> None:
        self.prompt_length, self.presence, self.frequency = prompt_length, presence, frequency

    def __call__(self, input_ids, scores):
        import torch

        out = input_ids[:, self.prompt_length :]
        counts = torch.zeros_like(scores).scatter_add_(1, out, torch.ones_like(out, dtype=scores.dtype))
        return scores - self.frequency * counts - self.presence * (counts > 0)


def _hf_generate_penalised(engine, request: EngineRequest, presence: float, frequency: float) -> str:
    from transformers import LogitsProcessor, LogitsProcessorList

    class Processor(LogitsProcessor):
        def __init__(self):
            self.penalties = None

        def __call__(self, input_ids, scores):
            if self.penalties is None:  # the prompt is what generate() started with
                self.penalties = _OpenAIPenalties(input_ids.shape[1], presence, frequency)
            return self.penalties(input_ids, scores)

    return _hf_generate(engine, request, logits_processor=LogitsProcessorList([Processor()]))


async def test_presence_and_frequency_penalties_match_openais_definition_in_a_shared_batch(engine):
    """logits[t] -= presence * (count[t] > 0) + frequency * count[t] over the generated tokens, for greedy rows
    too (as vLLM), beside rows with HF's repetition penalty and rows without any."""
    presence, frequency = _request(3, 40, presence_penalty=2.0), _request(4, 40, frequency_penalty=1.5)
    both = _request(5, 40, presence_penalty=0.5, frequency_penalty=-0.5)
    repetition, plain = _request(6, 40, repetition_penalty=PENALTY), _request(7, 24)
    want = [_hf_generate_penalised(engine, presence, 2.0, 0.0), _hf_generate_penalised(engine, frequency, 0.0, 1.5),
            _hf_generate_penalised(engine, both, 0.5, -0.5), _hf_generate(engine, repetition, repetition_penalty=PENALTY),
            _hf_generate(engine, plain)]
    assert want[0] != _hf_generate(engine, _request(3, 40))  # the penalty changes this row's text
    assert want[1] != _hf_generate(engine, _request(4, 40))
    got = await asyncio.gather(*(_read(engine, r) for r in (presence, frequency, both, repetition, plain)))
    assert [text for text, _ in got] == want


async def test_min_p_keeps_only_the_tokens_near_the_likeliest(engine):
    """min_p=1.0 keeps the likeliest token alone: sampling at temperature 1 reads as greedy (it does not
    without min_p on random weights), in a batch with a row sampling without it."""
    greedy, _ = await _read(engine, _request(4, 30))
    sampled, _ = await _read(engine, _request(4, 30, temperature=1.0, seed=3))
    assert sampled != greedy
    got = await asyncio.gather(_read(engine, _request(4, 30, temperature=1.0, seed=3, min_p=1.0)),
                               _read(engine, _request(4, 30, temperature=1.0, seed=3)))
    assert [text for text, _ in got] == [greedy, sampled]
