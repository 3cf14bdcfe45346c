"""What one decode step of the transformers engine costs, and where: the engine's own RunningBatch over
N card prompts, timed over many steps, with rows of one length (no padding, as in a static batch of
same-size cards) and of mixed lengths (left padding, as in a continuous batch), and a torch.profiler table
of the ops that take the CPU's time in a step.

    python benchmarks/transformers_step_cost.py CHECKPOINT OUT.json [--rows 32,64] [--steps 40]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("checkpoint")
    parser.add_argument("output")
    parser.add_argument("--rows", default="32,64")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--attention", default="sdpa,sdpa+cudnn",
                        help="attn_implementation(s), comma-separated; sdpa+cudnn: SDPA allowed to pick cuDNN")
    args = parser.parse_args()

    import torch
    from transformers import AutoModelForImageTextToText

    from hyocr.bench.run import DEFAULT_PROMPT
    from hyocr.bench.workload import Workload
    from hyocr.engines.transformers.batch import RunningBatch
    from hyocr.engines.transformers.prompts import encode, load_processor
    from hyocr.engines.transformers.rows import Job, Row, choose_tokens
    from hyocr.engines.vllm import pixels
    from hyocr.hunyuan.geometry import PixelBounds
    from hyocr.types import EngineRequest, PageImage, SamplingParams, Task

    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    pixels.install()
    processor = load_processor(args.checkpoint, backend="pil")
    workload = Workload("card", DEFAULT_PROMPT, 150, True)
    results: list[dict] = []

    def sync() -> None:
        if device == "cuda":
            torch.cuda.synchronize()

    for attention in args.attention.split(","):
        implementation, _, cudnn = attention.partition("+")
        model = AutoModelForImageTextToText.from_pretrained(args.checkpoint, dtype=dtype,
                                                            attn_implementation=implementation).to(device).eval()
        eos = set([model.generation_config.eos_token_id] if isinstance(model.generation_config.eos_token_id, int)
                  else model.generation_config.eos_token_id or [])

        def prompts(n: int, mixed: bool, model=model) -> list:
            out = []
            for i in range(n):
                image = workload.image(i)
                if mixed:  # a few sizes: rows of different lengths, padded on the left
                    image = image.resize((1024 - 64 * (i % 4), 640 - 32 * (i % 3)))
                request = EngineRequest(request_id=str(i), task=Task.TEXT, prompt=workload.prompt,
                                        images=(PageImage(image),),
                                        sampling=SamplingParams(max_tokens=10_000, ignore_eos=True))
                out.append((request, encode(request, processor, model, PixelBounds())))
            return out

        with torch.inference_mode():
            for n in [int(r) for r in args.rows.split(",")]:
                for mixed in (False, True):
                    encoded = prompts(n, mixed)
                    batch = RunningBatch(model, device)
                    batch.cudnn_attention = cudnn == "cudnn"  # the engine's default excludes it
                    batch.set_eos(eos)
                    rows = [Row(Job(r, p, None, None), processor.tokenizer, eos, None, device) for r, p in encoded]
                    logits = batch.prefill(rows, [p for _, p in encoded])
                    batch.set_last(choose_tokens(logits, rows, **batch.choice_inputs()))
                    record = {"attention": attention, "rows": n, "padded": mixed,
                              "prompt_lengths": sorted({p.length for _, p in encoded})}
                    for name, choose in (("forward only", False), ("forward + choose tokens", True)):
                        for _ in range(5):  # warm-up
                            out = batch.step()
                        sync()
                        started = time.perf_counter()
                        for _ in range(args.steps):
                            out = batch.step()
                            if choose:
                                batch.set_last(choose_tokens(out, batch.rows, **batch.choice_inputs()))
                        sync()
                        record[f"{name} ms/step"] = round((time.perf_counter() - started) / args.steps * 1000, 2)
                    from torch.profiler import ProfilerActivity, profile

                    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
                    with profile(activities=activities) as prof:
                        for _ in range(5):
                            batch.set_last(choose_tokens(batch.step(), batch.rows, **batch.choice_inputs()))
                        sync()
                    table = prof.key_averages()
                    top = sorted(table, key=lambda e: e.self_cpu_time_total, reverse=True)[:18]
                    record["top_self_cpu_ms_per_step"] = [(e.key, round(e.self_cpu_time_total / 5000, 3), e.count // 5)
                                                          for e in top]
                    if device == "cuda":
                        gpu = sorted(table, key=lambda e: getattr(e, "self_device_time_total", 0), reverse=True)[:10]
                        record["top_gpu_ms_per_step"] = [(e.key, round(e.self_device_time_total / 5000, 3)) for e in gpu]
                    record["launches_per_step"] = sum(e.count for e in table if e.key.startswith("cudaLaunchKernel")) // 5
                    results.append(record)
                    print(json.dumps({k: v for k, v in record.items() if not k.startswith("top")}), flush=True)
                    del batch, rows, logits, out
                    if device == "cuda":
                        torch.cuda.empty_cache()
        del model
    doc = {"label": "transformers engine: one decode step's cost", "date": datetime.now(UTC).isoformat(timespec="seconds"),
           "hardware": torch.cuda.get_device_name() if device == "cuda" else "cpu",
           "weights": "random (HunyuanOCR 1.0 architecture)", "results": results}
    Path(args.output).write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
