"""The select's plans (sglang_lilicorr/fast_path/plan.py): what kernels/tuning.py's tables resolve to for the two
measured heads (the served choices before the tables moved into one module, pinned here), the buckets, the rule for
unmeasured geometry, and the plans the select refuses by name."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from sglang_lilicorr.kernels import tuning
from sglang_lilicorr.kernels.tuning import ALL_GEMMS, TopKLaunch
from sglang_lilicorr.fast_path.plan import PYTORCH, Device, HeadGeometry, SelectPlan, SelectPlans, batch_bounds, plan_for, plans_for

H100 = Device(triton=True, cuda=True, pdl=True)
INTERPRETER = Device(triton=True, cuda=False, pdl=False)
PAPER = HeadGeometry(width=1024, factor_dim=1024, slots=15, topk=8, dtype=torch.bfloat16)
TESTBED = HeadGeometry(width=256, factor_dim=256, slots=15, topk=8, dtype=torch.bfloat16)

BS1_TOPK = TopKLaunch(group=32, collect_tiles=4)
SERVED = {  # (head, bs) -> the plan on an sm_90 card: the served path's choices at c745522, kernel for kernel
    ("paper", 1): SelectPlan(
        overlap=True, pdl=True, triton_gemms={"feature_down", "out_proj", "ffn_up", "factor", "out_in"}, fold_norms=True,
        pass_beside_topk=True, nodes_in_gemm=True, release_early=True, tiles={"nodes": "narrow", "out_in": "narrow", "pass": "thin"},
        topk_launch=BS1_TOPK, cosine_split=8, attention_block_m=16,
    ),
    ("paper", 4): SelectPlan(overlap=True, pdl=True),
    ("paper", 16): SelectPlan(overlap=True, pdl=True, triton_gemms={"ffn_up"}),
    ("paper", 32): SelectPlan(overlap=True, pdl=True, triton_gemms={"ffn_up"}),
    ("testbed", 1): SelectPlan(
        overlap=True, pdl=True, triton_gemms=ALL_GEMMS, fold_norms=True, pass_beside_topk=True, nodes_in_gemm=True,
        release_early=True, merge_in_confidence=True,
        tiles={"nodes": "narrow", "out_proj": "narrow", "ffn_up": "narrow", "factor": "narrow"},
        topk_launch=BS1_TOPK._replace(few_rows_tiles=3), attention_block_m=16,
    ),
    ("testbed", 4): SelectPlan(overlap=True, pdl=True, triton_gemms=ALL_GEMMS, fold_norms=True),
    ("testbed", 16): SelectPlan(overlap=True, triton_gemms={"ffn_up"}, norm_epilogue=True),
    ("testbed", 32): SelectPlan(overlap=True, triton_gemms={"ffn_up"}, norm_epilogue=True),
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
    """The head tables' batch bounds, and the GEMM tables' row bounds in requests of S x K rows (no row count of one
    geometry in the tables)."""
    assert batch_bounds(PAPER) == (1, 4, 8)  # 120 rows a request: 128, 480, 512 and 1024 rows
    assert batch_bounds(dataclasses.replace(PAPER, slots=3, topk=4)) == (1, 10, 40, 42, 85)  # 12 rows a request


def test_cpu_and_pytorch_plans():
    """The interpreter: Triton kernels without PDL or a side stream (so no Triton GEMMs but the FFN up's band, no
    folded norms); the bs-1 launches that need neither stay. The PyTorch path: only the top-K's launch."""
    assert plan_for(PAPER, 1, INTERPRETER) == SelectPlan(triton_gemms={"ffn_up"}, topk_launch=BS1_TOPK, cosine_split=8,
                                                         attention_block_m=16)
    assert plan_for(TESTBED, 1, PYTORCH) == SelectPlan(fused=False, topk_launch=BS1_TOPK._replace(few_rows_tiles=3))
    assert plan_for(TESTBED, 2, PYTORCH) == SelectPlan(fused=False)


def test_fp32_heads_keep_their_gemm_config():
    fp32 = plan_for(dataclasses.replace(PAPER, dtype=torch.float32), 1, H100)
    assert fp32 == dataclasses.replace(SERVED["paper", 1], tiles={})


def test_unmeasured_widths_take_the_nearest_measured_entry():
    """By ratio, a tie to the smaller width: 512 (twice 256, half 1024) and 64 take the testbed head's entries, 2048
    the paper head's (the norm epilogue follows its kernel's table by shape); D takes the cosine split's nearest D,
    kept only where it cuts D into whole 128-column steps."""
    for width, like in ((512, TESTBED), (64, TESTBED), (2048, PAPER)):
        geometry = dataclasses.replace(like, width=width, factor_dim=like.factor_dim)
        for batch in (1, 4, 16):
            plan, measured = plan_for(geometry, batch, H100), plan_for(like, batch, H100)
            assert plan.norm_epilogue == (not plan.fold_norms and tuning.norm_band(width, batch * like.lattice_rows)[3])
            assert dataclasses.replace(plan, norm_epilogue=measured.norm_epilogue) == measured
    assert plan_for(dataclasses.replace(PAPER, factor_dim=2048), 1, H100).cosine_split == 8  # 16 steps over 8 programs
    assert plan_for(dataclasses.replace(PAPER, factor_dim=1536), 1, H100).cosine_split == 1  # 12 steps: 8 do not divide
    assert plan_for(dataclasses.replace(PAPER, factor_dim=256), 1, H100).cosine_split == 1  # the testbed's D: measured slower
    assert tuning.COSINE_SPLIT[1024].value == 8


@pytest.mark.parametrize(
    "fields, message",
    [
        (dict(fused=False, fold_norms=True), r"\['fold_norms'\] set Triton kernels, but fused=False runs the PyTorch path"),
        (dict(fused=False, cosine_split=2), r"\['cosine_split'\] set Triton kernels"),
        (dict(fold_norms=True, norm_epilogue=True), "fold_norms and norm_epilogue both take the lattice's norms; pick one"),
        (dict(pass_beside_topk=True), "pass_beside_topk runs the top-K beside the pass projection under PDL; it needs pdl"),
        (dict(pdl=True, pass_beside_topk=True, nodes_in_gemm=True), "nodes_in_gemm .* needs pass_beside_topk and fold_norms"),
        (dict(release_early=True), "release_early releases the next kernel of a PDL chain; it needs pdl"),
        (dict(triton_gemms={"qkv", "lm_head"}), r"triton_gemms \['lm_head'\] are no GEMM roles"),
        (dict(tiles={"pass": "thinner"}), r"tiles 'pass': 'thinner' needs a role of .* and a config of"),
        (dict(tiles={"lm_head": "thin"}), r"tiles 'lm_head': 'thin' needs a role of"),
        (dict(cosine_split=0), r"cosine_split=0 must be a positive int"),
        (dict(attention_block_m=24), r"attention_block_m=24 must be a power of two >= 16"),
    ],
)
def test_plans_that_cannot_run_are_named(fields, message):
    with pytest.raises(ValueError, match=message):
        SelectPlan(**fields)


def test_plans_the_device_or_head_cannot_run_are_named():
    with pytest.raises(ValueError, match=r"\['fused'\] need a device with \['fused'\]"):
        SelectPlan().check(PAPER, PYTORCH)
    with pytest.raises(ValueError, match=r"\['overlap', 'pdl'\] need a device with"):
        SelectPlan(overlap=True, pdl=True).check(PAPER, INTERPRETER)
    with pytest.raises(ValueError, match="an fp32 head keeps the fp32 config"):
        SelectPlan(tiles={"nodes": "narrow"}).check(dataclasses.replace(PAPER, dtype=torch.float32), H100)
    with pytest.raises(ValueError, match=r"cosine_split=3 does not cut D = 1024 into whole 128-column steps"):
        SelectPlan(cosine_split=3).check(PAPER, H100)
    for bound, plan in plans_for(PAPER, H100).buckets():
        plan.check(PAPER, H100)


def test_plans_map_bucket_by_bucket():
    plans = plans_for(PAPER, H100)
    unsplit = plans.map(lambda plan, bound: dataclasses.replace(plan, cosine_split=1))
    assert unsplit.bounds == plans.bounds and unsplit.at(1).cosine_split == 1 and plans.at(1).cosine_split == 8
    assert [bound for bound, _ in plans.buckets()] == [*plans.bounds, None]
    assert SelectPlans.every(SelectPlan()).at(10**6) == SelectPlan()
