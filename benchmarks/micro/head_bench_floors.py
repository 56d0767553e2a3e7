"""The floors head_bench sets beside the served select: the head's dense work alone (cuBLAS and SDPA one launch each,
or Triton under PDL) and a chain of empty kernels as long as the select's launches. Each returns a zero-argument call
to capture in a CUDA graph."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def dense_chain(fast, geo, bs, device, dtype):
    """The head's dense work alone at its served shapes, no elementwise op, top-K or walk: the pass
    and anchor GEMMs, the feature down GEMM, per lattice layer QKV + SDPA (with the lattice bias) +
    out + FFN up + FFN down, the factor and out|in GEMMs. Replayed as one graph, this is the floor of
    any design that runs cuBLAS GEMMs and SDPA one launch each, as `fused` does; what post_logits adds
    on top is top-K/LSE, the Triton epilogues and the walk. Returns a zero-argument call."""
    L, H, heads = geo.S * geo.K, fast.width, geo.heads
    g = torch.Generator(device="cpu").manual_seed(2000 + bs)
    rand = lambda *shape: torch.randn(*shape, generator=g).to(device, dtype)  # noqa: E731
    pass_hidden, anchor_hidden = rand(bs * geo.S, geo.HM), rand(bs, geo.HM)
    x, cat = rand(bs * L, H), rand(bs * L, 2 * H)
    bias = fast.attn_bias[..., :L, :L]
    head = fast.head

    @torch.no_grad()
    def chain():
        F.linear(pass_hidden, fast.w_pass)
        F.linear(F.linear(anchor_hidden, head.context_proj.weight), fast.w_anchor, fast.b_anchor)
        y = F.linear(x, fast.w_down)
        for layer in head.layers:
            q, k, v = (
                F.linear(y, layer.attn.in_proj_weight, layer.attn.in_proj_bias).view(bs, L, 3, heads, -1).unbind(2)
            )
            o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=bias)
            y = layer.attn.out_proj(o.transpose(1, 2).reshape(bs * L, H))
            y = layer.mlp.down_proj(layer.mlp.up_proj(y))
        return F.linear(F.linear(cat, fast.w_factor), fast.w_edge, fast.b_edge)

    return chain


def dense_chain_pdl(fast, geo, bs, device, dtype):
    """The dense work on the critical path alone (dense_chain without the pass and anchor GEMMs, which
    the served path runs on a side stream), each op the fastest single launch we have for it under
    programmatic dependent launch: Triton GEMMs (gemm_epilogue_triton) and lattice_attention_triton,
    all with PDL. With top-K/LSE added, the floor of any design that runs the head one launch per
    GEMM and attention. Returns a zero-argument call (CUDA sm_90+)."""
    from sglang_lilicorr.kernels.gemm_epilogue import gemm_epilogue_triton
    from sglang_lilicorr.kernels.lattice_attention import lattice_attention_triton

    L, H = geo.S * geo.K, fast.width
    g = torch.Generator(device="cpu").manual_seed(3000 + bs)
    x, cat = (torch.randn(bs * L, n, generator=g).to(device, dtype) for n in (H, 2 * H))
    bias = fast.attn_bias[..., :L, :L]
    head = fast.head

    @torch.no_grad()
    def chain():
        y = gemm_epilogue_triton(x, fast.w_down, pdl=True)
        for layer in head.layers:
            qkv = gemm_epilogue_triton(y, layer.attn.in_proj_weight, layer.attn.in_proj_bias, pdl=True)
            y = gemm_epilogue_triton(
                lattice_attention_triton(qkv, bias, layer.attn.num_heads, pdl=True),
                layer.attn.out_proj.weight,
                layer.attn.out_proj.bias,
                pdl=True,
            )
            y = gemm_epilogue_triton(y, layer.mlp.up_proj.weight, layer.mlp.up_proj.bias, silu=True, pdl=True)
            y = gemm_epilogue_triton(y, layer.mlp.down_proj.weight, layer.mlp.down_proj.bias, pdl=True)
        return gemm_epilogue_triton(
            gemm_epilogue_triton(cat, fast.w_factor, pdl=True), fast.w_edge, fast.b_edge, pdl=True
        )

    return chain


def launch_chain(n, device):
    """n back-to-back launches of an empty one-program Triton kernel: replayed as one graph, the
    launch-latency floor of any design that runs the select path as n dependent kernels."""
    import triton
    import triton.language as tl

    @triton.jit
    def _empty(x_ptr):
        tl.debug_barrier()

    x = torch.empty(1, device=device)

    def chain():
        for _ in range(n):
            _empty[(1,)](x)

    return chain
