"""The Ray Serve application's deployment options, from the settings (the live application runs in
tests/e2e/test_ray_serve.py)."""

from __future__ import annotations

import pytest

from hyocr.config import load_settings

pytest.importorskip("ray.serve")
from hyocr.ray.serve import app_builder, engine_options  # noqa: E402


def test_a_fixed_replica_count_with_the_engines_resources_and_drain():
    options = engine_options(load_settings(engine="vllm", model="m", ray=True, ray_replicas=3,
                                           tensor_parallel_size=2, drain_timeout=45))
    assert options["num_replicas"] == 3 and "autoscaling_config" not in options
    assert options["ray_actor_options"] == {"num_cpus": 1.0, "num_gpus": 2.0}
    assert options["graceful_shutdown_timeout_s"] == 50  # past the API's own drain deadline
    assert options["max_ongoing_requests"] == 64  # what one engine batches (MAX_CONCURRENCY)


def test_autoscaling_between_the_minimum_and_maximum_on_requests_in_flight():
    options = engine_options(load_settings(ray=True, ray_replicas=2, ray_max_replicas=8, max_concurrency=32))
    assert "num_replicas" not in options
    assert options["autoscaling_config"] == {"min_replicas": 2, "max_replicas": 8, "target_ongoing_requests": 16.0}
    chosen = engine_options(load_settings(ray=True, ray_max_replicas=4, ray_target_ongoing_requests=5))
    assert chosen["autoscaling_config"]["target_ongoing_requests"] == 5


def test_serve_runs_builder_takes_settings_by_name_and_refuses_bad_ones_readably():
    app = app_builder({"engine": "rapidocr", "ray_replicas": "2"})  # `serve run ... ray_replicas=2`: strings
    assert type(app).__name__ == "Application"
    with pytest.raises(ValueError, match="ray_max_replicas"):
        app_builder({"ray_replicas": 4, "ray_max_replicas": 2})
