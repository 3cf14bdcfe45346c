"""Scale-out settings: vLLM data parallelism sizes admission for every core; Ray's replica settings are
checked together, with messages that name the settings."""

from __future__ import annotations

import pytest

from hyocr.config import SettingsError, load_settings
from hyocr.engines.vllm.args import vllm_engine_args


def test_admission_left_at_its_defaults_grows_with_the_engine_cores(monkeypatch):
    one = load_settings(engine="vllm", model="m")
    two = load_settings(engine="vllm", model="m", data_parallel_size=2)
    assert (two.max_concurrency, two.max_queue) == (2 * one.max_concurrency, 2 * one.max_queue)
    assert load_settings(engine="vllm", model="m", data_parallel_size=2, max_concurrency=10).max_concurrency == 10
    monkeypatch.setenv("HYOCR_DATA_PARALLEL_SIZE", "4")  # the environment counts as much as a flag
    monkeypatch.setenv("HYOCR_MAX_QUEUE", "7")
    env = load_settings(engine="vllm", model="m")
    assert (env.max_concurrency, env.max_queue) == (4 * one.max_concurrency, 7)


def test_vllm_gets_the_data_parallel_size_only_when_there_are_several_cores():
    assert "data_parallel_size" not in vllm_engine_args(load_settings(engine="vllm", model="m"))
    args = vllm_engine_args(load_settings(engine="vllm", model="m", data_parallel_size=2, tensor_parallel_size=2))
    assert (args["data_parallel_size"], args["tensor_parallel_size"]) == (2, 2)


@pytest.mark.parametrize(("overrides", "message"), [
    ({"engine": "transformers", "data_parallel_size": 2}, "data_parallel_size > 1 needs the vllm engine"),
    ({"ray": True, "ray_replicas": 3, "ray_max_replicas": 2}, "ray_max_replicas (2) must be >= ray_replicas (3)"),
    ({"engine": "vllm", "ray": True, "api_processes": 2}, "ray and api_processes > 1 do not combine"),
])
def test_settings_that_do_not_combine_are_refused_by_name(overrides, message):
    with pytest.raises(SettingsError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_settings(**overrides)


def test_a_ray_replica_asks_for_the_gpus_its_engine_uses():
    assert load_settings(ray=True).ray_gpus == 0.0  # rapidocr: CPU only
    assert load_settings(engine="vllm", ray=True, tensor_parallel_size=2).ray_gpus == 2.0
    assert load_settings(engine="transformers", ray=True).ray_gpus == 1.0
    assert load_settings(engine="vllm", ray=True, ray_gpus_per_replica=0.5).ray_gpus == 0.5
