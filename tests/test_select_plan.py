"""The select's plans (sglang_lilicorr/fast_path/plan.py): what kernels/tuning.py's tables resolve to for the two
measured heads, the buckets, the rule for unmeasured widths, and the plans the select refuses by name."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from sglang_lilicorr.fast_path.plan import (
    PYTORCH,
    Device,
    HeadGeometry,
    SelectPlan,
    SelectPlans,
    batch_bounds,
    plan_for,
    plans_for,
    torch_plan,
)

H100 = Device(triton=True, cuda=True, pdl=True)
INTERPRETER = Device(triton=True, cuda=False, pdl=False)
PAPER = HeadGeometry(width=1024, factor_dim=1024, slots=15, topk=8, dtype=torch.bfloat16)
TESTBED = HeadGeometry(width=256, factor_dim=256, slots=15, topk=8, dtype=torch.bfloat16)

SERVED = {  # (head, bs) -> the plan on an sm_90 card
    ("paper", 1): SelectPlan(route="folded", pdl=True, overlap=True),
    ("paper", 4): SelectPlan(route="unfolded", pdl=True, overlap=True),
    ("paper", 32): SelectPlan(route="unfolded", pdl=True, overlap=True),
    ("testbed", 1): SelectPlan(route="folded", pdl=True, overlap=True),
    ("testbed", 4): SelectPlan(route="folded", pdl=True, overlap=True),
    ("testbed", 16): SelectPlan(route="unfolded", overlap=True),  # no PDL from bs 16 on this head (tuning.PDL)
    ("testbed", 32): SelectPlan(route="unfolded", overlap=True),
}


@pytest.mark.parametrize("head, bs", list(SERVED))
def test_served_plans_of_the_measured_heads(head, bs):
    geometry = PAPER if head == "paper" else TESTBED
    assert plan_for(geometry, bs, H100) == SERVED[head, bs]
    assert plans_for(geometry, H100).at(bs) == SERVED[head, bs]


@pytest.mark.parametrize("geometry", [PAPER, TESTBED, dataclasses.replace(TESTBED, slots=3, topk=4)])
@pytest.mark.parametrize("device", [H100, INTERPRETER, PYTORCH])
def test_a_bucket_has_one_plan(geometry, device):
    """The plan resolved once per bucket is plan_for's at every batch size of it."""
    plans = plans_for(geometry, device)
    assert list(plans.bounds) == sorted(set(plans.bounds)) and len(plans.plans) == len(plans.bounds) + 1
    for batch in range(1, 3 * plans.bounds[-1] + 3):
        assert plans.at(batch) == plan_for(geometry, batch, device)


def test_bounds_are_whole_requests_of_the_lattice():
    """The head tables' batch bounds, and the GEMM table's row bounds in requests of S x K rows (no row count of one
    geometry in the tables)."""
    assert batch_bounds(PAPER) == (1, 4, 8)  # 120 rows a request: 128, 512 and 1024 rows
    assert batch_bounds(dataclasses.replace(PAPER, slots=3, topk=4)) == (1, 10, 42, 85)  # 12 rows a request


def test_cpu_and_pytorch_plans():
    """The interpreter: Triton kernels without PDL or a side stream, so the unfolded route; the PyTorch path: the torch
    route with top-K and walk in PyTorch too. torch_plan: the torch route with the device's top-K and walk."""
    assert plan_for(PAPER, 1, INTERPRETER) == SelectPlan(route="unfolded")
    assert plan_for(TESTBED, 1, PYTORCH) == SelectPlan(route="torch", kernels=False)
    assert not SelectPlan(route="torch").fused and SelectPlan(route="folded").fused
    assert torch_plan(H100) == torch_plan(INTERPRETER) == SelectPlan(route="torch")
    assert torch_plan(PYTORCH, "viterbi") == SelectPlan(route="torch", kernels=False, walk="viterbi")


def test_the_walk_rule_and_the_merge_reach_every_bucket():
    def merge(logits):
        return logits

    for device in (H100, PYTORCH):
        plans = plans_for(PAPER, device, walk="viterbi", merge=merge)
        assert all(plan.walk == "viterbi" and plan.merge is merge for plan in plans.plans)
        assert plans.at(4) == dataclasses.replace(plan_for(PAPER, 4, device), walk="viterbi", merge=merge)
    assert {plan.walk for plan in plans_for(PAPER, H100).plans} == {"greedy"}


def test_unmeasured_widths_take_the_nearest_measured_entry():
    """By ratio, a tie to the smaller width: 512 (twice 256, half 1024) and 64 take the testbed head's entries, 2048
    the paper head's."""
    for width, like in ((512, TESTBED), (64, TESTBED), (2048, PAPER)):
        for batch in (1, 4, 16):
            assert plan_for(dataclasses.replace(like, width=width), batch, H100) == plan_for(like, batch, H100)


@pytest.mark.parametrize(
    "fields, message",
    [
        (dict(route="fused"), r"route='fused' is none of \('torch', 'folded', 'unfolded'\)"),
        (
            dict(route="torch", pdl=True),
            "pdl and overlap launch Triton kernels, but route='torch' runs the PyTorch path",
        ),
        (dict(walk="beam"), "walk='beam' is not a decode rule; choose one of greedy, viterbi"),
        (dict(route="folded", kernels=False), "route='folded' runs Triton kernels; kernels=False is the torch route's"),
    ],
)
def test_plans_that_cannot_run_are_named(fields, message):
    with pytest.raises(ValueError, match=message):
        SelectPlan(**fields)


def test_plans_the_device_cannot_run_are_named():
    with pytest.raises(ValueError, match=r"\['kernels'\] need a device with \['kernels'\]"):
        SelectPlan().check(PYTORCH)
    with pytest.raises(ValueError, match=r"\['kernels'\] need a device"):
        SelectPlan(route="torch").check(PYTORCH)  # the torch route with Triton's top-K and walk
    SelectPlan(route="torch", kernels=False).check(PYTORCH)
    with pytest.raises(ValueError, match=r"\['overlap', 'pdl'\] need a device with"):
        SelectPlan(overlap=True, pdl=True).check(INTERPRETER)
    for bound, plan in plans_for(PAPER, H100).buckets():
        plan.check(H100)


def test_plans_map_bucket_by_bucket():
    plans = plans_for(PAPER, H100)
    unfolded = plans.map(lambda plan, bound: dataclasses.replace(plan, route="unfolded"))
    assert unfolded.bounds == plans.bounds and unfolded.at(1).route == "unfolded" and plans.at(1).route == "folded"
    assert [bound for bound, _ in plans.buckets()] == [*plans.bounds, None]
    assert SelectPlans.every(SelectPlan()).at(10**6) == SelectPlan()
