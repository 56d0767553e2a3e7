"""What the serving select precomputes from a trained head: token table, node_const, the feature LayerNorm folded into
w_feat, attention bias, anchor and edge weights; fold_norms: each lattice pre-norm's gain in its GEMM's weight."""

from __future__ import annotations

import torch

from ..head import LiLiCorrHead
from ..kernels.gemm_epilogue import fold_norm_gain
from ..lattice import lattice_attention_bias


class SelectConstants:
    def __init__(
        self,
        head: LiLiCorrHead,
        embed_weight: torch.Tensor | None,
        token_table: torch.Tensor | None,
        *,
        fold_norms: bool,
    ) -> None:
        """Exactly one of embed_weight [V, Hm] (the target's input embedding) and token_table [V, H]."""
        self.head = head.eval()
        cfg, w = head.config, head.pass_hidden_proj.weight
        self.dtype, self.device = w.dtype, w.device
        self.num_slots, self.topk = cfg.num_slots, cfg.candidate_topk
        self.width, self.factor_dim = head.width, cfg.factor_dim
        self.sigma, self.vector_eps = float(cfg.logit_scale), float(cfg.vector_eps)
        h = self.width
        with torch.no_grad():
            if token_table is None:
                token_table = head.token_table(embed_weight.to(self.device))
            if token_table.dim() != 2 or token_table.shape[1] != h:
                raise ValueError(f"FastLiLiCorrSelect: token_table {tuple(token_table.shape)} is not [V, {h}].")
            self.token_table = token_table.to(self.device, self.dtype).contiguous()  # [V, H]

            self.w_pass = head.pass_hidden_proj.weight.contiguous()  # [H, Hm], bias in node_const
            mlp, ln = head.feature_mlp, head.feature_norm
            up_w = mlp.up_proj.weight.float()  # [H, 5]
            ln_w = ln.weight.float() if ln.weight is not None else torch.ones(up_w.shape[1], device=self.device)
            ln_b = ln.bias.float() if ln.bias is not None else torch.zeros(up_w.shape[1], device=self.device)
            self.w_feat = (up_w * ln_w).contiguous()  # [H, 5] fp32
            self.b_feat = (up_w @ ln_b + mlp.up_proj.bias.float()).contiguous()  # [H] fp32
            self.feat_ln_eps = float(ln.eps)
            self.w_down = mlp.down_proj.weight.contiguous()  # [H, H], bias in node_const
            self.node_const = (
                head.slot_embedding[0, 0].float()  # [S, 1, H]
                + head.rank_embedding[0, 0].float()  # [1, K, H]
                + mlp.down_proj.bias.float()
                + head.pass_hidden_proj.bias.float()
            ).contiguous()  # [S, K, H] fp32

            n_max = self.num_slots * self.topk
            pad = -(-n_max // 16) * 16
            bias = torch.zeros(1, cfg.num_heads, n_max, pad, device=self.device, dtype=self.dtype)
            bias[..., :n_max] = lattice_attention_bias(
                head.relative_slot_bias, head.same_slot_bias, self.num_slots, self.topk
            )
            self.attn_bias = bias[..., :n_max]  # [1, heads, L, L], row stride 16-aligned for SDPA kernels

            wf = head.factor_input_proj.weight  # [H, 3H] over concat[h, t, h*t]
            self.w_factor = torch.cat([wf[:, :h], wf[:, 2 * h :]], dim=1).contiguous()  # [H, 2H]
            self.w_anchor = torch.cat([head.anchor_out_head.weight, wf[:, h : 2 * h]], dim=0).contiguous()  # [D+H, H]
            self.b_anchor = torch.cat([head.anchor_out_head.bias, head.factor_input_proj.bias]).contiguous()  # [D+H]
            self.w_edge = torch.cat([head.out_head.weight, head.in_head.weight], dim=0).contiguous()  # [2D, H]
            self.b_edge = torch.cat([head.out_head.bias, head.in_head.bias]).contiguous()  # [2D]
            layers = head.layers
            if fold_norms:
                self.w_qkv_folded = [
                    fold_norm_gain(layer.attn.in_proj_weight, layer.attn_norm.weight) for layer in layers
                ]
                self.w_up_folded = [fold_norm_gain(layer.mlp.up_proj.weight, layer.mlp_norm.weight) for layer in layers]
                self.w_factor_folded = fold_norm_gain(self.w_factor, head.output_norm.weight)
        # the RMSNorm that follows each residual add: layer i's mlp_norm, then layer i+1's attn_norm / output_norm
        self._after_attn = [layer.mlp_norm for layer in layers]
        self._after_mlp = [layers[i + 1].attn_norm for i in range(len(layers) - 1)] + [head.output_norm]
