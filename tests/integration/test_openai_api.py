"""The OpenAI-compatible routes over real HTTP, driven by the official ``openai`` client and by
``requests`` with the reference article's request shape, on the real rapidocr engine."""

from __future__ import annotations

import base64
import json

import openai
import pytest
import requests
from imaging import card, overlap, squash

from hyocr.hunyuan.spotting import parse_spotting

SPOTTING_ZH = "检测并识别图片中的文字，将文本坐标格式化输出。"


@pytest.fixture(scope="module")
def client(rapid_server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{rapid_server.url}/v1", api_key="unused", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def card_url():
    rendered = card()
    return rendered, "data:image/png;base64," + base64.b64encode(rendered.png()).decode()


def _messages(url: str, text: str) -> list[dict]:
    # The official HunyuanOCR client shape: an empty system message, then image + instruction.
    return [
        {"role": "system", "content": ""},
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": text}]},
    ]


def test_chat_spotting_prompt_returns_hunyuan_format_with_correct_boxes(client, card_url):
    rendered, url = card_url
    r = client.chat.completions.create(
        model="tencent/HunyuanOCR",
        messages=_messages(url, SPOTTING_ZH),
        temperature=0,
        max_tokens=1024,
        extra_body={"top_k": 1, "repetition_penalty": 1.0, "seed": 1234},
    )
    content = r.choices[0].message.content
    assert r.choices[0].finish_reason == "stop"
    assert r.model_extra["hyocr"]["task"] == "spotting"
    # Same format as HunyuanOCR's spotting output: parse it the way a client would.
    width, height = rendered.image.size
    blocks = parse_spotting(content, width, height)
    for line, drawn in zip(rendered.lines, rendered.boxes, strict=True):
        assert any(
            squash(line.text) in squash(b.text) and overlap(b.box, drawn) > 0.5 for b in blocks
        ), (line.text, content)


def test_chat_stop_strings_end_the_text_before_them(client, card_url):
    """OpenAI's stop: rapidocr has no decoder to stop, so its text is cut where a model's would end."""
    _, url = card_url
    whole = client.chat.completions.create(model="m", messages=_messages(url, "提取图中的文字。"))
    text = whole.choices[0].message.content
    assert "BORN" in text and "EXPIRES" in text
    cut = client.chat.completions.create(model="m", messages=_messages(url, "提取图中的文字。"), stop=["BORN", "ZZZ"])
    assert cut.choices[0].message.content == text[:text.index("BORN")]
    assert cut.choices[0].finish_reason == "stop"
    streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
        model="m", messages=_messages(url, "提取图中的文字。"), stop="ID No", stream=True) if c.choices)
    assert streamed == text[:text.index("ID No")]


def test_chat_free_question_on_cpu_engine_falls_back_to_text(client, card_url):
    rendered, url = card_url
    r = client.chat.completions.create(model="anything", messages=_messages(url, "What is the ID number?"))
    meta = r.model_extra["hyocr"]
    assert (meta["task"], meta["requested_task"]) == ("text", "vqa")
    assert "420106198805" in squash(r.choices[0].message.content).replace(" ", "")
    assert r.model == "rapidocr-pp-ocrv6"


def test_chat_streaming_chunk_by_chunk(client, card_url):
    rendered, url = card_url
    stream = client.chat.completions.create(
        model="m", messages=_messages(url, "提取图中的文字。"), stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    contents = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(contents) >= len(rendered.lines)  # one chunk per recognised line at least
    assert chunks[0].choices[0].delta.role == "assistant"
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["stop"]
    assert chunks[-1].usage is not None and chunks[-1].choices == []
    text = squash("".join(contents))
    for line in rendered.lines:
        assert squash(line.text) in text
    assert len({c.id for c in chunks}) == 1


def test_raw_sse_wire_format(rapid_server, card_url):
    _, url = card_url
    with requests.post(
        f"{rapid_server.url}/v1/chat/completions",
        json={"messages": _messages(url, "提取图中的文字。"), "stream": True},
        stream=True,
        timeout=60,
    ) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        events = [line for line in r.iter_lines(decode_unicode=True) if line]
    assert all(e.startswith("data: ") for e in events)
    assert events[-1] == "data: [DONE]"


def test_article_completions_request_shape(rapid_server):
    rendered = card()
    payload = {
        "model": "tencent/HunyuanOCR",
        "prompt": "识别身份证上的姓名和号码",
        "image": base64.b64encode(rendered.png()).decode(),
        "max_tokens": 512,
        "temperature": 0,
    }
    r = requests.post(f"{rapid_server.url}/v1/completions", json=payload, timeout=60)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "text_completion"
    text = squash(body["choices"][0]["text"])
    assert "JOHNSMITH" in text and "420106198805" in text
    assert r.headers["x-hyocr-task"] == "text"


def test_completions_with_the_openai_client(client):
    rendered = card()
    r = client.completions.create(
        model="m", prompt="", extra_body={"image": base64.b64encode(rendered.png()).decode()}
    )
    assert "IDENTITYCARD" in squash(r.choices[0].text)


def test_models_lists_the_served_model(client):
    models = client.models.list().data
    assert [m.id for m in models] == ["rapidocr-pp-ocrv6"]
    assert models[0].model_extra["hyocr"]["engine"] == "rapidocr"
    # the SDK's retrieve (a client's model check) answers the same entry, and an unknown id is a 404
    one = client.models.retrieve("rapidocr-pp-ocrv6")
    assert one.id == "rapidocr-pp-ocrv6" and one.model_extra["hyocr"]["engine"] == "rapidocr"
    with pytest.raises(openai.NotFoundError) as missing:
        client.models.retrieve("tencent/HunyuanOCR")
    assert missing.value.body["code"] == "model_not_found" and "rapidocr-pp-ocrv6" in missing.value.body["message"]


@pytest.mark.parametrize(
    "change,param",
    [
        ({"n": 2}, "n"),
        ({"temperature": 5}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),  # Python's json writes NaN; it is no number
        ({"max_tokens": 10**7}, "max_tokens"),
        ({"top_p": 0}, "top_p"),
        ({"chat_template": "{{ evil }}"}, "chat_template"),
        ({"mm_processor_kwargs": {"max_pixels": 10**9}}, "mm_processor_kwargs"),
        ({"logprobs": True}, "logprobs"),
        ({"top_logprobs": 2}, "top_logprobs"),  # without logprobs, as OpenAI refuses it
        ({"max_tokens": "5"}, "max_tokens"),  # JSON numbers only: pydantic's lax mode read "5" as 5
        ({"max_tokens": True}, "max_tokens"),  # and true as 1
        ({"temperature": "0.5"}, "temperature"),
    ],
)
def test_chat_parameter_validation(rapid_server, card_url, change, param):
    _, url = card_url
    body = {"model": "m", "messages": _messages(url, "提取图中的文字。"), **change}
    r = requests.post(f"{rapid_server.url}/v1/chat/completions", data=json.dumps(body), timeout=30,
                      headers={"Content-Type": "application/json"})  # json.dumps writes NaN; requests' json= won't
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


def test_chat_shape_errors(rapid_server, card_url):
    _, url = card_url
    post = lambda body: requests.post(f"{rapid_server.url}/v1/chat/completions", json=body, timeout=30)  # noqa: E731
    no_image = post({"messages": [{"role": "user", "content": "hello"}]})
    assert no_image.status_code == 400 and "image is required" in no_image.json()["error"]["message"]
    multi = post({"messages": [*_messages(url, "hi"), {"role": "assistant", "content": "x"}, {"role": "user", "content": "y"}]})
    assert multi.status_code == 400 and "multi-turn" in multi.json()["error"]["message"]
    remote = post({"messages": _messages("http://169.254.169.254/latest/meta-data", "hi")})
    assert remote.status_code == 400 and "data URL" in remote.json()["error"]["message"]  # URLs are off
    bad_part = post({"messages": [{"role": "user", "content": [{"type": "video", "video": "x"}]}]})
    assert bad_part.status_code == 400
    bad_b64 = post({"messages": _messages("data:image/png;base64,@@@", "hi")})
    assert bad_b64.status_code == 400 and bad_b64.json()["error"]["code"] == "invalid_image"
    # errors name the field that is wrong (not the first branch of a union, nor /v1/ocr's "image")
    image = {"type": "image_url", "image_url": {"url": url}}
    for content, param in (([{"type": "text"}], "messages.0.content.0.text"),
                           ([{"type": "image_url", "image_url": {}}], "messages.0.content.0.image_url.url"),
                           ("hello", "messages"), ([image] * 9, "messages")):
        r = post({"messages": [{"role": "user", "content": content}]})
        assert r.status_code == 400 and r.json()["error"]["param"] == param, (content, r.text)
    in_system = post({"messages": [{"role": "system", "content": [image]}, {"role": "user", "content": "read"}]})
    assert in_system.status_code == 400 and "user message" in in_system.json()["error"]["message"]
    complete = lambda body: requests.post(f"{rapid_server.url}/v1/completions", json=body, timeout=30)  # noqa: E731
    for prompt in ([1, 2, 3], [[1, 2]]):
        r = complete({"prompt": prompt})
        assert r.status_code == 400 and "token-id prompts" in r.json()["error"]["message"], r.text
    long = complete({"prompt": "x" * 1_000_001})
    assert long.status_code == 400 and long.json()["error"]["code"] == "text_too_long"
    # A lone surrogate (JSON's "\ud800", not Unicode text) is a 400 wherever it is: chat text passed it on to
    # the engine, whose tokenizer fails on it; /v1/ocr said "not valid JSON" without saying where.
    raw = lambda path, text: requests.post(f"{rapid_server.url}{path}", timeout=30,  # noqa: E731
                                           data=text.encode(), headers={"content-type": "application/json"})
    chat = raw("/v1/chat/completions", '{"messages": [{"role": "user", "content": [{"type": "image_url", '
               f'"image_url": {{"url": "{url}"}}}}, {{"type": "text", "text": "read \\ud800"}}]}}]}}')
    assert chat.status_code == 400 and chat.json()["error"]["param"] == "messages.0.content.1.text", chat.text
    ocr = raw("/v1/ocr", '{"task": "vqa", "question": "\\ud800?"}').json()["error"]
    assert "not valid JSON" in ocr["message"] and "column" in ocr["message"], ocr


def test_openai_client_raises_typed_errors(client):
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "no image"}])
    assert info.value.status_code == 400
    assert "image" in info.value.message


@pytest.mark.parametrize(
    "prompt",
    [
        "先提取文字，再将文字内容翻译为日文。",  # a translation target rapidocr cannot build a prompt for
        "提取图片中的: [] 的字段内容，并按照 JSON 格式返回。",  # an extraction prompt with no fields
        "输出 姓名 的值。",
    ],
)
def test_prompts_the_cpu_engine_cannot_follow_still_get_the_text(client, card_url, prompt):
    _, url = card_url
    r = client.chat.completions.create(model="m", messages=_messages(url, prompt))
    assert r.model_extra["hyocr"]["task"] == "text"
    assert "JOHNSMITH" in squash(r.choices[0].message.content)


def test_image_urls_are_fetched_only_from_allowed_hosts(fake_server_factory):
    """URL inputs end to end: off by default; on with an allowlist (private hosts allowed here because
    the image server is on loopback)."""
    import http.server
    import threading

    png = card().png()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            self.send_response(200)
            self.send_header("Content-Type", "image/png")
            self.send_header("Content-Length", str(len(png)))
            self.end_headers()
            self.wfile.write(png)

        def log_message(self, *args):
            pass

    images = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=images.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{images.server_address[1]}/card.png"
    try:
        closed = fake_server_factory()
        r = requests.post(f"{closed.url}/v1/ocr", json={"image": url, "task": "text"}, timeout=30)
        assert r.status_code == 400 and r.json()["error"]["code"] == "url_inputs_disabled"
        public_only = fake_server_factory(allowed_media_domains="127.0.0.1")
        r = requests.post(f"{public_only.url}/v1/ocr", json={"image": url, "task": "text"}, timeout=30)
        assert r.status_code == 400 and r.json()["error"]["code"] == "url_not_allowed"
        open_ = fake_server_factory(allowed_media_domains="127.0.0.1", media_fetch_allow_private=True)
        r = requests.post(f"{open_.url}/v1/ocr", json={"image": url, "task": "text"}, timeout=30)
        assert r.status_code == 200, r.text
        assert (r.json()["pages"][0]["width"], r.json()["pages"][0]["height"]) == (1024, 640)
        chat = open_.url + "/v1/chat/completions"
        body = {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                                           {"type": "text", "text": "hi"}]}]}
        assert requests.post(chat, json=body, timeout=30).status_code == 200
    finally:
        images.shutdown()


def test_json_routes_refuse_other_content_types_with_415(rapid_server, card_url):
    """A browser may post text/plain or a form cross-site without a preflight; such a body, or one without a
    type, is a 415 naming application/json (it was a 400 about "a valid dictionary")."""
    _, url = card_url
    body = json.dumps({"model": "m", "messages": _messages(url, "提取图中的文字。")})
    for path in ("/v1/chat/completions", "/v1/completions", "/v1/batches"):
        for declared in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=zz",
                         None):
            headers = {"Content-Type": declared} if declared else {}
            r = requests.post(f"{rapid_server.url}{path}", data=body.encode(), headers=headers, timeout=30)
            assert r.status_code == 415, (path, declared, r.text)
            error = r.json()["error"]
            assert error["code"] == "unsupported_media_type" and error["param"] == "content-type", error
            assert "application/json" in error["message"], error
    # the JSON types themselves still pass
    for declared in ("application/json", "application/json; charset=utf-8"):
        r = requests.post(f"{rapid_server.url}/v1/chat/completions", data=body.encode(),
                          headers={"Content-Type": declared}, timeout=30)
        assert r.status_code == 200, (declared, r.text)
