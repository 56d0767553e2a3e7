"""Decoders: greedy walk (Eq. 8) and exact Viterbi (App. F) against brute force; the greedy path's margin."""

import itertools

import pytest
import torch

from benchmarks.micro.head_bench import greedy_margin
from sglang_lilicorr.walk import greedy_walk, path_score, viterbi

from devices import DevicesMade


def lattice(b, s, k, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(b, k, generator=g), torch.randn(b, s - 1, k, k, generator=g)


def brute_force_best(start, pair):
    b, k = start.shape
    s = pair.shape[1] + 1
    paths = torch.tensor(list(itertools.product(range(k), repeat=s)))
    scores = torch.stack([path_score(start, pair, p.expand(b, s)) for p in paths], dim=1)
    return scores.max(dim=1).values


@pytest.mark.parametrize("seed", range(5))
def test_viterbi_is_the_exact_maximiser(seed):
    start, pair = lattice(3, 4, 3, seed)
    best = path_score(start, pair, viterbi(start, pair))
    torch.testing.assert_close(best, brute_force_best(start, pair))


@pytest.mark.parametrize("seed", range(5))
def test_greedy_commits_each_argmax_given_its_predecessor(seed):
    start, pair = lattice(2, 6, 4, seed)
    idx = greedy_walk(start, pair)
    for r in range(2):
        assert idx[r, 0] == start[r].argmax()
        for s in range(1, 6):
            assert idx[r, s] == pair[r, s - 1, idx[r, s - 1]].argmax()
    assert (path_score(start, pair, idx) <= brute_force_best(start, pair) + 1e-5).all()


def test_greedy_differs_from_viterbi_when_an_early_sacrifice_pays():
    # Slot 1 prefers candidate 0 slightly, but only candidate 1 leads to a rich slot 2.
    start = torch.tensor([[1.0, 0.9]])
    pair = torch.tensor([[[[0.0, 0.0], [5.0, 5.0]]]])
    assert greedy_walk(start, pair).tolist() == [[0, 0]]
    assert viterbi(start, pair).tolist() == [[1, 0]]


def test_ties_and_minus_infinity_pick_the_lowest_index():
    ninf = float("-inf")
    start = torch.tensor([[ninf, 2.0, 2.0, ninf], [ninf, ninf, ninf, ninf]])
    pair = torch.full((2, 1, 4, 4), ninf)
    pair[0, 0, 1] = torch.tensor([0.0, 3.0, 3.0, ninf])
    assert greedy_walk(start, pair).tolist() == [[1, 1], [0, 0]]
    assert viterbi(start, pair).tolist() == [[1, 1], [0, 0]]


def test_greedy_margin_is_the_smallest_gap_on_the_greedy_path():
    start = torch.tensor([[1.0, 3.0, 2.5]])
    pair = torch.tensor([[[[0.0, 0.0, 0.0], [5.0, 1.0, 4.0], [0.0, 9.0, 0.0]]]])  # from candidate 1: gap 1.0
    assert greedy_margin(start, pair).tolist() == [0.5]  # the start gap 3.0 - 2.5 is smaller
    pair[0, 0, 1] = torch.tensor([5.0, 4.9, 0.0])
    assert greedy_margin(start, pair).item() == pytest.approx(0.1, abs=1e-6)


def test_single_slot_block():
    start = torch.tensor([[0.1, 0.7, 0.2]])
    empty = torch.zeros(1, 0, 3, 3)
    assert greedy_walk(start, empty).tolist() == viterbi(start, empty).tolist() == [[1]]


def test_every_tensor_stays_on_the_inputs_device():
    """A helper tensor made on the host (an arange without device=) gives the same picks, but is copied to the GPU on
    every call; on meta inputs every tensor the decoders make must be meta."""
    start, pair = torch.empty(2, 4, device="meta"), torch.empty(2, 3, 4, 4, device="meta")
    with DevicesMade() as made:
        greedy_walk(start, pair)
        viterbi(start, pair)
        path_score(start, pair, torch.zeros(2, 4, dtype=torch.long, device="meta"))
    assert made.devices == {"meta"}
