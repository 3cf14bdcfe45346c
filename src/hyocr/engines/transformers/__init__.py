"""HunyuanOCR on plain transformers, continuously batched (``--engine transformers``, extra ``hf``)."""

from .engine import TransformersEngine
from .prompts import load_processor
from .rows import IncrementalDecoder

__all__ = ["IncrementalDecoder", "TransformersEngine", "load_processor"]
