"""What turning one image into HunyuanOCR's model input costs on the CPU, and whether threads or
processes scale it: the question behind hyocr's preprocessing design (benchmarks/NOTES.md).

    python benchmarks/preprocess_cost.py CHECKPOINT [--images 32]

For each workload (card, page): the HF processor vLLM uses (PIL backend, as vLLM pins it) on images
hyocr has already resized, then the same images through a pool of 1/4/8 threads and 4/8 processes.
Prints one JSON line per measurement: images per second.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from hyocr.bench.workload import Workload  # noqa: E402
from hyocr.hunyuan.geometry import PixelBounds, fit_image  # noqa: E402
from hyocr.types import PageImage  # noqa: E402

TEXT = "<｜hy_place▁holder▁no▁100｜><｜hy_place▁holder▁no▁102｜><｜hy_place▁holder▁no▁101｜>提取图中的文字。"
_processor = None


def _load(checkpoint: str) -> None:
    global _processor
    from transformers import AutoProcessor

    _processor = AutoProcessor.from_pretrained(checkpoint, backend="pil")


def _process(image) -> int:
    out = _processor(text=TEXT, images=image, return_tensors="pt")
    return int(out["pixel_values"].shape[0])


def rate(pool_factory, images: list, workers: int) -> float:
    with pool_factory(workers) as pool:
        list(pool.map(_process, images[:workers]))  # warm every worker
        started = time.perf_counter()
        list(pool.map(_process, images))
        return len(images) / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("checkpoint")
    parser.add_argument("--images", type=int, default=32)
    args = parser.parse_args()
    _load(args.checkpoint)
    for name in ("card", "page"):
        workload = Workload(name, "", 1, False)
        images = [fit_image(PageImage(workload.image(i), i), PixelBounds()) for i in range(args.images)]
        _process(images[0])
        started = time.perf_counter()
        for image in images:
            _process(image)
        serial = len(images) / (time.perf_counter() - started)
        print(json.dumps({"workload": name, "pool": "serial", "workers": 1, "images_per_s": round(serial, 1),
                          "ms_per_image": round(1000 / serial, 2)}), flush=True)
        for workers in (4, 8):
            r = rate(ThreadPoolExecutor, images, workers)
            print(json.dumps({"workload": name, "pool": "threads", "workers": workers, "images_per_s": round(r, 1)}),
                  flush=True)
            r = rate(lambda n: ProcessPoolExecutor(n, initializer=_load, initargs=(args.checkpoint,)), images, workers)
            print(json.dumps({"workload": name, "pool": "processes", "workers": workers,
                              "images_per_s": round(r, 1)}), flush=True)


if __name__ == "__main__":
    main()
