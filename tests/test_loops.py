"""The loop detector of the data recipe (train/loops.py) on crafted token ids: loops of several periods are found
where their repetition begins, near-loops and short replies are kept whole."""

import pytest

from sglang_lilicorr.train.loops import Loop, LoopRule, find_loop

PREFIX = list(range(1000, 1050))  # 50 distinct tokens before any loop


def cycle(period: int, copies: float, base: int = 10) -> list[int]:
    one = [base + i for i in range(period)]
    return (one * (int(copies) + 1))[: round(period * copies)]


@pytest.mark.parametrize("period, copies", [(1, 100), (2, 40), (7, 20.5), (33, 2), (100, 2.5), (256, 2)])
def test_a_loop_is_cut_where_its_repetition_begins(period, copies):
    tail = cycle(period, copies)
    loop = find_loop(PREFIX + tail)
    assert loop == Loop(len(PREFIX) + period, period, len(tail) / period)
    ids = PREFIX + tail
    assert ids[: loop.start] == PREFIX + cycle(period, 1)  # the text and one copy of the cycle


def test_the_cycle_itself_not_a_multiple_and_not_a_shorter_coincidence():
    ids = PREFIX + cycle(5, 30)
    assert find_loop(ids).period == 5
    # a cycle whose own tokens repeat inside it (a b a c): period 4, not 2
    ids = PREFIX + [1, 2, 1, 3] * 20
    assert find_loop(ids) == Loop(len(PREFIX) + 4, 4, 20.0)


def test_a_loop_from_the_first_token():
    assert find_loop(cycle(3, 40)) == Loop(3, 3, 40.0)


@pytest.mark.parametrize(
    "ids",
    [
        [],
        [7],
        cycle(1, 63),  # shorter than min_span
        PREFIX + [0] * 30,  # a short run: 30 zeros
        PREFIX + cycle(3, 10),  # 0, 0, ... as code writes it: 30 tokens
        PREFIX + cycle(40, 1.9),  # a paragraph and most of a second copy: not two whole copies
        PREFIX + cycle(300, 3),  # a cycle longer than max_period
        # a numbered list: the same words, a new number each line (near-periodic, never exact)
        [t for i in range(60) for t in (2000 + i, 5, 6, 7)],
        # a paragraph repeated three times, then the reply moves on
        PREFIX + cycle(30, 3) + list(range(3000, 3040)),
    ],
)
def test_near_loops_and_short_replies_are_kept(ids):
    assert find_loop(ids) is None


def test_the_rule_sets_period_copies_and_span():
    ids = PREFIX + cycle(300, 3)
    assert find_loop(ids, LoopRule(max_period=512)).period == 300
    assert find_loop(PREFIX + cycle(20, 3), LoopRule(min_repeats=4)) is None
    assert find_loop(PREFIX + [0] * 30, LoopRule(min_span=16)) == Loop(51, 1, 30.0)
    with pytest.raises(ValueError, match="min_repeats=1"):
        LoopRule(min_repeats=1)
    with pytest.raises(ValueError, match="check_every=0"):
        LoopRule(check_every=0)
