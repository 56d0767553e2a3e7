"""Teacher-forced exactness check of sampled outputs: is every emitted token distributed as the target's softmax?
For token x, u = F(x - 1) + V p(x) (p the float32 target's probabilities at temperature T, F their cumulative sum in id
order, V ~ U(0, 1) seeded) is uniform exactly when x ~ p; over many seeds per prompt the u of each position get a
chi-square test over BINS bins: one p-value per position. Records (benchmarks/served/sampling_exactness.py): JSON
lines of system, input_ids, output_ids, seed, temperature; position 1 is the prefill's token."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import torch
from torch import nn

BINS = 20


BATCH = 64  # records of one prompt teacher-forced together


def pit_values(
    model: nn.Module, input_ids: list[int], outputs: list[list[int]], temperature: float, generator: torch.Generator
) -> list[list[float]]:
    """u of every emitted token (module docstring) of each output of one prompt (outputs of one length), from one
    float32 teacher-forced pass of the HF causal LM `model` over them together: [len(outputs)][length]."""
    if not input_ids or not outputs or not outputs[0] or len({len(o) for o in outputs}) != 1:
        raise ValueError("pit_values: a prompt and outputs of one length >= 1 are needed (ignore_eos requests).")
    if temperature <= 0:
        raise ValueError(
            f"pit_values: temperature must be > 0 (a greedy output is checked by reference.check), got {temperature}."
        )
    device = next(model.parameters()).device
    n, length = len(input_ids), len(outputs[0])
    ids = torch.tensor([list(input_ids) + list(o) for o in outputs], device=device)  # [B, n + L]
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        with torch.no_grad():
            logits = model(input_ids=ids, use_cache=False).logits[:, n - 1 : n + length - 1].double()  # [B, L, V]
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32
    p = torch.softmax(logits / temperature, dim=-1)
    x = ids[:, n:].unsqueeze(-1)  # [B, L, 1]
    px = p.gather(-1, x)
    below = torch.cumsum(p, dim=-1).gather(-1, x) - px  # F(x - 1)
    v = torch.rand(ids.shape[0], length, 1, generator=generator, dtype=torch.float64).to(p.device)
    return (below + v * px).squeeze(-1).clamp(0.0, 1.0).tolist()


def chi_square_uniform(u: list[float], bins: int = BINS) -> dict:
    """Chi-square test of u against U(0, 1) over `bins` equal bins: n, chi2, dof and the p-value."""
    if len(u) < 5 * bins:
        raise ValueError(f"chi_square_uniform: {len(u)} values for {bins} bins; send at least {5 * bins} requests.")
    counts = torch.bincount(
        (torch.tensor(u, dtype=torch.float64) * bins).long().clamp(0, bins - 1), minlength=bins
    ).double()
    expected = len(u) / bins
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    dof = bins - 1
    p = float(
        torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64), torch.tensor(chi2 / 2, dtype=torch.float64))
    )
    return {"n": len(u), "chi2": round(chi2, 3), "dof": dof, "p": p}


def position_pvalues(model: nn.Module, records: list[dict], positions: list[int], seed: int = 0) -> dict[str, dict]:
    """{position: chi_square_uniform of that position's u over the records} (positions counted from 1)."""
    generator = torch.Generator().manual_seed(seed)
    groups = defaultdict(list)  # (prompt, output length, temperature) -> outputs
    for r in records:
        groups[(tuple(r["input_ids"]), len(r["output_ids"]), float(r["temperature"]))].append(r["output_ids"])
    u = defaultdict(list)
    for (prompt, _, temperature), outputs in groups.items():
        for k in range(0, len(outputs), BATCH):
            for values in pit_values(model, list(prompt), outputs[k : k + BATCH], temperature, generator):
                for j in positions:
                    if j <= len(values):
                        u[j].append(values[j - 1])
    return {str(j): chi_square_uniform(u[j]) for j in positions}


def read_records(paths: list[Path]) -> dict[str, list[dict]]:
    """{system: records} from JSONL files; a malformed line is named with its file and line number."""
    systems = defaultdict(list)
    for path in paths:
        for k, line in enumerate(Path(path).read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                r = json.loads(line)
                systems[r["system"]].append({key: r[key] for key in ("input_ids", "output_ids", "temperature", "seed")})
            except (json.JSONDecodeError, KeyError, TypeError) as e:
                raise ValueError(
                    f"{path}:{k}: not a sampled-output record ({e}); expected system, input_ids, output_ids, "
                    "temperature and seed (benchmarks/served/sampling_exactness.py writes them)."
                ) from e
    return dict(systems)
