"""A random-weight DFlash draft of HunyuanOCR 1.5's published architecture, for measuring the speculative path's
overhead and correctness on the GPU (acceptance is meaningless with random weights: the draft's guesses are
noise, so this measures what speculation costs when it is always wrong, and that the output is unchanged).

The architecture is the draft's published config.json (the `dflash/` folder of tencent/HunyuanOCR): a 5-layer
Qwen3-style block-diffusion model, hidden 1024, 16 heads / 8 KV heads of 128, MLP 3584, reading the target's
hidden states at layers [1, 8, 15, 22] through `fc` (4 x 1024 -> 1024), sharing the target's embeddings and
LM head. Weight names are those vLLM's DFlashQwen3ForCausalLM loads (vLLM 0.26, qwen3_dflash.py).

    python benchmarks/dflash_draft.py OUT_DIR [--layers 5] [--seed 0]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, MLP, VOCAB = 1024, 16, 8, 128, 3584, 120818
TARGET_LAYERS = [1, 8, 15, 22]
MASK_TOKEN = 120817


def config(layers: int) -> dict:
    return {
        "architectures": ["DFlashDraftModel"], "model_type": "qwen3", "hidden_size": HIDDEN,
        "num_hidden_layers": layers, "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS,
        "head_dim": HEAD_DIM, "intermediate_size": MLP, "hidden_act": "silu", "rms_norm_eps": 1e-05,
        "max_position_embeddings": 131072, "rope_theta": 10000.0, "rope_scaling": None,  # vLLM defaults 1e6
        "attention_bias": False, "tie_word_embeddings": True, "vocab_size": VOCAB,
        "layer_types": ["full_attention"] * layers, "block_size": 16, "num_target_layers": 24,
        "dflash_config": {"mask_token_id": MASK_TOKEN, "target_layer_ids": TARGET_LAYERS},
        "eos_token_id": 120020, "pad_token_id": 120002, "torch_dtype": "bfloat16",
    }


def weights(layers: int, seed: int) -> dict:
    import torch

    g = torch.Generator().manual_seed(seed)

    def rand(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, generator=g) * 0.02).to(torch.bfloat16)

    out = {"norm.weight": torch.ones(HIDDEN, dtype=torch.bfloat16),
           "hidden_norm.weight": torch.ones(HIDDEN, dtype=torch.bfloat16),
           "fc.weight": rand(HIDDEN, HIDDEN * len(TARGET_LAYERS))}
    for i in range(layers):
        p = f"layers.{i}."
        out.update({
            p + "self_attn.q_proj.weight": rand(HEADS * HEAD_DIM, HIDDEN),
            p + "self_attn.k_proj.weight": rand(KV_HEADS * HEAD_DIM, HIDDEN),
            p + "self_attn.v_proj.weight": rand(KV_HEADS * HEAD_DIM, HIDDEN),
            p + "self_attn.o_proj.weight": rand(HIDDEN, HEADS * HEAD_DIM),
            p + "self_attn.q_norm.weight": torch.ones(HEAD_DIM, dtype=torch.bfloat16),
            p + "self_attn.k_norm.weight": torch.ones(HEAD_DIM, dtype=torch.bfloat16),
            p + "mlp.gate_proj.weight": rand(MLP, HIDDEN),
            p + "mlp.up_proj.weight": rand(MLP, HIDDEN),
            p + "mlp.down_proj.weight": rand(HIDDEN, MLP),
            p + "input_layernorm.weight": torch.ones(HIDDEN, dtype=torch.bfloat16),
            p + "post_attention_layernorm.weight": torch.ones(HIDDEN, dtype=torch.bfloat16),
        })
    return out


def build(out: Path, layers: int = 5, seed: int = 0) -> Path:
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config(layers), indent=2) + "\n")
    save_file(weights(layers, seed), str(out / "model.safetensors"))
    return out


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--layers", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(build(Path(args.out), args.layers, args.seed))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
