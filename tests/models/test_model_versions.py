"""HunyuanOCR 1.5's checkpoint layout served by both model engines (tiny, random weights): the version is
recognised, the checkpoint's generation_config defaults apply to every request that leaves them open, and
/v1/models reports both. (1.0's flat layout is the session's other checkpoint, tests/models/conftest.py.)"""

from __future__ import annotations

import base64

import openai
import requests
from conftest import V15_PENALTY
from imaging import card

CARD_URL = "data:image/png;base64," + base64.b64encode(card().png()).decode()


def _chat(server, **sampling) -> str:
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0, timeout=300)
    r = client.chat.completions.create(model="x", max_tokens=16, messages=[
        {"role": "system", "content": ""},
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": CARD_URL}},
                                     {"type": "text", "text": "提取图中的文字。"}]}], **sampling)
    return r.choices[0].message.content


def test_a_15_checkpoint_is_recognised_and_reported(server_15):
    model = requests.get(f"{server_15.url}/v1/models", timeout=30).json()["data"][0]["hyocr"]
    assert model["model_version"] == "1.5"
    assert model["generation_defaults"] == {"temperature": 0.0, "repetition_penalty": V15_PENALTY}


def test_the_checkpoints_defaults_apply_unless_the_request_overrides_them(server_15):
    default = _chat(server_15)
    assert default == _chat(server_15, extra_body={"repetition_penalty": V15_PENALTY})
    assert default != _chat(server_15, extra_body={"repetition_penalty": 1.0})  # overridden: a different output


def test_the_10_checkpoint_is_reported_as_10(model_server):
    model = requests.get(f"{model_server.url}/v1/models", timeout=30).json()["data"][0]["hyocr"]
    assert model["model_version"] == "1.0" and model["generation_defaults"] == {"temperature": 0.0}


def test_15_tasks_run_on_a_15_checkpoint_with_its_own_prompts(server_15):
    from hyocr.hunyuan.prompts import PROMPTS_15
    from hyocr.types import Task

    for task in ("layout", "spotting_json"):
        r = requests.post(f"{server_15.url}/v1/ocr", json={"image": CARD_URL, "task": task, "max_tokens": 8},
                          timeout=300)
        assert r.status_code == 200, r.text
        assert r.json()["task"] == task and r.json()["pages"][0]["finish_reason"] in ("length", "repetition", "stop")
    # task=document sends 1.5's wording: the same prompt tokens as a chat with that text
    ocr = requests.post(f"{server_15.url}/v1/ocr", json={"image": CARD_URL, "task": "document", "max_tokens": 2},
                        timeout=300).json()
    client = openai.OpenAI(base_url=f"{server_15.url}/v1", api_key="x", max_retries=0, timeout=300)
    chat = client.chat.completions.create(model="x", max_tokens=2, messages=[
        {"role": "system", "content": ""},
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": CARD_URL}},
                                     {"type": "text", "text": PROMPTS_15[Task.DOCUMENT]}]}])
    assert ocr["usage"]["prompt_tokens"] == chat.usage.prompt_tokens


def test_a_15_task_on_a_10_checkpoint_is_a_clear_400(model_server):
    r = requests.post(f"{model_server.url}/v1/ocr", json={"image": CARD_URL, "task": "layout"}, timeout=60)
    assert r.status_code == 400 and "HunyuanOCR 1.5's" in r.json()["error"]["message"]
