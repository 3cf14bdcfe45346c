"""hyocr's vLLM defaults: the KV cache sized from the workload, not a blanket fraction of the GPU."""

from __future__ import annotations

import json

import pytest

from hyocr.config import SettingsError, load_settings
from hyocr.engines.vllm.args import vllm_engine_args
from hyocr.engines.vllm.tuning import kv_bytes_per_token, kv_cache_bytes, preprocess_workers, size_engine

# HunyuanOCR 1.0's language model as the hub's flat config.json spells it (HUNYUANOCR.md).
HUB_CONFIG = {"num_hidden_layers": 24, "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
              "attention_head_dim": 128, "hidden_size": 1024, "max_position_embeddings": 32768}


def test_kv_bytes_per_token_of_hunyuanocr_1_0():
    # K and V x 24 layers x 8 KV heads x 128 dims x 2 bytes (bf16) = 96 KiB a token.
    assert kv_bytes_per_token(HUB_CONFIG) == 98_304
    assert kv_bytes_per_token({"text_config": HUB_CONFIG}) == 98_304  # transformers 5's nested layout
    assert kv_bytes_per_token(HUB_CONFIG, "float32") == 2 * 98_304
    no_head_dim = {k: v for k, v in HUB_CONFIG.items() if k not in ("head_dim", "attention_head_dim")}
    assert kv_bytes_per_token(no_head_dim) == 2 * 24 * 8 * (1024 // 16) * 2


def test_cards_at_concurrency_64_need_a_few_gib_not_the_whole_gpu():
    size = kv_cache_bytes(HUB_CONFIG, max_num_seqs=64, expected_tokens=1024, max_model_len=None)
    assert size == int(64 * 1024 * 98_304 * 1.05)
    assert 6 * 2**30 < size < 7 * 2**30


def test_the_cache_always_holds_one_full_context_sequence():
    size = kv_cache_bytes(HUB_CONFIG, max_num_seqs=1, expected_tokens=1024, max_model_len=None)
    assert size == int(32768 * 98_304 * 1.05)
    assert kv_cache_bytes(HUB_CONFIG, max_num_seqs=1, expected_tokens=1024, max_model_len=4096) == int(
        4096 * 98_304 * 1.05)


def test_size_engine_reads_the_checkpoint_and_respects_explicit_choices(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(HUB_CONFIG))
    args = {"model": str(tmp_path), "max_num_seqs": 64, "dtype": "bfloat16"}
    sized = size_engine(args, expected_tokens=1024)
    assert sized["kv_cache_memory_bytes"] == kv_cache_bytes(HUB_CONFIG, max_num_seqs=64, expected_tokens=1024,
                                                            max_model_len=None)
    for explicit in ({"gpu_memory_utilization": 0.5}, {"kv_cache_memory_bytes": 123}):
        assert size_engine({**args, **explicit}, expected_tokens=1024) == {**args, **explicit}
    assert "kv_cache_memory_bytes" not in size_engine(args, expected_tokens=0)  # 0: vLLM's fraction
    # A model whose config.json can't be read (not a folder, not a reachable repo): vLLM's own sizing.
    missing = str(tmp_path / "nowhere")
    assert "kv_cache_memory_bytes" not in size_engine({**args, "model": missing}, expected_tokens=1024)


@pytest.mark.parametrize(("requested", "cpus", "expected"), [(3, 16, 3), (0, 16, 8), (0, 64, 8), (0, 2, 1)])
def test_preprocess_workers(monkeypatch, requested, cpus, expected):
    monkeypatch.setattr("os.cpu_count", lambda: cpus)
    assert preprocess_workers(requested) == expected


def test_engine_args_carry_the_hunyuanocr_defaults_and_the_users_overrides():
    args = vllm_engine_args(load_settings(engine="vllm", model="/m", preprocess_workers=4))
    assert args["max_num_batched_tokens"] == 8192 and args["renderer_num_workers"] == 4
    assert args["mm_processor_cache_gb"] == 0 and args["enable_prefix_caching"] is False
    assert "gpu_memory_utilization" not in args  # sized from the workload at start
    assert args["stream_interval"] == 4  # deltas of 4 tokens: a quarter of the per-delta work, same TTFT
    args = vllm_engine_args(load_settings(engine="vllm", model="/m", max_num_batched_tokens=16384,
                                          gpu_memory_utilization=0.3, stream_interval=1))
    assert args["max_num_batched_tokens"] == 16384 and args["gpu_memory_utilization"] == 0.3
    assert args["stream_interval"] == 1


def test_a_hub_id_is_sized_from_its_cached_config(tmp_path, monkeypatch):
    """tencent/HunyuanOCR (1.5 at the repo root) is given as a hub id: its config.json comes from the cache."""
    cached = tmp_path / "config.json"
    cached.write_text(json.dumps(HUB_CONFIG))
    calls = []

    def fake_download(repo, filename, revision=None):
        calls.append((repo, filename, revision))
        return str(cached)

    monkeypatch.setattr("huggingface_hub.hf_hub_download", fake_download)
    sized = size_engine({"model": "tencent/HunyuanOCR", "revision": "abc", "max_num_seqs": 8},
                        expected_tokens=1024)
    assert calls == [("tencent/HunyuanOCR", "config.json", "abc")]
    assert sized["kv_cache_memory_bytes"] == kv_cache_bytes(HUB_CONFIG, max_num_seqs=8, expected_tokens=1024,
                                                            max_model_len=None)


def test_the_default_sizes_the_cache_for_pages_so_neither_workload_is_preempted():
    from hyocr.engines.vllm.engine import VllmEngine
    from hyocr.engines.vllm.tuning import page_expected_tokens
    from hyocr.hunyuan.geometry import PixelBounds, visual_tokens

    settings = load_settings(engine="vllm", model="/m")
    tokens = page_expected_tokens(settings.min_pixels, settings.max_pixels)
    a4 = visual_tokens(1720, 2433, PixelBounds(settings.min_pixels, settings.max_pixels))  # hyocr's A4 render
    assert a4 + 1000 < tokens < a4 + 1200  # an A4 page with ~1000 tokens out fits its share
    assert VllmEngine.from_settings(settings).expected_tokens == tokens
    assert VllmEngine.from_settings(load_settings(engine="vllm", model="/m", expected_tokens=850)).expected_tokens == 850
    # 64 pages at once on HunyuanOCR 1.0: ~32 GiB of KV, which an H200 holds
    assert 31 * 2**30 < kv_cache_bytes(HUB_CONFIG, max_num_seqs=64, expected_tokens=tokens, max_model_len=None) \
        < 33 * 2**30


def test_a_gpu_too_small_for_the_sized_cache_gets_vllms_fraction_instead(tmp_path, caplog):
    (tmp_path / "config.json").write_text(json.dumps(HUB_CONFIG))
    args = {"model": str(tmp_path), "max_num_seqs": 64, "dtype": "bfloat16"}
    on_h200 = size_engine(args, expected_tokens=5218, device_bytes=141 * 10**9)
    # the start check asks for this core's footprint to be free (cache + 8 GiB), not vLLM's 0.9
    assert "kv_cache_memory_bytes" in on_h200 and 0.25 < on_h200["gpu_memory_utilization"] < 0.35
    on_24gb = size_engine(args, expected_tokens=5218, device_bytes=24 * 2**30)
    assert on_24gb == {**args, "gpu_memory_utilization": 0.9}
    assert "does not fit this GPU" in caplog.text
    assert "kv_cache_memory_bytes" in size_engine(args, expected_tokens=1024, device_bytes=24 * 2**30)  # cards fit


def test_structured_outputs_are_compact_and_speculative_decoding_passes_through():
    import pytest

    from hyocr.config import SettingsError
    from hyocr.engines.vllm.engine import VllmEngine

    args = vllm_engine_args(load_settings(engine="vllm", model="/m"))
    assert args["structured_outputs_config"] == {"backend": "xgrammar", "disable_any_whitespace": True}
    assert "speculative_config" not in args
    dflash = '{"method": "dflash", "model": "/m/dflash", "num_speculative_tokens": 15}'
    settings = load_settings(engine="vllm", model="/m", speculative_config=dflash)
    assert vllm_engine_args(settings)["speculative_config"] == {"method": "dflash", "model": "/m/dflash",
                                                                "num_speculative_tokens": 15}
    engine = VllmEngine.from_settings(settings)
    assert engine.info.details["speculative_decoding"] == "dflash, 15 tokens, draft /m/dflash"
    assert engine.info.structured
    with pytest.raises((SettingsError, ValueError)):
        load_settings(engine="vllm", model="/m", speculative_config="[15]")


def test_several_cores_share_one_gpu_each_with_its_own_footprint(tmp_path, caplog):
    (tmp_path / "config.json").write_text(json.dumps(HUB_CONFIG))
    args = {"model": str(tmp_path), "max_num_seqs": 64, "dtype": "bfloat16"}
    h200 = 143_771 * 2**20  # what NVML reports of an H200
    one = size_engine(args, expected_tokens=5218, device_bytes=h200)
    three = size_engine(args, expected_tokens=5218, device_bytes=h200, cores=3)
    assert three == one  # three page-sized cores fit an H200 whole: 3 x (32 + 8) GiB
    assert 3 * (three["kv_cache_memory_bytes"] + 8 * 2**30) <= 0.9 * h200
    assert 3 * three["gpu_memory_utilization"] <= 0.9 + 0.03  # each start check asks only for its own share
    four = size_engine(args, expected_tokens=5218, device_bytes=h200, cores=4)  # would not: shrunk to fit
    assert four["kv_cache_memory_bytes"] < three["kv_cache_memory_bytes"]
    assert 4 * (four["kv_cache_memory_bytes"] + 8 * 2**30) <= 0.9 * h200 and "per core does not fit" in caplog.text
    with pytest.raises(SettingsError, match="16 engine cores do not fit"):
        size_engine(args, expected_tokens=5218, device_bytes=24 * 2**30, cores=16)
    # a size the user gave is kept; the start check still asks only for its footprint
    given = size_engine({**args, "kv_cache_memory_bytes": 10 * 2**30}, expected_tokens=5218, device_bytes=h200,
                        cores=2)
    assert given["kv_cache_memory_bytes"] == 10 * 2**30 and given["gpu_memory_utilization"] == pytest.approx(0.13)  # 18 of 140 GiB


def test_an_fp8_kv_cache_is_sized_at_a_byte_an_element(tmp_path):
    """KV_CACHE_DTYPE=fp8 (or VLLM_ARGS' kv_cache_dtype) halves what the workload's cache takes, so a core's
    footprint and its start check shrink with it: three cores on an 80 GB H100 then hold nearly all of the page
    workload's sequences each, where bf16 holds half of them."""
    (tmp_path / "config.json").write_text(json.dumps(HUB_CONFIG))
    args = {"model": str(tmp_path), "max_num_seqs": 64, "dtype": "bfloat16"}
    bf16 = size_engine(args, expected_tokens=5218)["kv_cache_memory_bytes"]
    for chosen in ("fp8", "fp8_e4m3", "fp8_e5m2"):
        fp8 = size_engine({**args, "kv_cache_dtype": chosen}, expected_tokens=5218)["kv_cache_memory_bytes"]
        assert abs(2 * fp8 - bf16) <= 2
    assert size_engine({**args, "kv_cache_dtype": "auto"}, expected_tokens=5218)["kv_cache_memory_bytes"] == bf16
    h100 = 81_559 * 2**20  # what NVML reports of an H100 80GB
    share = {dtype: size_engine({**args, "kv_cache_dtype": dtype}, expected_tokens=5218, device_bytes=h100, cores=3)
             for dtype in ("auto", "fp8")}
    held = {dtype: sized["kv_cache_memory_bytes"] / (bf16 / (2 if dtype == "fp8" else 1))
            for dtype, sized in share.items()}  # the fraction of the workload's cache each core holds
    assert 0.45 < held["auto"] < 0.55 and held["fp8"] > 0.95
    assert 3 * share["fp8"]["gpu_memory_utilization"] <= 0.9 + 0.03


def test_kv_cache_dtype_is_a_setting_that_reaches_vllm():
    assert "kv_cache_dtype" not in vllm_engine_args(load_settings(engine="vllm", model="/m"))  # the model's dtype
    assert vllm_engine_args(load_settings(engine="vllm", model="/m", kv_cache_dtype="fp8"))["kv_cache_dtype"] == "fp8"
    with pytest.raises(SettingsError, match="kv_cache_dtype"):
        load_settings(engine="vllm", model="/m", kv_cache_dtype="int4")


def test_an_fp8_kv_cache_is_refused_at_once_where_vllms_cpu_backend_cannot_hold_it():
    """vLLM's CPU attention stores FP8 KV only with AVX-512 or AMX; elsewhere its engine dies a minute into the
    start. hyocr says so before anything starts, on this machine's real CPU (either answer is right for it)."""
    pytest.importorskip("vllm")
    import torch
    from vllm.platforms import current_platform

    from hyocr.engines.vllm.args import check_kv_cache_dtype

    check_kv_cache_dtype({"kv_cache_dtype": "auto"})  # nothing asked, nothing checked
    capable = torch.cpu._is_avx512_supported() or torch.cpu._is_amx_tile_supported()
    if not current_platform.is_cpu() or capable:
        check_kv_cache_dtype({"kv_cache_dtype": "fp8"})
    else:
        with pytest.raises(SettingsError, match="AVX-512 or AMX"):
            check_kv_cache_dtype({"kv_cache_dtype": "fp8"})
