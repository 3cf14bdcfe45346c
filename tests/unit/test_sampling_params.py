"""Sampling options travel from the wire to every engine: min_p was validated and then dropped."""

from __future__ import annotations

import pytest

from hyocr.api.convert import sampling_from
from hyocr.api.protocol import SamplingFields
from hyocr.config import load_settings
from hyocr.hunyuan.chat import sampling_kwargs
from hyocr.types import SamplingParams


def test_min_p_reaches_the_engines_sampling():
    sampling = sampling_from(SamplingFields(min_p=0.3, temperature=0.7, stop="END"), load_settings())
    assert sampling.min_p == 0.3 and sampling.stop == ("END",)
    assert sampling_kwargs(sampling)["min_p"] == 0.3  # vLLM's SamplingParams and an upstream's body
    assert "min_p" not in sampling_kwargs(SamplingParams())  # left open: the engine's default


def test_vllms_sampling_params_take_min_p():
    vllm = pytest.importorskip("vllm")
    params = vllm.SamplingParams(**sampling_kwargs(SamplingParams(temperature=1.0, min_p=0.25)))
    assert params.min_p == 0.25
