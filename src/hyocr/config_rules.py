"""The rules that span several settings (``config.Settings`` inherits them): bounds that pair two values, and
what the scale-out modes need of each other. Each raises a ValueError whose text is the whole message."""

from __future__ import annotations

from typing import Self

from pydantic import model_validator
from pydantic_settings import BaseSettings


class CrossSettingRules(BaseSettings):
    @model_validator(mode="after")
    def _pixel_bounds(self) -> Self:
        if self.min_pixels > self.max_pixels:
            raise ValueError(f"min_pixels ({self.min_pixels}) must be <= max_pixels ({self.max_pixels})")
        return self

    @model_validator(mode="after")
    def _api_processes_need_vllm(self) -> Self:
        if self.api_processes == 1:
            return self
        if self.engine != "vllm":
            raise ValueError(f"api_processes > 1 needs the vllm engine (engine is {self.engine!r}): the other "
                             "engines live inside their server process")
        if self.rate_limit and self.rate_limit_storage.startswith("memory"):
            raise ValueError("rate limits across several API processes need a shared store: set "
                             "rate_limit_storage to redis://HOST:6379 (memory:// would count per process)")
        if self.max_concurrency < self.api_processes:  # the processes split it: each needs one slot
            raise ValueError(f"max_concurrency ({self.max_concurrency}) must be at least api_processes "
                             f"({self.api_processes}): it is split between them, one engine slot each at least")
        return self

    @model_validator(mode="before")
    @classmethod
    def _admission_per_core(cls, data: object) -> object:
        """With N engine cores (DATA_PARALLEL_SIZE x ENGINES_PER_GPU), vLLM runs MAX_NUM_SEQS on each: the
        admission limits left at their defaults grow with it (64 per core, as for one), so N cores are not fed
        by one core's share."""
        if not isinstance(data, dict):
            return data
        try:
            cores = int(data.get("data_parallel_size") or 1) * int(data.get("engines_per_gpu") or 1)
        except (TypeError, ValueError):
            return data  # the field's own validation reports it
        if cores > 1:
            for name in ("max_concurrency", "max_queue"):
                if data.get(name) is None:
                    data = {**data, name: cls.model_fields[name].default * cores}
        return data

    @model_validator(mode="after")
    def _scale_out(self) -> Self:
        if self.engines_per_gpu > 1 and self.engine != "vllm":
            raise ValueError(f"engines_per_gpu > 1 needs the vllm engine (engine is {self.engine!r})")
        if self.engines_per_gpu > 1 and self.api_processes > 1 and \
                self.api_processes > self.engines_per_gpu * self.data_parallel_size:
            raise ValueError(f"api_processes ({self.api_processes}) > engine cores ({self.engines_per_gpu} x "
                             f"{self.data_parallel_size}): each API process owns one core at least")
        if self.data_parallel_size > 1 and self.engine != "vllm":
            raise ValueError(f"data_parallel_size > 1 needs the vllm engine (engine is {self.engine!r}); "
                             "other engines scale out as Ray Serve replicas (ray)")
        if self.ray_max_replicas is not None and self.ray_max_replicas < self.ray_replicas:
            raise ValueError(f"ray_max_replicas ({self.ray_max_replicas}) must be >= ray_replicas "
                             f"({self.ray_replicas})")
        if self.ray and self.api_processes > 1:
            raise ValueError("ray and api_processes > 1 do not combine: on Ray, scale the API with ingress "
                             "replicas and the engine with ray_replicas")
        return self

    @model_validator(mode="after")
    def _pdf_dpi_range(self) -> Self:
        if not self.pdf_min_dpi <= min(self.pdf_max_dpi, self.pdf_detector_dpi):
            raise ValueError(f"pdf_min_dpi ({self.pdf_min_dpi}) must be <= pdf_max_dpi ({self.pdf_max_dpi}) "
                             f"and pdf_detector_dpi ({self.pdf_detector_dpi})")
        return self
