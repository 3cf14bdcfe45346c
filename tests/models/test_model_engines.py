"""The transformers and vLLM engines serving a real (tiny, random-weight) HunyuanOCR checkpoint
through the HTTP API. With random weights the text is noise, so the assertions are on what is
deterministic: prompt token counts, usage, streaming order, finish reasons, aborts, errors, and
that the two engines agree token for token under greedy decoding."""

from __future__ import annotations

import base64
import json
import time

import openai
import pytest
import requests
from imaging import card, render, Line

from hyocr.hunyuan.geometry import visual_tokens

CARD = card()
CARD_URL = "data:image/png;base64," + base64.b64encode(CARD.png()).decode()
TEXT_PROMPT = "提取图中的文字。"


def _messages(text: str = TEXT_PROMPT, url: str = CARD_URL) -> list[dict]:
    return [
        {"role": "system", "content": ""},
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": text}]},
    ]


def _client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0, timeout=120)


def _text_tokens(tiny_checkpoint, text: str) -> int:
    """Prompt tokens other than the image's, from the checkpoint's own tokenizer and template."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_checkpoint)
    content = [{"type": "image"}, {"type": "text", "text": text}]
    rendered = tok.apply_chat_template(
        [{"role": "system", "content": ""}, {"role": "user", "content": content}], tokenize=False,
        add_generation_prompt=True,
    )
    ids = tok(rendered, add_special_tokens=False)["input_ids"]
    # The placeholder expands to visual_tokens() tokens (rows + the adapter's begin/end); the image
    # start/end wrapper tokens around it stay as they are.
    return len(ids) - 1


def test_chat_usage_counts_the_image_tokens_of_the_real_processor(model_server, tiny_checkpoint):
    r = _client(model_server).chat.completions.create(model="x", messages=_messages(), max_tokens=6)
    width, height = CARD.image.size
    expected = visual_tokens(height, width) + _text_tokens(tiny_checkpoint, TEXT_PROMPT)
    assert r.usage.prompt_tokens == expected
    assert r.usage.completion_tokens == 6 and r.choices[0].finish_reason == "length"
    assert r.model == "hunyuanocr-tiny"
    assert r.model_extra["hyocr"]["task"] == "text"


def test_greedy_output_is_identical_across_engines(hf_server, vllm_server):
    outputs = []
    for server in (hf_server, vllm_server):
        r = _client(server).chat.completions.create(model="x", messages=_messages(), max_tokens=12, temperature=0)
        outputs.append(r.choices[0].message.content)
    assert outputs[0] and outputs[0] == outputs[1]


def test_streaming_order_and_finish(model_server):
    stream = _client(model_server).chat.completions.create(
        model="x", messages=_messages(), max_tokens=10, stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["length"]
    assert chunks[-1].usage.completion_tokens == 10
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert len(text) > 0


def test_loop_guard_stops_a_degenerate_generation(model_server):
    # Random weights loop on one token: the guard must stop it long before max_tokens.
    r = _client(model_server).chat.completions.create(model="x", messages=_messages(), max_tokens=1000)
    assert r.model_extra["hyocr"]["finish_reason"] == "repetition"
    assert r.usage.completion_tokens < 300
    assert len(r.choices[0].message.content) < 200  # the repeated tail is cut to one unit


def test_ocr_api_pages_in_order_with_summed_usage(model_server):
    small = render([Line("PAGE TWO", (20, 20))], size=(400, 300))
    body = {"images": [CARD_URL, base64.b64encode(small.png()).decode()], "task": "spotting", "max_tokens": 5}
    r = requests.post(f"{model_server.url}/v1/ocr", json=body, timeout=120)
    assert r.status_code == 200, r.text
    data = r.json()
    assert [p["index"] for p in data["pages"]] == [0, 1]
    assert [(p["width"], p["height"]) for p in data["pages"]] == [(1024, 640), (400, 300)]
    assert all(p["finish_reason"] == "length" for p in data["pages"])
    assert data["usage"]["completion_tokens"] == 10
    # the small page was scaled up to the model's 512x512 minimum: fewer tokens than the card
    assert data["usage"]["prompt_tokens"] > 2 * visual_tokens(300, 400)


def test_extraction_prompt_reaches_the_model_and_non_json_is_reported(model_server):
    body = {"image": CARD_URL, "task": "extract", "fields": ["name", "id"], "max_tokens": 8}
    r = requests.post(f"{model_server.url}/v1/ocr", json=body, timeout=120)
    page = r.json()["pages"][0]
    assert page["fields"] is None and "not valid JSON" in page["error"]


def test_prompt_longer_than_the_context_is_a_400(model_server):
    huge = "x" * 20000  # byte-level tokens: far past max_model_len 8192
    r = requests.post(f"{model_server.url}/v1/chat/completions",
                      json={"messages": _messages(huge), "max_tokens": 4}, timeout=120)
    assert r.status_code in (400, 413), r.text
    assert "error" in r.json()


def test_disconnect_aborts_the_generation(model_server):
    # loop_guard off: random weights repeat, and the guard would end the stream by itself
    body = json.dumps({"messages": _messages(), "max_tokens": 4000, "stream": True, "loop_guard": False}).encode()
    engine = model_server.engine
    before = getattr(engine, "cancelled_rows", 0)
    with requests.post(f"{model_server.url}/v1/chat/completions", data=body, stream=True, timeout=120,
                       headers={"content-type": "application/json"}) as r:
        assert r.status_code == 200
        next(r.iter_lines())  # generation has started
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if engine.info.name == "vllm":
            if engine.unfinished_requests() == 0:
                break
        elif engine.cancelled_rows > before:
            break
        time.sleep(0.1)
    else:
        pytest.fail("the engine kept generating for a client that left")


def test_models_endpoint_reports_engine_and_checkpoint(model_server, tiny_checkpoint):
    data = _client(model_server).models.list().data[0]
    assert data.id == "hunyuanocr-tiny"
    assert data.model_extra["hyocr"]["engine"] in ("transformers", "vllm")
    assert data.model_extra["hyocr"]["path"] == str(tiny_checkpoint)


def test_vllm_engine_process_loads_hyocrs_worker_extension(vllm_server):
    """The extension (engines/vllm/vision.py) is imported inside vLLM's engine process and answers the
    engine's RPC: on vLLM 0.32+ (HunYuanVL through transformers) it reports leaving the encoder alone."""
    details = _client(vllm_server).models.list().data[0].model_extra["hyocr"]
    assert "transformers backend" in details["vision_encoder"] or "encoder active" in details["vision_encoder"]


def test_lora_adapter_is_listed_selected_by_model_name_and_applied(vllm_server):
    client = _client(vllm_server)
    models = {m.id: m for m in client.models.list().data}
    assert models["invoices"].model_extra["parent"] == "hunyuanocr-tiny"
    extra = {"loop_guard": False}
    base = client.chat.completions.create(model="hunyuanocr-tiny", messages=_messages(), max_tokens=8, extra_body=extra)
    tuned = client.chat.completions.create(model="invoices", messages=_messages(), max_tokens=8, extra_body=extra)
    assert tuned.model == "invoices" and base.model == "hunyuanocr-tiny"
    assert tuned.choices[0].message.content != base.choices[0].message.content  # the adapter's weights ran
    ocr = requests.post(f"{vllm_server.url}/v1/ocr", json={"image": CARD_URL, "task": "text", "model": "invoices",
                                                           "max_tokens": 4}, timeout=120)
    assert ocr.json()["model"] == "invoices"


def test_a_checkpoint_in_a_subfolder_is_served_and_reported(tiny_checkpoint, tmp_path):
    """HunyuanOCR 1.0 lives in v1.0/ of the hub repo: --subfolder selects it (transformers engine)."""
    import shutil

    from hyocr.config import load_settings
    from servers import LiveServer

    repo = tmp_path / "repo"
    shutil.copytree(tiny_checkpoint, repo / "v1.0")
    server = LiveServer(load_settings(engine="transformers", model=str(repo), subfolder="v1.0")).start()
    try:
        r = _client(server).chat.completions.create(model="x", messages=_messages(), max_tokens=3)
        assert r.usage.completion_tokens == 3
        info = _client(server).models.list().data[0].model_extra["hyocr"]
        assert info["subfolder"] == "v1.0" and info["path"] == str(repo)
    finally:
        server.stop()


def test_vllm_statistics_are_on_the_metrics_endpoint(vllm_server):
    _client(vllm_server).chat.completions.create(model="x", messages=_messages(), max_tokens=2)
    text = requests.get(f"{vllm_server.url}/metrics", timeout=10).text
    assert "hyocr_requests_total" in text
    assert "vllm:num_requests_running" in text and "vllm:kv_cache_usage_perc" in text


def test_images_processed_in_worker_processes_give_the_same_output(vllm_server, tiny_checkpoint):
    """PREPROCESS=processes: vLLM's renderer in spawned workers; what they hand the engine is what the
    in-process renderer makes (same greedy output, same prompt tokens), and the workers go with the server."""
    import psutil

    from hyocr.config import load_settings
    from servers import LiveServer

    settings = load_settings(engine="vllm", model=str(tiny_checkpoint), served_model_name="hunyuanocr-tiny",
                             dtype="bfloat16", max_model_len=8192, max_num_seqs=8, trust_remote_code=True,
                             preprocess="processes", preprocess_workers=2, ui=False)
    server = LiveServer(settings).start(timeout=300)
    try:
        pids = server.engine.process_renderer.pids()
        assert len(pids) == 2 and all(psutil.pid_exists(pid) for pid in pids)
        # Every image the workers prepare has a name of its own: the engine's encoder cache goes by it.
        from hyocr.engines.vllm.preprocess import _render
        from hyocr.types import EngineRequest, PageImage, Task

        request = EngineRequest("names", Task.TEXT, TEXT_PROMPT, (PageImage(card().image),))
        prompt = {"prompt": server.engine.templated_prompt(request), "multi_modal_data": {"image": request.images[0].image}}
        rendered = [server.engine.process_renderer.pool.submit(_render, prompt) for _ in range(6)]
        names = [f.result(timeout=60)["mm_hashes"]["image"][0] for f in rendered]
        assert len(set(names)) == 6 and not any(name.startswith("renderer0-") for name in names)
        answers = []
        for target in (vllm_server, server):
            r = _client(target).chat.completions.create(model="x", messages=_messages(), max_tokens=12, temperature=0)
            answers.append((r.choices[0].message.content, r.usage.prompt_tokens))
        assert answers[0][0] and answers[0] == answers[1]
        # A worker killed between requests: the next request is served by fresh workers, not failed.
        psutil.Process(pids[0]).kill()
        psutil.Process(pids[0]).wait(timeout=10)
        r = _client(server).chat.completions.create(model="x", messages=_messages(), max_tokens=12, temperature=0)
        assert (r.choices[0].message.content, r.usage.prompt_tokens) == answers[0]
        assert not set(server.engine.process_renderer.pids()) & set(pids)
        pids += server.engine.process_renderer.pids()
    finally:
        server.stop()
    deadline = time.monotonic() + 20
    while any(psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE for pid in pids):
        assert time.monotonic() < deadline, "preprocessing workers outlived the server"
        time.sleep(0.2)


def test_vllm_kv_cache_is_sized_from_the_workload(vllm_server, tiny_checkpoint):
    """The running engine was built with max_num_seqs x expected_tokens of KV cache (8 x the page-sized
    default), not a fraction of the device, and vLLM's own cache_config_info reports a size.
    (vLLM's CPU platform then applies VLLM_CPU_KVCACHE_SPACE instead; a GPU keeps the given size.)"""
    import torch
    from prometheus_client.parser import text_string_to_metric_families

    from hyocr.engines.vllm.tuning import kv_cache_bytes

    config = json.loads((tiny_checkpoint / "config.json").read_text())
    engine = vllm_server.engine
    assert engine.expected_tokens > 5000  # a page at the pixel bound with its output (tuning.page_expected_tokens)
    expected = kv_cache_bytes(config, max_num_seqs=8, expected_tokens=engine.expected_tokens, max_model_len=8192,
                              dtype="bfloat16")
    assert engine.engine_args["kv_cache_memory_bytes"] == expected
    assert engine.engine.vllm_config.cache_config.kv_cache_memory_bytes is not None
    text = requests.get(f"{vllm_server.url}/metrics", timeout=10).text
    info = [sample.labels for family in text_string_to_metric_families(text) if family.name == "vllm:cache_config_info"
            for sample in family.samples]
    assert info and int(info[0]["kv_cache_memory_bytes"]) > 0
    if torch.cuda.is_available():
        assert info[0]["kv_cache_memory_bytes"] == str(expected)


def test_engine_death_is_detected_requests_fail_fast_and_it_is_restarted(vllm_server):
    """Runs last (it kills the session's vLLM engine): readiness goes false, requests get a 503 at
    once, and the supervisor starts a new engine that serves again."""
    import psutil

    def engine_core(p: psutil.Process) -> bool:
        try:
            return "EngineCore" in " ".join(p.cmdline() + [p.name()])
        except (psutil.ZombieProcess, psutil.NoSuchProcess):  # an exited process of an earlier test
            return False

    cores = [p for p in psutil.Process().children(recursive=True) if engine_core(p)]
    assert cores, "no vLLM EngineCore process found"
    for proc in cores:
        proc.kill()
    deadline = time.monotonic() + 15
    while requests.get(f"{vllm_server.url}/ready", timeout=5).status_code == 200:
        assert time.monotonic() < deadline, "readiness still true 15 s after the engine died"
        time.sleep(0.2)
    started = time.monotonic()
    r = requests.post(f"{vllm_server.url}/v1/chat/completions", json={"messages": _messages(), "max_tokens": 4}, timeout=30)
    # engine_dead from the engine, or engine_restarting once the supervisor has begun its restart
    assert r.status_code == 503 and r.json()["error"]["code"] in ("engine_dead", "engine_restarting")
    assert int(r.headers["Retry-After"]) > 0 and time.monotonic() - started < 5
    deadline = time.monotonic() + 240
    while requests.get(f"{vllm_server.url}/ready", timeout=5).status_code != 200:
        assert time.monotonic() < deadline, "the vLLM engine was not restarted"
        time.sleep(1)
    r = _client(vllm_server).chat.completions.create(model="x", messages=_messages(), max_tokens=3)
    assert r.usage.completion_tokens == 3
