"""Raw vLLM baseline: AsyncLLM in-process, no HTTP, no hyocr, on the same seeded workload as
``hyocr bench`` (same images, prompt, sampling and request counts), reporting the same JSON schema.

    python benchmarks/raw_vllm.py CHECKPOINT OUT_{workload}.json [--workload card,page] [--concurrency 1,8,32,64]

vLLM's defaults plus the HunyuanOCR authors' serve flags (no prefix caching, no multimodal processor
cache): what a user gets from `vllm serve tencent/HunyuanOCR ...` minus the HTTP layer.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from hyocr.bench import report  # noqa: E402
from hyocr.bench.load import GpuMemorySampler, Sample, default_requests, summarize  # noqa: E402
from hyocr.bench.workload import Workload  # noqa: E402
from hyocr.engines.vllm.compat import apply_version_workarounds, hunyuan_backend  # noqa: E402
from hyocr.engines.vllm.engine import IMAGE_END, IMAGE_START  # noqa: E402
from hyocr.hunyuan.chat import IMAGE_PLACEHOLDER  # noqa: E402


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("checkpoint")
    parser.add_argument("output")
    parser.add_argument("--workload", default="card")
    parser.add_argument("--concurrency", default="1,8,32,64")
    parser.add_argument("--max-tokens", type=int, default=150)
    parser.add_argument("--trust-remote-code", action="store_true",
                        help="the tiny test checkpoint's image processor on machines without torchvision")
    parser.add_argument("--requests", action="append", default=[], metavar="WORKLOAD=N,N,...",
                        help="requests per level for a workload (default: hyocr bench's)")
    args = parser.parse_args()

    import vllm
    from vllm import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    apply_version_workarounds(vllm.__version__)
    engine = AsyncLLM.from_engine_args(AsyncEngineArgs(
        model=args.checkpoint, enable_prefix_caching=False, mm_processor_cache_gb=0, disable_log_stats=True,
        trust_remote_code=args.trust_remote_code,
    ))
    tokenizer = engine.get_tokenizer()
    messages = [{"role": "system", "content": ""},
                {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "提取图中的文字。"}]}]
    prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    for name in args.workload.split(","):
        await run_workload(engine, prompt, Workload(name, "提取图中的文字。", args.max_tokens, True), args)
    engine.shutdown()


async def run_workload(engine, prompt: str, workload: Workload, args) -> None:
    import vllm
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    if hunyuan_backend() == "native":
        prompt = prompt.replace(IMAGE_START + IMAGE_PLACEHOLDER + IMAGE_END, IMAGE_PLACEHOLDER)
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0, ignore_eos=True,
                            output_kind=RequestOutputKind.DELTA)

    images: dict[int, object] = {}  # drawn before the clock starts, as hyocr bench pre-encodes its bodies

    async def one(index: int, rid: str) -> Sample:
        image = images.pop(index) if index in images else workload.image(index)
        started = time.perf_counter()
        ttft, tokens, prompt_tokens = None, 0, 0
        async for out in engine.generate({"prompt": prompt, "multi_modal_data": {"image": image}}, params, rid):
            prompt_tokens = len(out.prompt_token_ids or ())
            tokens += len(out.outputs[0].token_ids)
            if ttft is None and out.outputs[0].token_ids:
                ttft = time.perf_counter() - started
        return Sample(True, time.perf_counter() - started, ttft, tokens, prompt_tokens)

    async def level(c: int, n: int, offset: int) -> dict:
        queue = list(range(offset, offset + n))
        images.update({i: workload.image(i) for i in queue})
        samples = []

        async def worker() -> None:
            while queue:
                i = queue.pop(0)
                samples.append(await one(i, f"raw-{i}"))

        with GpuMemorySampler() as gpu:
            started = time.perf_counter()
            await asyncio.gather(*(worker() for _ in range(c)))
            duration = time.perf_counter() - started
        return summarize(samples, concurrency=c, duration=duration, peak=gpu.peak).as_dict()

    # Same seeds and counts as hyocr bench: warm-up images from 10**6, levels from 0.
    await asyncio.gather(*(one(10**6 + i, f"warm-{i}") for i in range(4)))
    levels, offset = [], 0
    counts = dict(item.split("=", 1) for item in args.requests).get(workload.name)
    counts = [int(x) for x in counts.split(",")] if counts else None
    for i, c in enumerate(int(x) for x in args.concurrency.split(",")):
        n = counts[min(i, len(counts) - 1)] if counts else default_requests(c)
        levels.append(await level(c, n, offset))
        offset += n
        print(levels[-1], flush=True)
    meta = report.metadata("in-process", workload, "raw-vllm")
    meta["server"] = {"engine": "raw vLLM AsyncLLM", "vllm": vllm.__version__, "backend": hunyuan_backend(),
                      "model": args.checkpoint}
    doc = {"metadata": meta, "levels": levels, "sustained_concurrency": report.sustained(levels)}
    report.write(doc, args.output.format(workload=workload.name))
    print(report.markdown(doc))


if __name__ == "__main__":
    asyncio.run(main())
