"""The transformers engine's sampling options through the OpenAI API (hostile client round): a vanishing
temperature is greedy, stop strings cut the streamed text, and a request whose own sampling fails (the
engine's failure, injected) is a 500 in OpenAI's error shape while the server serves on."""

from __future__ import annotations

import base64

import openai
import pytest
from imaging import card

CARD_URL = "data:image/png;base64," + base64.b64encode(card().png()).decode()


def _messages() -> list[dict]:
    content = [{"type": "image_url", "image_url": {"url": CARD_URL}}, {"type": "text", "text": "提取图中的文字。"}]
    return [{"role": "system", "content": ""}, {"role": "user", "content": content}]


def _chat(server, **options):
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0, timeout=120)
    return client.chat.completions.create(model="x", messages=_messages(), **options)


def test_a_vanishing_temperature_reads_as_greedy(hf_server):
    greedy = _chat(hf_server, max_tokens=12, temperature=0).choices[0].message.content
    assert _chat(hf_server, max_tokens=12, temperature=1e-300).choices[0].message.content == greedy


def test_a_streamed_stop_string_cuts_the_text_before_it(hf_server):
    options = {"max_tokens": 40, "temperature": 1.0, "seed": 5}
    full = _chat(hf_server, **options).choices[0].message.content
    stop = full[16:19]
    want = full[: full.find(stop)]
    chunks = list(_chat(hf_server, stream=True, stop=[stop], **options))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == want and want
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["stop"]


def test_a_request_whose_own_sampling_fails_is_a_500_of_its_own(hf_server, monkeypatch):
    from hyocr.engines.transformers import rows

    def fail(*args):
        raise RuntimeError("probability tensor contains either inf, nan or element < 0 (injected)")

    monkeypatch.setattr(rows, "_sample", fail)
    with pytest.raises(openai.InternalServerError) as caught:
        _chat(hf_server, max_tokens=8, temperature=0.8)
    error = caught.value.body
    assert caught.value.status_code == 500 and error["message"].endswith("RuntimeError"), error
    monkeypatch.undo()
    assert _chat(hf_server, max_tokens=8, temperature=0.8).choices[0].finish_reason == "length"  # serves on
