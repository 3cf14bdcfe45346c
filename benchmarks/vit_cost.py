"""What HunyuanOCR's vision encoder costs on this GPU, per image, and how much of it is kernel launching.

    python benchmarks/vit_cost.py [OUT.json]

Two parts, each on random bf16 weights at HunyuanOCR 1.0's sizes (27 layers, 1152 wide, 16 heads,
MLP 4304), for a card (1024x640: 2560 patches) and a page (1600x1200: 100x75 = 7500 patches):

1. plain PyTorch layers (fused-QKV linear, SDPA, MLP): eager image by image, eager in a batch of 8,
   and the same two captured in a CUDA graph. The graph replay is the GPU's own time (no Python, no
   launch gaps): the floor for this encoder.
2. vLLM's own HunYuanVisionTransformer (vLLM 0.12-0.31): its forward (layers run image by image)
   against hyocr's batched forward (engines/vllm/vision.py) for 1 and 8 images a pass, with the
   largest difference between their outputs.

Median of repeated timings after warm-up, with CUDA events around each region. FLOP counts: 2 x
parameters x patches for the matrix products, 4 x patches^2 x width per layer for attention.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

LAYERS, WIDTH, HEADS, MLP = 27, 1152, 16, 4304
WORKLOADS = {"card": (40, 64), "page": (75, 100)}  # patch grid (h, w): 16-pixel patches
BATCH = 8


def flops(patches: int) -> float:
    per_layer = 2 * patches * (WIDTH * 3 * WIDTH + WIDTH * WIDTH + 2 * WIDTH * MLP) + 4 * patches ** 2 * WIDTH
    return LAYERS * per_layer


def timed(fn, repeat: int = 20, warmup: int = 3) -> float:
    """Median milliseconds of fn() over `repeat` runs, CUDA events around each."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeat):
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(begin.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def graphed(fn):
    """fn captured in a CUDA graph; returns the replay."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


class Layer(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln1, self.ln2 = torch.nn.LayerNorm(WIDTH), torch.nn.LayerNorm(WIDTH)
        self.qkv, self.o = torch.nn.Linear(WIDTH, 3 * WIDTH), torch.nn.Linear(WIDTH, WIDTH)
        self.fc1, self.fc2 = torch.nn.Linear(WIDTH, MLP), torch.nn.Linear(MLP, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, _ = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, n, 3, HEADS, WIDTH // HEADS).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, n, WIDTH)
        x = x + self.o(a)
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x)), approximate="tanh"))


def plain_torch(results: dict) -> None:
    layers = torch.nn.Sequential(*[Layer() for _ in range(LAYERS)]).cuda().to(torch.bfloat16).eval()
    for name, (h, w) in WORKLOADS.items():
        n = h * w
        one = torch.randn(1, n, WIDTH, device="cuda", dtype=torch.bfloat16)
        many = torch.randn(BATCH, n, WIDTH, device="cuda", dtype=torch.bfloat16)
        with torch.inference_mode():
            row = {
                "eager_1": timed(lambda: layers(one)),
                f"eager_{BATCH}": timed(lambda: layers(many)) / BATCH,
                "graph_1": timed(graphed(lambda: layers(one))),
                f"graph_{BATCH}": timed(graphed(lambda: layers(many))) / BATCH,
            }
        row = {k: round(v, 3) for k, v in row.items()}
        row["tflops_graph_batched"] = round(flops(n) / (row[f"graph_{BATCH}"] / 1000) / 1e12, 1)
        results[f"torch_{name}_ms_per_image"] = row
        print(f"plain torch {name} ({n} patches), ms per image: {row}", flush=True)


def vllm_native(results: dict) -> None:
    import tempfile

    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.distributed import parallel_state
    from vllm.model_executor.models.hunyuan_vision import HunYuanVisionTransformer
    from vllm.transformers_utils.configs.hunyuan_vl import HunYuanVLVisionConfig

    parallel_state.init_distributed_environment(1, 0, f"file://{tempfile.mktemp()}", 0, "nccl")
    parallel_state.initialize_model_parallel(1, 1)
    # vLLM's custom ops read the current config when built and when called: both need one set.
    with set_current_vllm_config(VllmConfig()):
        _vllm_native(results, HunYuanVisionTransformer, HunYuanVLVisionConfig)


def _vllm_native(results: dict, HunYuanVisionTransformer, HunYuanVLVisionConfig) -> None:  # noqa: N803
    from hyocr.engines.vllm import vision as vllm_vision

    torch.set_default_dtype(torch.bfloat16)
    visual = HunYuanVisionTransformer(HunYuanVLVisionConfig(out_hidden_size=1024)).cuda().eval()
    torch.set_default_dtype(torch.float32)
    torch.manual_seed(0)
    with torch.no_grad():
        for p in visual.parameters():
            p.normal_(0, 0.02)
    vllm_vision.install("vllm")
    stock = vllm_vision._state["stock"]
    print("vLLM vision attention backend:", visual.layers[0].self_attn.attn.attn_backend, flush=True)
    grids = [[1, 40, 64], [1, 76, 100], [1, 34, 22]]
    error = vllm_vision.compare_forwards(visual, grids)
    results["vllm_batched_vs_stock_max_rel_diff"] = error
    print(f"batched vs vLLM's forward: max relative difference {error:.2e}", flush=True)
    results["rounding_vs_float32"] = rounding_against_float32(visual, stock, grids)
    print("against a float32 copy of the encoder:", results["rounding_vs_float32"], flush=True)
    for name, (h, w) in WORKLOADS.items():
        row = {}
        for count in (1, BATCH):
            grids = [[1, h, w]] * count
            pixels = torch.randn(count * h * w, 3 * 16 * 16, device="cuda")
            with torch.inference_mode():
                row[f"vllm_{count}"] = timed(lambda: stock(visual, pixels, grids), repeat=10) / count
                row[f"batched_{count}"] = timed(lambda: vllm_vision.batched_forward(visual, pixels, grids),
                                                repeat=10) / count
        row = {k: round(v, 3) for k, v in row.items()}
        results[f"vllm_{name}_ms_per_image"] = row
        print(f"vLLM HunYuanVisionTransformer {name}, ms per image: {row}", flush=True)


def rounding_against_float32(visual, stock, grids: list[list[int]]) -> dict:
    """How far vLLM's bf16 forward and the batched bf16 forward each are from the same encoder in float32
    (the engine's self test compares the two bf16 ones, whose difference is rounding if both are this
    close to float32). Max |difference| over max |float32 output|, per forward."""
    import copy

    from hyocr.engines.vllm import vision as vllm_vision

    pixels = torch.randn(sum(t * h * w for t, h, w in grids), 3 * 16 * 16, generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        reference32 = copy.deepcopy(visual).float()
        from vllm.v1.attention.backends.registry import AttentionBackendEnum

        for layer in reference32.layers:  # flash attention has no float32: the copy attends with SDPA
            layer.self_attn.attn.attn_backend = AttentionBackendEnum.TORCH_SDPA
            layer.self_attn.attn.is_flash_attn_backend = False
        exact = [o.float() for o in stock(reference32, pixels, grids)]
        del reference32
        out = {}
        for name, forward in (("vllm", stock), ("batched", vllm_vision.batched_forward)):
            got = forward(visual, pixels, grids)
            out[name] = max(float((g.float() - e).abs().max() / e.abs().max()) for g, e in zip(got, exact))
    return {k: float(f"{v:.2e}") for k, v in out.items()}


def main() -> int:
    results: dict = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                     "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                     "flops_per_image": {k: flops(h * w) for k, (h, w) in WORKLOADS.items()}}
    for part in (plain_torch, vllm_native):
        try:
            part(results)
        except Exception as exc:  # report and go on: the other part's numbers still count
            results[f"{part.__name__}_error"] = f"{type(exc).__name__}: {exc}"
            print(f"{part.__name__} failed: {exc!r}", flush=True)
    if len(sys.argv) > 1:
        Path(sys.argv[1]).write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
