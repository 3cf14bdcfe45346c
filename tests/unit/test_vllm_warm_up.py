"""The vLLM engine's warm-up request: one token normally; with a draft model, enough decode steps that
speculative decoding's kernels are compiled before the first user request (they took ~1 s of a user's first
request with DFlash on an H200, session 12)."""

from __future__ import annotations

import pytest

from hyocr.engines.vllm.engine import WARM_UP_SPECULATIVE_TOKENS, VllmEngine


async def _warm_up_request(engine_args: dict):
    engine = VllmEngine({"model": "m", **engine_args})
    seen = []

    async def generate(request):  # the engine's real generate needs vLLM running; this records the request
        seen.append(request)
        yield None

    engine.generate = generate
    await engine.warm_up()
    return seen[0]


@pytest.mark.asyncio
async def test_a_plain_engine_warms_up_with_one_token():
    request = await _warm_up_request({})
    assert request.sampling.max_tokens == 1 and not request.sampling.ignore_eos


@pytest.mark.asyncio
async def test_a_speculative_engine_warms_up_its_decode_steps():
    request = await _warm_up_request({"speculative_config": {"method": "dflash", "num_speculative_tokens": 15}})
    n = request.sampling
    assert n.max_tokens == n.min_tokens == WARM_UP_SPECULATIVE_TOKENS > 15  # several proposal rounds
    assert n.ignore_eos and n.loop_guard is False
