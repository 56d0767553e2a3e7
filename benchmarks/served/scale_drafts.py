"""The random Domino and DSpark drafts of the Qwen3-8B-scale cost table (benchmarks/scale.py): the scale's DFlash
drafter with a random corrector head, written by our baselines' export code (train.export.draft_config +
train.heads.serving_tensors), so stock SGLang serves them (docs/BASELINES.md).

Each head is at the paper's configuration as far as SGLang's modules allow (benchmarks/README.md, "Scale"):
  domino  a GRU and correction MLP over the drafter's hidden width (gru_hidden_dim = emb_dim = Hm, App. B);
          served as DFLASH with SGLang's default block-shared candidate pool (DOMINO_CANDIDATE_POOL)
  dspark  a width-matched vanilla Markov head (markov_rank = Hm; the head type SGLang's fused greedy kernel runs)
          and its confidence head, served as DSPARK with static verification (DSPARK_ENV)
"""

from __future__ import annotations

from pathlib import Path

from sglang_lilicorr.baselines import DominoConfig, DSparkConfig

CORRECTORS = ("domino", "dspark")
DOMINO_CANDIDATE_POOL = 2048  # SGLang 0.5.23's default --speculative-domino-candidate-pool-size
DSPARK_ENV = {
    # every request verifies the whole window (gamma + 1 = 16 tokens), as DFLASH and LILICORR do; the ragged modes
    # size each request's window from the confidence head, which random weights make meaningless
    "SGLANG_RAGGED_VERIFY_MODE": "static",
    # the greedy draft (no step logits kept): what a T = 0 server runs, as the other systems' greedy proposals
    "SGLANG_DSPARK_USE_GREEDY_DRAFT": "1",
}


def corrector_config(system: str, hidden_size: int) -> DominoConfig | DSparkConfig:
    """The paper-configuration head of `system` (CORRECTORS) for a drafter of width hidden_size."""
    if system == "domino":
        return DominoConfig(gru_hidden_dim=hidden_size, emb_dim=hidden_size)
    if system == "dspark":
        return DSparkConfig(markov_rank=hidden_size, markov_head_type="vanilla")
    raise ValueError(f"no corrector draft for system {system!r}; choose one of {', '.join(CORRECTORS)}.")


def add_random_corrector(source: Path, target: Path, system: str, *, seed: int = 0, device: str = "cpu") -> Path:
    """`target` = the DFlash draft at `source` with a random `system` head (PyTorch's default initialisation),
    exported as SGLang serves it, in the draft's dtype."""
    import torch

    from sglang_lilicorr.checkpoint import DTYPES, dtype_of, read_config, read_tensors, save_checkpoint
    from sglang_lilicorr.drafter import DrafterConfig
    from sglang_lilicorr.train.export import draft_config
    from sglang_lilicorr.train.heads import build_head, serving_tensors

    config = read_config(source)
    drafter = DrafterConfig.from_hf_config(config)
    head_config = corrector_config(system, drafter.hidden_size)
    dtype = dtype_of(config)
    name = next(k for k, v in DTYPES.items() if v == dtype)
    torch.manual_seed(seed)
    with torch.device(device):
        head = build_head(head_config, drafter)
    tensors = {**read_tensors(source), **{k: v.to(dtype).cpu() for k, v in serving_tensors(head).items()}}
    del head
    return save_checkpoint(target, draft_config(drafter, head_config, name), tensors)
