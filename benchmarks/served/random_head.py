"""Give a DFlash draft a randomly initialised LiLiCorr head, for smoke tests of the serving path
(no draft token is expected to be accepted: it exercises the plumbing, not the speed-up).

  python -m benchmarks random-head DFLASH_DRAFT_DIR OUT_DIR [--seed 0]   (with sglang_lilicorr installed)
                [--topk 8] [--head-hidden 1024] [--layers 2] [--heads 8] [--factor-dim 1024]

Writes OUT_DIR in SGLang's LiLiCorrDraftModel format (sglang_lilicorr.checkpoint.add_random_head): the
drafter's tensors unchanged, the head under `lilicorr.`, config.json with architectures
["LiLiCorrDraftModel"] and the lilicorr_* keys.
"""

from __future__ import annotations

import argparse

from sglang_lilicorr.checkpoint import add_random_head


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("src")
    p.add_argument("out")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--topk", type=int, default=8)
    p.add_argument("--head-hidden", type=int, default=1024)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--factor-dim", type=int, default=1024)
    a = p.parse_args(argv)
    cfg = add_random_head(
        a.src,
        a.out,
        seed=a.seed,
        candidate_topk=a.topk,
        hidden_size=a.head_hidden,
        num_layers=a.layers,
        num_heads=a.heads,
        factor_dim=a.factor_dim,
    )
    print(f"random LiLiCorr draft -> {a.out}: {cfg}")
