"""The plain PyTorch baseline: transformers' own ``generate()`` on static batches, as a user without a
serving stack would run HunyuanOCR (the model card's recipe, batched and left-padded).

    python benchmarks/hf_generate.py CHECKPOINT OUT.json [--workload card] [--batch 32] [--requests 64]
                                     [--max-tokens 150]

The images are ``hyocr bench``'s seeded workload; every request generates exactly --max-tokens (random
weights: EOS suppressed with min_new_tokens). One warm-up batch, then the timed batches back to back; the
time includes the processor (images to pixels), as it would for a user. Writes a JSON record.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("checkpoint")
    parser.add_argument("output")
    parser.add_argument("--workload", default="card")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=150)
    parser.add_argument("--no-cudnn", action="store_true",
                        help="generate() with SDPA's cuDNN backend excluded, as hyocr's engine runs its forwards")
    args = parser.parse_args()

    import torch
    from transformers import AutoModelForImageTextToText

    from hyocr.bench.run import DEFAULT_PROMPT
    from hyocr.bench.workload import Workload
    from hyocr.engines.transformers import load_processor
    from hyocr.engines.transformers.batch import attention_kernels

    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    processor = load_processor(args.checkpoint)
    processor.tokenizer.padding_side = "left"
    model = AutoModelForImageTextToText.from_pretrained(args.checkpoint, dtype=dtype).to(device).eval()
    workload = Workload(args.workload, DEFAULT_PROMPT, args.max_tokens, True)

    def run(indices: list[int]) -> float:
        started = time.perf_counter()
        texts, images = [], []
        for i in indices:
            messages = [{"role": "system", "content": ""},
                        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": workload.prompt}]}]
            texts.append(processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True))
            images.append(workload.image(i))
        inputs = processor(text=texts, images=images, padding=True, return_tensors="pt").to(device)
        with torch.inference_mode(), attention_kernels(device, cudnn=not args.no_cudnn):
            out = model.generate(**inputs, max_new_tokens=args.max_tokens, min_new_tokens=args.max_tokens,
                                 do_sample=False, temperature=None, top_p=None, top_k=None)
        assert out.shape[1] - inputs["input_ids"].shape[1] == args.max_tokens
        if device == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - started

    run(list(range(10_000, 10_000 + args.batch)))  # warm-up: kernels, allocator
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    batches, started = [], time.perf_counter()
    for first in range(0, args.requests, args.batch):
        batches.append(run(list(range(first, min(first + args.batch, args.requests)))))
    elapsed = time.perf_counter() - started
    record = {
        "label": f"transformers generate(), static batches of {args.batch}" + (", cuDNN SDPA excluded" if args.no_cudnn else ""),
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "hardware": torch.cuda.get_device_name() if device == "cuda" else platform.processor(),
        "versions": {"torch": torch.__version__, "transformers": __import__("transformers").__version__},
        "weights": "random (HunyuanOCR 1.0 architecture)",
        "workload": {"name": args.workload, "size": list(workload.size), "max_tokens": args.max_tokens},
        "batch": args.batch, "requests": args.requests,
        "throughput_rps": round(args.requests / elapsed, 3),
        "batch_seconds": [round(b, 3) for b in batches],
        "mean_latency_s": round(sum(batches) / len(batches), 3),  # every request of a batch ends with it
        "output_tokens_per_s": round(args.requests * args.max_tokens / elapsed, 1),
        "peak_gpu_memory_bytes": torch.cuda.max_memory_allocated() if device == "cuda" else None,
    }
    Path(args.output).write_text(json.dumps(record, indent=2) + "\n")
    print(json.dumps(record))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
