"""HunyuanOCR 1.0 vs 1.5 (hunyuan/versions.py): which a checkpoint is, its decoding defaults and bounds."""

from __future__ import annotations

import json

import pytest

from hyocr.engines.base import EngineInfo
from hyocr.hunyuan import versions
from hyocr.pipeline.engine_run import EngineRun
from hyocr.pipeline.progress import ProgressBoard
from hyocr.types import SamplingParams, Task

V10_FLAT = {"architectures": ["HunYuanVLForConditionalGeneration"], "max_position_embeddings": 32768,
            "vision_config": {"hidden_size": 1152}}
V15_NESTED = {"architectures": ["HunYuanVLForConditionalGeneration"],
              "text_config": {"max_position_embeddings": 131072}, "vision_config": {"hidden_size": 1152}}


def test_the_version_comes_from_the_context_or_the_image_bound():
    assert versions.detect(V10_FLAT, {"max_pixels": 2048 * 2048}) is versions.V1_0
    assert versions.detect(V15_NESTED, {"max_pixels": 2048 * 2048}) is versions.V1_5
    assert versions.detect(V10_FLAT, {"max_pixels": 4096 * 4096}) is versions.V1_5
    assert versions.detect(V15_NESTED, {}, override="1.0") is versions.V1_0


@pytest.mark.parametrize(("generation", "defaults"), [
    ({}, {"temperature": 0.0}),
    ({"do_sample": False, "temperature": 0.7}, {"temperature": 0.0}),  # HF ignores it without sampling
    ({"do_sample": False, "repetition_penalty": 1.08, "top_p": 1.0, "top_k": -1},
     {"temperature": 0.0, "repetition_penalty": 1.08}),
    ({"do_sample": True, "temperature": 0.6, "top_p": 0.9, "top_k": 20},
     {"temperature": 0.6, "top_p": 0.9, "top_k": 20}),
])
def test_generation_config_defaults(generation, defaults):
    assert versions.generation_defaults(generation) == defaults


def test_a_checkpoint_folder_is_read_in_either_layout(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(V15_NESTED))
    (tmp_path / "processor_config.json").write_text(json.dumps(
        {"image_processor": {"min_pixels": 262144, "max_pixels": 16777216}}))
    (tmp_path / "generation_config.json").write_text(json.dumps({"do_sample": False, "repetition_penalty": 1.08}))
    facts = versions.read_checkpoint(tmp_path)
    assert (facts.version, facts.context, facts.min_pixels, facts.max_pixels) == (versions.V1_5, 131072, 262144,
                                                                                  16777216)
    assert facts.defaults == {"temperature": 0.0, "repetition_penalty": 1.08}
    # hyocr's page bound (2048^2 by default) stays within the checkpoint's: 4K only when asked for
    assert versions.checkpoint_bounds(facts, 512 * 512, 2048 * 2048) == (262144, 2048 * 2048)
    assert versions.checkpoint_bounds(facts, 512 * 512, 8192 * 8192) == (262144, 16777216)
    empty = versions.read_checkpoint(tmp_path / "missing")
    assert empty.version is versions.V1_0 and empty.defaults == {"temperature": 0.0}


class _Engine:
    def __init__(self, defaults):
        self.info = EngineInfo("x", "m", frozenset({Task.TEXT}), True, defaults=defaults)


def test_the_checkpoints_defaults_fill_what_a_request_leaves_open():
    run = EngineRun(_Engine({"temperature": 0.0, "repetition_penalty": 1.08}), ProgressBoard(60.0), loop_guard=True,
                    default_max_tokens=4096)
    assert run.sampling(SamplingParams()) == SamplingParams(max_tokens=4096, temperature=0.0, repetition_penalty=1.08)
    asked = SamplingParams(max_tokens=9, temperature=0.5, repetition_penalty=1.0)
    assert run.sampling(asked) == asked
