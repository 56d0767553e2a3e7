"""A random DFlash drafter in the layout z-lab publishes its drafters in (e.g. `z-lab/Qwen3-8B-DFlash-b16`), written
by hand from that layout, not by our writers: what `lilicorr train --init-from` reads as a user's published draft.

  config.json        the published key set: `architectures` ["DFlashDraftModel"], `auto_map`, `block_size` at the top
                     level, `dflash_config` {mask_token_id, target_layer_ids} (no mask_token, no block_size),
                     `dtype` (not torch_dtype), `layer_types`, flat `rope_theta` with `rope_scaling` null
  model.safetensors  bf16, metadata {"format": "pt"} only (no checksum), the upstream tensor names:
                     layers.{i}.input_layernorm / post_attention_layernorm .weight,
                     layers.{i}.self_attn.{q,k,v,o}_proj.weight, layers.{i}.self_attn.{q,k}_norm.weight,
                     layers.{i}.mlp.{gate,up,down}_proj.weight, fc.weight, hidden_norm.weight, norm.weight
"""

from __future__ import annotations

import json
from pathlib import Path

# Qwen3-8B-DFlash-b16's geometry: 5 Qwen3 layers of Qwen3-8B's shape, 5 target layers of 36, block 16
QWEN3_8B_DRAFT = dict(
    hidden_size=4096,
    intermediate_size=12288,
    num_attention_heads=32,
    num_key_value_heads=8,
    head_dim=128,
    num_hidden_layers=5,
    num_target_layers=36,
    target_layer_ids=[1, 9, 17, 25, 33],
    vocab_size=151936,
    mask_token_id=151669,
    block_size=16,
    max_position_embeddings=40960,
)


def zlab_config(
    *,
    hidden_size: int,
    intermediate_size: int,
    num_attention_heads: int,
    num_key_value_heads: int,
    head_dim: int,
    num_hidden_layers: int,
    num_target_layers: int,
    target_layer_ids: list[int],
    vocab_size: int,
    mask_token_id: int,
    block_size: int = 16,
    max_position_embeddings: int = 40960,
) -> dict:
    """config.json of a z-lab Qwen3 DFlash drafter of this geometry (the published keys and their order)."""
    return {
        "architectures": ["DFlashDraftModel"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "auto_map": {"AutoModel": "dflash.DFlashDraftModel"},
        "block_size": block_size,
        "bos_token_id": 151643,
        "dflash_config": {"mask_token_id": mask_token_id, "target_layer_ids": list(target_layer_ids)},
        "dtype": "bfloat16",
        "eos_token_id": 151645,
        "head_dim": head_dim,
        "hidden_act": "silu",
        "hidden_size": hidden_size,
        "initializer_range": 0.02,
        "intermediate_size": intermediate_size,
        "layer_types": ["full_attention"] * num_hidden_layers,
        "max_position_embeddings": max_position_embeddings,
        "max_window_layers": num_hidden_layers,
        "model_type": "qwen3",
        "num_attention_heads": num_attention_heads,
        "num_hidden_layers": num_hidden_layers,
        "num_key_value_heads": num_key_value_heads,
        "num_target_layers": num_target_layers,
        "rms_norm_eps": 1e-06,
        "rope_scaling": None,
        "rope_theta": 1000000,
        "sliding_window": None,
        "tie_word_embeddings": False,
        "transformers_version": "4.57.3",
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": vocab_size,
    }


def zlab_tensor_shapes(config: dict) -> dict[str, tuple[int, ...]]:
    """Every tensor of such a drafter, by its upstream name."""
    h, f = config["hidden_size"], config["intermediate_size"]
    d, q, kv = config["head_dim"], config["num_attention_heads"], config["num_key_value_heads"]
    shapes = {
        "fc.weight": (h, len(config["dflash_config"]["target_layer_ids"]) * h),
        "hidden_norm.weight": (h,),
        "norm.weight": (h,),
    }
    for i in range(config["num_hidden_layers"]):
        p = f"layers.{i}."
        shapes.update(
            {
                p + "input_layernorm.weight": (h,),
                p + "post_attention_layernorm.weight": (h,),
                p + "self_attn.q_proj.weight": (q * d, h),
                p + "self_attn.k_proj.weight": (kv * d, h),
                p + "self_attn.v_proj.weight": (kv * d, h),
                p + "self_attn.o_proj.weight": (h, q * d),
                p + "self_attn.q_norm.weight": (d,),
                p + "self_attn.k_norm.weight": (d,),
                p + "mlp.gate_proj.weight": (f, h),
                p + "mlp.up_proj.weight": (f, h),
                p + "mlp.down_proj.weight": (h, f),
            }
        )
    return shapes


def write_zlab_draft(folder: str | Path, config: dict, seed: int = 0, std: float = 0.02) -> Path:
    """`folder` = config.json + model.safetensors of a random drafter in z-lab's layout (norms around 1, matrices
    N(0, std)), bf16."""
    import torch
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(seed)
    tensors = {}
    for name, shape in zlab_tensor_shapes(config).items():
        noise = torch.randn(shape, generator=gen, dtype=torch.float32) * std
        tensors[name] = (noise + 1 if len(shape) == 1 else noise).to(torch.bfloat16)
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return folder
