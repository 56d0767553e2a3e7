"""benchmarks/micro/select_digest.py on CPU (--smoke): one line per variant and bs, the same digest on a second run,
a different one for different inputs."""

from benchmarks.micro.select_digest import digest, run

import torch


def test_digest_lines_repeat_and_tell_inputs_apart():
    first, again = run("paper", [1, 2], ["served"], smoke=True), run("paper", [1, 2], ["served"], smoke=True)
    assert first == again and len(first) == 2
    assert first[0].startswith("served bs 1 eager ") and first[0].split()[-1] != first[1].split()[-1]
    assert digest([torch.zeros(3)]) != digest([torch.zeros(4)]) and len(digest([torch.ones(2)])) == 16
