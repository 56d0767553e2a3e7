"""Exactness of T > 0 verification: each emitted token is distributed as the target's p.

Pearson chi-square against p at significance 0.001 (critical values tabulated, no scipy);
bins expecting fewer than 5 draws are pooled."""

import pytest
import torch

from sglang_lilicorr.reference import sample_verify

# upper 0.1% points of chi-square(df)
CHI2_999 = {1: 10.828, 2: 13.816, 3: 16.266, 4: 18.467, 5: 20.515, 6: 22.458, 7: 24.322}


def chi_square(counts: torch.Tensor, probs: torch.Tensor) -> tuple[float, int]:
    """-> (statistic, degrees of freedom), pooling the bins that expect < 5 draws."""
    expected = probs * counts.sum()
    small = expected < 5
    obs = torch.cat([counts[~small], counts[small].sum().view(1)]) if small.any() else counts
    exp = torch.cat([expected[~small], expected[small].sum().view(1)]) if small.any() else expected
    return float(((obs - exp) ** 2 / exp).sum()), len(obs) - 1


def emitted_at(slot, logits, draft, temperature, trials, seed):
    """Counts of the token emitted at `slot`, over trials where every earlier draft was accepted."""
    gen = torch.Generator().manual_seed(seed)
    counts = torch.zeros(logits.shape[1], dtype=torch.float64)
    for _ in range(trials):
        m, emitted = sample_verify(logits, draft, temperature, gen)
        if m >= slot:
            counts[emitted[slot]] += 1
    return counts


def test_emitted_tokens_follow_the_target_distribution():
    torch.manual_seed(0)
    v, temperature = 8, 1.3
    logits = torch.randn(3, v) * 1.5  # S = 2 drafted slots + the bonus row
    probs = torch.softmax(logits.double() / temperature, dim=-1)
    likeliest = probs.argmax(dim=-1)
    middling = probs.argsort(dim=-1, descending=True)[:, 2]  # accepted sometimes, rejected often
    for slot in (0, 1, 2):  # slot 2 is the bonus token after a full accept
        # earlier slots draft their likeliest token (to reach this slot often), this slot a middling one
        draft = torch.tensor([int(likeliest[s]) if s < slot else int(middling[s]) for s in range(2)])
        counts = emitted_at(slot, logits, draft, temperature, trials=3000, seed=slot)
        assert counts.sum() > 200
        stat, df = chi_square(counts, probs[slot])
        assert stat < CHI2_999[df], (slot, counts, probs[slot])


def test_a_wrong_rule_fails_the_same_test():
    """Sanity of the statistic: always accepting the draft is not distributed as p."""
    probs = torch.softmax(torch.randn(8, generator=torch.Generator().manual_seed(0)).double(), dim=-1)
    counts = torch.zeros(8, dtype=torch.float64)
    counts[3] = 2000
    stat, df = chi_square(counts, probs)
    assert stat > CHI2_999[df]


def test_certain_and_impossible_drafts():
    logits = torch.tensor([[0.0, -1e9, -1e9, -1e9], [0.0, 0.0, 0.0, 0.0]])
    gen = torch.Generator().manual_seed(0)
    assert all(sample_verify(logits, torch.tensor([0]), 1.0, gen)[0] == 1 for _ in range(50))
    for _ in range(50):  # p(draft) = 0: always rejected, and the residual is token 0 alone
        assert sample_verify(logits, torch.tensor([2]), 1.0, gen) == (0, [0])
    with pytest.raises(ValueError, match="temperature must be > 0"):
        sample_verify(logits, torch.tensor([0]), 0.0)
