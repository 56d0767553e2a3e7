"""Oracle-prefix supervision (paper Sec. 3.3): slot s is supervised only when valid and its ground-truth token and every
earlier slot's are among the K candidates. Teacher forcing (Eq. 2): z_1 = start, z_s[k] = pair[s-1, g_{s-1}, k]."""

from __future__ import annotations

import torch

from .errors import LiLiCorrError


class ObjectiveInputError(LiLiCorrError, ValueError):
    """A tensor handed to the oracle / loss functions has the wrong shape or dtype."""


def expect(tensor: torch.Tensor, name: str, shape: tuple, kind: str | None = None) -> None:
    """ObjectiveInputError unless ``tensor`` matches ``shape`` (None = any) and ``kind``'s dtype family."""
    if not isinstance(tensor, torch.Tensor):
        raise ObjectiveInputError(f"{name}: expected a torch.Tensor, got {type(tensor).__name__}.")
    want = "[" + ", ".join("*" if d is None else str(d) for d in shape) + "]"
    if tensor.dim() != len(shape) or any(d is not None and d != t for d, t in zip(shape, tensor.shape)):
        raise ObjectiveInputError(
            f"{name}: expected shape {want}, got {list(tensor.shape)}; "
            "check the N (rows), S (drafted slots = block_size-1) and K (candidates) axes."
        )
    ok = {
        None: True,
        "int": not tensor.dtype.is_floating_point and not tensor.dtype.is_complex and tensor.dtype != torch.bool,
        "bool": tensor.dtype == torch.bool,
        "float": tensor.dtype.is_floating_point,
    }[kind]
    if not ok:
        raise ObjectiveInputError(f"{name}: expected a {kind} tensor, got dtype {tensor.dtype}; cast it first.")


def oracle_prefix(
    candidate_ids: torch.Tensor,  # [N, S, K] token ids of the drafter's top-K per slot
    targets: torch.Tensor,  # [N, S] ground-truth token g_s per slot
    valid: torch.Tensor,  # [N, S] bool, slot lies inside the supervised sequence
) -> tuple[torch.Tensor, torch.Tensor]:
    """-> (gt_index [N, S] int64: g_s's position among the K candidates or -1, prefix [N, S] bool)."""
    expect(candidate_ids, "candidate_ids", (None, None, None), "int")
    n, s, _ = candidate_ids.shape
    expect(targets, "targets", (n, s), "int")
    expect(valid, "valid", (n, s), "bool")
    hit = candidate_ids == targets.unsqueeze(-1)  # [N, S, K]
    covered = hit.any(dim=-1) & valid  # [N, S]
    # first matching position (candidates are distinct top-K ids, so there is at most one)
    gt_index = torch.where(covered, hit.to(torch.int8).argmax(dim=-1), -1).to(torch.int64)
    prefix = covered.to(torch.int8).cumprod(dim=-1).bool()  # stays 1 until the first miss
    return gt_index, prefix


def teacher_forced_scores(
    start: torch.Tensor,  # [N, K]          z_1 = sigma * cos(out_anchor, in_{1,k})
    pair: torch.Tensor,  # [N, S-1, K, K]   pair[:, s-1, i, j] = sigma * cos(out_{s,i}, in_{s+1,j})
    gt_index: torch.Tensor,  # [N, S] from oracle_prefix
) -> torch.Tensor:
    """-> z [N, S, K]: each slot's scores given the ground-truth predecessor (Eq. 2; absent -1 reads row 0)."""
    expect(start, "start", (None, None), "float")
    n, k = start.shape
    expect(pair, "pair", (n, None, k, k), "float")
    expect(gt_index, "gt_index", (n, pair.shape[1] + 1), "int")
    prev = gt_index[:, :-1].clamp(min=0).to(torch.int64)  # [N, S-1] g_{s-1}, absent -> 0
    rows = prev[:, :, None, None].expand(-1, -1, 1, k)  # [N, S-1, 1, K]
    follow = pair.gather(2, rows).squeeze(2)  # [N, S-1, K] = pair[:, s-1, g_{s-1}, :]
    return torch.cat([start.unsqueeze(1).to(follow.dtype), follow], dim=1)


def oracle_prefix_coverage(prefix: torch.Tensor, valid: torch.Tensor) -> dict[str, torch.Tensor]:
    """0-dim fp32 metrics: ``mean_prefix_len`` (slots per row), ``supervised_fraction`` (|S| / valid slots)."""
    expect(prefix, "prefix", (None, None), "bool")
    expect(valid, "valid", tuple(prefix.shape), "bool")
    supervised = prefix.sum().float()
    return {
        "mean_prefix_len": prefix.sum(dim=-1).float().mean() if prefix.shape[0] else supervised * 0,
        "supervised_fraction": supervised / valid.sum().clamp(min=1).float(),
    }
