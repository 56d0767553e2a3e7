"""The LiLiCorr head (paper Sec. 3.2, App. A): candidate nodes -> lattice transformer -> fusion with the target state ->
sigma * cosine scores: start [b, K] = sigma * cos(out_anchor, in_{1,k}), pair [b, S-1, K, K] = sigma * cos(out_{s,i},
in_{s+1,j}). Parameter names are SGLang 0.5.23's (checkpoint tensors `lilicorr.<name>`)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .config import LiLiCorrConfig
from .lattice import LatticeLayer, SiluMLP, lattice_attention_bias

NUM_CONFIDENCE_FEATURES = 5  # log p, p, log p - log p_top, rank / (K-1), is-top-1


def confidence_features(candidate_log_probs: torch.Tensor) -> torch.Tensor:
    """[b, S, K] fp32 log-probs (descending along K) -> [b, S, K, 5] fp32."""
    lp = candidate_log_probs.float()
    k = lp.shape[-1]
    rank = torch.arange(k, device=lp.device, dtype=torch.float32) / max(k - 1, 1)
    is_top = (torch.arange(k, device=lp.device) == 0).float()
    return torch.stack(
        [lp, lp.exp(), lp - lp.max(dim=-1, keepdim=True).values, rank.expand_as(lp), is_top.expand_as(lp)], dim=-1
    )


class LiLiCorrHead(nn.Module):
    def __init__(self, config: LiLiCorrConfig, model_hidden_size: int) -> None:
        super().__init__()
        self.config = config
        hm, h = int(model_hidden_size), config.head_width(model_hidden_size)
        s_max, k, heads, eps = config.num_slots, config.candidate_topk, config.num_heads, config.rms_norm_eps
        if h % heads:
            raise ValueError(
                f"LiLiCorr head width {h} (the drafter's, hidden_size=0) is not a multiple of num_heads={heads}."
            )
        self.model_hidden_size, self.width = hm, h

        # --- nodes: four summed terms of width H ---
        self.token_proj = None if hm == h else nn.Linear(hm, h)
        self.pass_hidden_proj = nn.Linear(hm, h)
        self.feature_norm = nn.LayerNorm(NUM_CONFIDENCE_FEATURES)
        self.feature_mlp = SiluMLP(NUM_CONFIDENCE_FEATURES, h, h)
        self.slot_embedding = nn.Parameter(torch.randn(1, 1, s_max, 1, h) * 0.02)
        self.rank_embedding = nn.Parameter(torch.randn(1, 1, 1, k, h) * 0.02)
        # --- lattice transformer ---
        self.relative_slot_bias = nn.Parameter(torch.zeros(heads, 2 * config.block_size - 1))
        self.same_slot_bias = nn.Parameter(torch.zeros(heads))
        self.layers = nn.ModuleList(LatticeLayer(h, heads, config.ffn_width(hm), eps) for _ in range(config.num_layers))
        self.output_norm = nn.RMSNorm(h, eps=eps)
        # --- target state (the anchor) and fusion ---
        self.context_proj = nn.Linear(hm, h)
        self.anchor_norm = nn.RMSNorm(h, eps=eps)
        self.factor_input_proj = nn.Linear(3 * h, h)  # concat[h, t, h*t] -> H
        # --- out / in vectors ---
        self.out_head = nn.Linear(h, config.factor_dim)
        self.in_head = nn.Linear(h, config.factor_dim)
        self.anchor_out_head = nn.Linear(h, config.factor_dim)

    def project_tokens(self, token_embeddings: torch.Tensor) -> torch.Tensor:
        """Frozen target embeddings [..., Hm] -> node token term [..., H]."""
        return token_embeddings if self.token_proj is None else self.token_proj(token_embeddings)

    @torch.no_grad()
    def token_table(self, embed_weight: torch.Tensor) -> torch.Tensor:
        """The projected token term of every vocabulary entry, [V, Hm] -> [V, H], for serving."""
        return self.project_tokens(embed_weight.to(self.pass_hidden_proj.weight.dtype)).contiguous()

    def nodes(self, token_states, candidate_log_probs, pass_hidden) -> torch.Tensor:
        """Candidate node vectors [b, S, K, H]."""
        s, dtype = candidate_log_probs.shape[1], self.pass_hidden_proj.weight.dtype
        feats = self.feature_norm(confidence_features(candidate_log_probs).to(dtype))
        return (
            token_states.to(dtype)
            + self.pass_hidden_proj(pass_hidden.to(dtype)).unsqueeze(2)
            + self.feature_mlp(feats)
            + self.slot_embedding[0, 0, :s]
            + self.rank_embedding[0, 0]
        )

    def vectors(self, token_states, candidate_log_probs, pass_hidden, anchor_hidden):
        """Unit vectors: out [b, S, K, d], in [b, S, K, d], anchor out [b, d]."""
        b, s, k = candidate_log_probs.shape
        if k != self.config.candidate_topk or not 1 <= s <= self.config.num_slots:
            raise ValueError(
                f"LiLiCorr head built for K={self.config.candidate_topk} and at most "
                f"{self.config.num_slots} slots got a lattice of {s} slots x {k} candidates."
            )
        x = self.nodes(token_states, candidate_log_probs, pass_hidden).reshape(b, s * k, self.width)
        bias = lattice_attention_bias(self.relative_slot_bias, self.same_slot_bias, s, k)
        for layer in self.layers:
            x = layer(x, bias)
        x = self.output_norm(x).view(b, s, k, self.width)

        t = self.anchor_norm(self.context_proj(anchor_hidden.to(x.dtype)))  # [b, H]
        w = self.factor_input_proj.weight  # [H, 3H] over concat[h, t, h*t]
        h, tt = self.width, t[:, None, None, :]
        fused = F.silu(
            F.linear(x, w[:, :h], self.factor_input_proj.bias)
            + F.linear(tt, w[:, h : 2 * h])
            + F.linear(x * tt, w[:, 2 * h :])
        )
        eps = self.config.vector_eps
        out_vec = F.normalize(self.out_head(fused), dim=-1, eps=eps)
        in_vec = F.normalize(self.in_head(fused), dim=-1, eps=eps)
        anchor_out = F.normalize(self.anchor_out_head(t), dim=-1, eps=eps)
        return out_vec, in_vec, anchor_out

    def forward(self, token_states, candidate_log_probs, pass_hidden, anchor_hidden):
        out_vec, in_vec, anchor_out = self.vectors(token_states, candidate_log_probs, pass_hidden, anchor_hidden)
        sigma = self.config.logit_scale
        start = sigma * torch.einsum("bd,bkd->bk", anchor_out.float(), in_vec[:, 0].float())
        pair = sigma * torch.matmul(out_vec[:, :-1].float(), in_vec[:, 1:].float().transpose(-1, -2))
        return start, pair
