"""The proposal micro-benchmark's parts for SGLang's two draft-time correctors, inside their own servers
(stage_timer.proposal_microbench): random drafter states of bs requests through the server's own modules.

  domino  (a DFLASH worker whose draft has projector_type "domino") proposal = the Domino rollout from the drafter's
          states: SGLang's draft sampler (what its draft graph captures) for the graph variant, else
          domino_greedy_rollout as the eager step calls it; both compute the LM-head logits themselves
  dspark  (the DSPARK worker) proposal = the draft model's compute_base_logits (the LM head) + draft_markov_block
          (greedy or sampled as the server drafts) + the confidence head when the server built one

Each returns {"lm_head", "proposal"}: the head's time is proposal - lm_head (the same [bs*S, Hm] x [Hm, V] GEMM alone).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _states(w: torch.Tensor, shape: tuple, seed: int) -> torch.Tensor:
    g = torch.Generator(device=w.device).manual_seed(seed)
    return torch.randn(shape, generator=g, device=w.device).to(w.dtype)


def _tokens(w: torch.Tensor, count: int, vocab: int, seed: int) -> torch.Tensor:
    g = torch.Generator(device=w.device).manual_seed(seed + 1)
    return torch.randint(0, vocab, (count,), generator=g, device=w.device)


def is_domino(worker) -> bool:
    return bool(vars(worker).get("_is_domino"))


def is_dspark(worker) -> bool:
    return "gamma" in vars(worker) and hasattr(getattr(worker, "draft_model", None), "markov_head")


def domino_parts(worker, lm_head_weight: torch.Tensor, *, bs: int, graph: bool, seed: int = 0) -> dict:
    from sglang.srt.lora.layers import unwrap_lora_layer
    from sglang.srt.speculative.domino_utils import domino_greedy_rollout

    w, b = lm_head_weight, int(worker.block_size)
    vocab = int(worker.model_runner.model_config.vocab_size)
    hidden = _states(w, (bs, b, w.shape[1]), seed)  # [bs, B, Hm]: slot 0, then the drafted slots
    ids = _tokens(w, bs * b, vocab, seed)  # the block's input ids; the rollout reads slot 0's (the anchor)
    rows = hidden[:, 1:].reshape(bs * (b - 1), w.shape[1])
    sampler = vars(worker).get("_draft_sampler")
    if graph and sampler is not None:
        proposal = lambda: sampler(hidden.view(bs * b, -1), ids)  # noqa: E731
    else:
        target = worker.target_worker.model_runner.model
        proposal = lambda: domino_greedy_rollout(  # noqa: E731
            draft_hidden=hidden,
            bonus_tokens=ids.view(bs, b)[:, 0],
            target_embedding=target.get_input_embeddings(),
            lm_head_weight=unwrap_lora_layer(target.lm_head).weight,
            prefix_gru=worker.draft_model.prefix_gru,
            embed_proj=worker.draft_model.embed_proj,
            vocab_size=vocab,
            shift_label=bool(worker.draft_model.shift_label),
            candidate_pool_size=worker.domino_candidate_pool_size,
            in_cuda_graph=False,
        )
    return {"lm_head": lambda: F.linear(rows, w), "proposal": proposal}


def dspark_parts(worker, lm_head_weight: torch.Tensor, *, bs: int, seed: int = 0) -> dict:
    from sglang.srt.speculative.dspark_components.dspark_draft import draft_markov_block

    w, gamma, model = lm_head_weight, int(worker.gamma), worker.draft_model
    proposer = worker._proposer
    hidden = _states(w, (bs * gamma, w.shape[1]), seed)  # the drafted slots' raw hidden states
    anchor = _tokens(w, bs, int(model.markov_head.vocab_size), seed)
    temperatures = torch.zeros(bs, device=w.device)

    def proposal():
        base, features = model.compute_base_logits(hidden)
        tokens, _ = draft_markov_block(
            markov_head=model.markov_head,
            base_logits=base.view(bs, gamma, -1),
            anchor_tokens=anchor,
            draft_hidden=hidden.view(bs, gamma, -1),
            step_temperatures=temperatures,
            noise=proposer.noise,
            tp_sync=proposer._tp_sync,
            greedy_draft=proposer._greedy_draft,
        )
        if model.confidence_head is not None:
            model.compute_confidence(anchor_tokens=anchor, draft_tokens=tokens, confidence_features=features)
        return tokens

    return {"lm_head": lambda: F.linear(hidden, w), "proposal": proposal}
