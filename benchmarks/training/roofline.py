"""The roofline of `lilicorr train`: model FLOPs per training token (a token of a training sequence) of its three
parts, model-FLOPs utilisation (MFU) for a measured tokens/s, and the wall time of the paper's recipe.

  python -m benchmarks roofline                               # Qwen3-8B, z-lab's 5-layer drafter, the paper's head
  python -m benchmarks roofline --tok-s head=30000 joint=18000 --card H100 --json roofline.json

What a sequence of T tokens costs, counted as matmul FLOPs (2 per multiply-add; norms, softmax and element-wise work
left out), with N anchors of B tokens (R = N blocks, S = B - 1 slots, K candidates each, Q = N B block tokens):
  target forward   (frozen, no backward) its decoder over T tokens, causal attention over (T + 1) / 2 keys on
                   average; its LM head at the R S slot rows (the teacher-forced targets) and the R S K candidates'
                   logits
  drafter          fc over the T context rows; per layer the context keys and values (T rows) and the Q block
                   tokens' projections and FFN; attention of each block token over the context before its anchor
                   (T / 2 on average: anchors spread over the sequence) and its own block; the target's LM head at
                   the R S slot rows (frozen: its backward is the input gradient alone)
  head (LiLiCorr)  the R S K lattice nodes through the paper's head (App. A), and the pair scores
Backward = each matmul's input gradient where its input needs one and its weight gradient where its weight trains:
2x the forward for most, 1x for fc (its input, the target's features, needs none) and the frozen LM head, 0 for a
frozen drafter (`--train head`), where the head's projections of the drafter's states get their weight gradient
alone. MFU = FLOPs per token x tokens/s / the card's dense bf16 peak.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Mapping

from sglang_lilicorr.config import LiLiCorrConfig
from sglang_lilicorr.drafter import DrafterConfig
from sglang_lilicorr.head import NUM_CONFIDENCE_FEATURES

PEAK_BF16_DENSE = {"H100": 989e12, "H200": 989e12}  # FLOP/s, SXM: the same tensor cores (H200: more, faster memory)
SCALING = Path(__file__).resolve().parents[1] / "results" / "multi-gpu" / "summary.json"  # measured train scaling
PAPER_RECIPE = {"global_batch": 64, "seq": 3072, "epochs": 6}  # sequences per optimizer step, tokens each, passes
MODES = ("head", "joint")  # lilicorr train --train


@dataclasses.dataclass(frozen=True)
class Shapes:
    """What one training sequence runs through: the target (its HF config's fields), drafter and head, at `seq`
    tokens and `anchors` blocks."""

    target: Mapping
    drafter: DrafterConfig
    head: LiLiCorrConfig
    seq: int
    anchors: int


def qwen3_8b_shapes(seq: int = PAPER_RECIPE["seq"], anchors: int = 64) -> Shapes:
    """Qwen3-8B, z-lab's Qwen3-8B-DFlash-b16 drafter (5 layers), the paper's head (width 1024, 8 heads, FFN 2048,
    K 8, B 16)."""
    from ..served.scale import QWEN3_8B
    from .zlab_draft import QWEN3_8B_DRAFT, zlab_config

    return Shapes(QWEN3_8B, DrafterConfig.from_hf_config(zlab_config(**QWEN3_8B_DRAFT)), LiLiCorrConfig(), seq, anchors)


def linear(rows: float, d_in: int, d_out: int) -> float:
    return 2.0 * rows * d_in * d_out


def attention(queries: float, keys: float, heads: int, head_dim: int) -> float:
    """Q K^T and the weighted sum of V."""
    return 4.0 * queries * keys * heads * head_dim


def decoder_layer(rows: float, hidden: int, heads: int, kv_heads: int, head_dim: int, ffn: int) -> float:
    """A Qwen3 layer's projections and gated FFN over `rows` tokens (attention apart)."""
    q, kv = heads * head_dim, kv_heads * head_dim
    return (
        linear(rows, hidden, q) + 2 * linear(rows, hidden, kv) + linear(rows, q, hidden) + 3 * linear(rows, hidden, ffn)
    )


def target_forward(shapes: Shapes) -> float:
    """Per sequence."""
    t, n = shapes.target, shapes.seq
    hidden, heads, head_dim = t["hidden_size"], t["num_attention_heads"], t["head_dim"]
    layer = decoder_layer(n, hidden, heads, t["num_key_value_heads"], head_dim, t["intermediate_size"])
    layer += attention(n, (n + 1) / 2, heads, head_dim)
    rows = shapes.anchors * shapes.drafter.num_slots
    return (
        t["num_hidden_layers"] * layer
        + linear(rows, hidden, t["vocab_size"])
        + linear(rows * shapes.head.candidate_topk, hidden, 1)
    )


def drafter_cost(shapes: Shapes, trains: bool) -> tuple[float, float]:
    """(forward, backward) per sequence."""
    d, n = shapes.drafter, shapes.seq
    h, heads, head_dim = d.hidden_size, d.num_attention_heads, d.head_dim
    fc = linear(n, d.num_context_features * h, h)
    context_kv = 2 * linear(n, h, d.num_key_value_heads * head_dim)
    blocks = shapes.anchors * d.block_size
    layer = context_kv + decoder_layer(blocks, h, heads, d.num_key_value_heads, head_dim, d.intermediate_size)
    layer += attention(blocks, n / 2 + d.block_size, heads, head_dim)
    lm_head = linear(shapes.anchors * d.num_slots, h, d.vocab_size)
    forward = fc + d.num_hidden_layers * layer + lm_head
    if not trains:  # frozen: no backward at all
        return forward, 0.0
    return forward, fc + lm_head + 2 * d.num_hidden_layers * layer  # fc: its weight alone; the LM head: its input


def head_cost(shapes: Shapes, trains_drafter: bool) -> tuple[float, float]:
    """(forward, backward) per sequence of the LiLiCorr head: (forward, weight gradients alone) for the matmuls whose
    input needs no gradient, (forward, 2x) for the rest."""
    c, hm = shapes.head, shapes.drafter.hidden_size
    w, k, s, r = c.head_width(hm), c.candidate_topk, c.num_slots, shapes.anchors
    nodes, slots = r * s * k, r * s
    weight_only = linear(nodes, hm, w) if w != hm else 0.0  # token_proj of the frozen embeddings
    of_drafter = linear(slots, hm, w) + linear(r, hm, w)  # pass_hidden_proj, context_proj
    ffn = c.ffn_width(hm)
    layer = linear(nodes, w, 3 * w) + linear(nodes, w, w) + linear(nodes, w, ffn) + linear(nodes, ffn, w)
    layer += attention(nodes, s * k, c.num_heads, w // c.num_heads)
    full = linear(nodes, NUM_CONFIDENCE_FEATURES, w) + linear(nodes, w, w)  # feature_mlp (after a trained norm)
    full += c.num_layers * layer  # the lattice transformer
    full += 2 * linear(nodes, w, w) + linear(r, w, w)  # the fusion (factor_input_proj over [h, t, h * t])
    full += 2 * linear(nodes, w, c.factor_dim) + linear(r, w, c.factor_dim)  # out, in, anchor out
    full += 2.0 * r * (s - 1) * k * k * c.factor_dim + 2.0 * r * k * c.factor_dim  # pair and start scores
    if trains_drafter:
        full, of_drafter = full + of_drafter, 0.0
    return weight_only + of_drafter + full, weight_only + of_drafter + 2 * full


def flops_per_token(shapes: Shapes, mode: str) -> dict[str, float]:
    """Model FLOPs per training token by part, and their `total`, for `lilicorr train --train MODE`."""
    trains = mode == "joint"
    drafter_fwd, drafter_bwd = drafter_cost(shapes, trains)
    head_fwd, head_bwd = head_cost(shapes, trains)
    parts = {
        "target_forward": target_forward(shapes),
        "drafter_forward": drafter_fwd,
        "drafter_backward": drafter_bwd,
        "head_forward": head_fwd,
        "head_backward": head_bwd,
    }
    out = {k: v / shapes.seq for k, v in parts.items()}
    out["total"] = sum(out.values())
    return out


def card_peak(name: str) -> float | None:
    """The dense bf16 peak of a card named like torch.cuda.get_device_name (None when unknown)."""
    return next((peak for card, peak in PEAK_BF16_DENSE.items() if card in name.upper()), None)


def four_gpu_scaling(path: Path = SCALING) -> float:
    """`lilicorr train`'s measured tokens/s on 4 GPUs over 1 (SmolLM2 training, DDP)."""
    return float(json.loads(path.read_text())["train_scaling"]["4"])


def wall_time(tok_s: float, scaling: float, epochs: int = PAPER_RECIPE["epochs"]) -> dict[str, float]:
    """Hours per 1M training tokens on 1 GPU and on 4 (projected with `scaling`), and of the recipe (`epochs`
    passes) per 1M tokens of data."""
    one = 1e6 / tok_s / 3600
    return {
        "hours_per_1m_tokens_1gpu": one,
        "hours_per_1m_tokens_4gpu": one / scaling,
        "recipe_hours_per_1m_data_tokens_1gpu": epochs * one,
        "recipe_hours_per_1m_data_tokens_4gpu": epochs * one / scaling,
    }


def report(shapes: Shapes, mode: str, peak: float, scaling: float, tok_s: float | None, at_mfu: float) -> dict:
    """The roofline of one mode: FLOPs per token by part; the tokens/s `at_mfu` of the peak would give, and its wall
    times; with a measured tok_s, its MFU and wall times."""
    flops = flops_per_token(shapes, mode)
    ideal = at_mfu * peak / flops["total"]
    out = {"flops_per_token": flops, "at_mfu": at_mfu, "tok_s_at_mfu": ideal, "at_mfu_wall": wall_time(ideal, scaling)}
    if tok_s:
        out.update(tok_s=tok_s, mfu=flops["total"] * tok_s / peak, wall=wall_time(tok_s, scaling))
    return out


def table(reports: Mapping[str, dict], peak: float) -> str:
    parts = next(iter(reports.values()))["flops_per_token"]
    lines = [f"| GFLOP per training token | {' | '.join(reports)} |", "|---|" + "---|" * len(reports)]
    for part in parts:
        cells = " | ".join(f"{r['flops_per_token'][part] / 1e9:.3f}" for r in reports.values())
        lines.append(f"| {part} | {cells} |")
    for mode, r in reports.items():
        lines.append(
            f"\n{mode}: {r['tok_s_at_mfu']:,.0f} tok/s at {r['at_mfu']:.0%} MFU of {peak / 1e12:.0f} TFLOP/s"
            f" = {r['at_mfu_wall']['hours_per_1m_tokens_1gpu'] * 60:.2f} min per 1M tokens on 1 GPU"
        )
        if "mfu" in r:
            w = r["wall"]
            lines.append(
                f"{mode}: measured {r['tok_s']:,.0f} tok/s = {r['mfu']:.1%} MFU; recipe ({PAPER_RECIPE['epochs']} "
                f"epochs) {w['recipe_hours_per_1m_data_tokens_1gpu']:.3f} h per 1M data tokens on 1 GPU, "
                f"{w['recipe_hours_per_1m_data_tokens_4gpu']:.3f} h on 4 (projected)"
            )
    return "\n".join(lines)


def measured(text: str) -> tuple[str, float]:
    mode, _, value = text.partition("=")
    if mode not in MODES or not value:
        raise argparse.ArgumentTypeError(f"{text!r}: expected MODE=TOKENS_PER_S with MODE one of {', '.join(MODES)}")
    return mode, float(value)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tok-s", type=measured, nargs="*", default=[], help="measured tokens/s, e.g. joint=18000")
    p.add_argument("--card", default="H100", choices=sorted(PEAK_BF16_DENSE), help="whose bf16 peak MFU is against")
    p.add_argument("--at-mfu", type=float, default=0.35, help="the utilisation the ideal tokens/s assume")
    p.add_argument("--seq", type=int, default=PAPER_RECIPE["seq"], help="tokens per training sequence")
    p.add_argument("--anchors", type=int, default=64, help="blocks drafted per sequence (lilicorr train's default)")
    p.add_argument("--json", type=Path, help="also write the reports here")
    a = p.parse_args(argv)
    shapes, peak, scaling, given = (
        qwen3_8b_shapes(a.seq, a.anchors),
        PEAK_BF16_DENSE[a.card],
        four_gpu_scaling(),
        dict(a.tok_s),
    )
    reports = {mode: report(shapes, mode, peak, scaling, given.get(mode), a.at_mfu) for mode in MODES}
    print(table(reports, peak))
    if a.json:
        a.json.write_text(
            json.dumps({"card": a.card, "peak_flops": peak, "scaling_4gpu": scaling, **reports}, indent=1) + "\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
