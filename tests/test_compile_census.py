"""The select path's Triton compiles over SGLang's captured batch sizes (benchmarks/micro/compile_census.py): each
distinct specialization key is one compile on a cold cache, and a server's draft-graph capture pays for all of them."""

import json

import pytest
import torch

from benchmarks.micro.compile_census import (
    GEOMETRIES,
    census,
    cuda_key,
    first_seen,
    recorded_launches,
    summary,
)
from sglang_lilicorr.config import LiLiCorrConfig
from sglang_lilicorr.fast_path.plan import HeadGeometry, batch_bounds
from sglang_lilicorr.kernels.head_norm import _row_bias_silu_kernel
from sm90_build import check_in_fresh_process
from triton_mode import needs_interpreter

# Distinct keys per kernel at the testbed head over batch sizes 1..32, as an H100 compiles them: 77 before the
# batch-derived integers went to do_not_specialize and the TMA GEMM's program count to the grid, 37 before the select
# kept two fused routes, 34 since.
TESTBED_COMPILES = {
    "_add_rmsnorm_kernel": 3,
    "_confidence_up_kernel": 2,
    "_gemm_kernel": 14,
    "_gemm_tma_kernel": 2,
    "_lattice_attention_kernel": 3,
    "_lattice_cosine_kernel": 2,
    "_lattice_nodes_kernel": 2,
    "_row_bias_silu_kernel": 1,
    "_topk_lse_merge_kernel": 3,
    "_topk_lse_split_kernel": 2,
}


@needs_interpreter
def test_launch_key_is_tritons_specialization(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # Triton's modules that launch_key imports check the mode
    x, bias = torch.empty(4, 16), torch.empty(1, 16)
    with recorded_launches() as launches:  # n_rows is in the kernel's do_not_specialize
        for rows_per_group, n_rows in ((16, 16), (16, 17), (17, 16), (1, 1)):
            _row_bias_silu_kernel[(1,)](
                x, bias, 16, rows_per_group, n_rows, 16, ROWS=4, BLOCK_N=16, PDL=False, num_warps=4
            )
    keys = [{f[0]: f[1:] for f in key if len(f) == 3} for _, key in launches]
    assert keys[0] == keys[1]
    assert keys[0]["rows_per_group"] == ("i32", "D") and keys[2]["rows_per_group"] == ("i32", "")
    assert keys[3]["rows_per_group"] == ("constexpr", 1) and keys[3]["n_rows"] == ("i32", None)
    assert keys[0]["pre_ptr"] == ("*fp32", "D") and keys[0]["BLOCK_N"] == ("constexpr", 16)
    assert ("num_warps", "4") in launches[0][1]


@pytest.fixture(scope="module")
def testbed_keys():
    """The census of the testbed head over batch sizes 1..32."""
    return census(GEOMETRIES["testbed"], range(1, 33))


@needs_interpreter
def test_capture_compiles_at_most_the_established_count(testbed_keys):
    keys = testbed_keys
    counts = summary(keys)
    grown = {
        name: (count, TESTBED_COMPILES.get(name, 0), first_seen(keys, name))
        for name, count in counts.items()
        if name != "total" and count > TESTBED_COMPILES.get(name, 0)
    }
    assert not grown, (
        "kernels compiled more often over batch sizes 1..32 than established (name: (keys, bound, batch "
        f"sizes that brought new keys)): {grown}; a batch-derived int or constexpr in their key?"
    )
    assert counts["total"] <= sum(TESTBED_COMPILES.values())


@needs_interpreter
def test_new_keys_only_where_a_plan_bucket_starts(testbed_keys):
    """Within a bucket of the plan (fast_path/plan.py: its tables and GEMM row bands) no key depends on the batch."""
    geo = GEOMETRIES["testbed"]
    config = LiLiCorrConfig(**geo.config)
    bounds = batch_bounds(
        HeadGeometry(config.hidden_size, config.factor_dim, config.num_slots, config.candidate_topk, torch.bfloat16)
    )
    starts = {1} | {b + 1 for b in bounds}
    off = {name: sorted(set(first_seen(testbed_keys, name)) - starts) for name in testbed_keys}
    assert not any(off.values()), f"new compile keys inside a plan bucket (buckets start at {sorted(starts)}): {off}"


@needs_interpreter
def test_cuda_keys_take_the_gpus_dot_choices(testbed_keys):
    """`cuda_key`: the census's keys with the 16-bit kernels' dot choices of a GPU, none merged."""
    gpu = {name: {cuda_key(name, key) for key in keys} for name, keys in testbed_keys.items()}
    assert {name: len(keys) for name, keys in gpu.items()} == {name: len(k) for name, k in testbed_keys.items()}
    fields = {name: [{f[0]: f[-1] for f in key} for key in keys] for name, keys in gpu.items()}
    assert all(not f["IEEE_F32"] for f in fields["_gemm_kernel"])
    assert all(not f["IEEE"] and not f["F32_DOT"] for f in fields["_lattice_attention_kernel"])
    cosine = fields["_lattice_cosine_kernel"]
    assert all(f["PRECISION"] == "tf32" and not f["F32_DOT"] and f["num_stages"] == "3" for f in cosine)


@needs_interpreter
def test_census_keys_compile_for_sm90_on_threads(testbed_keys, sm90_triton):
    """The benchmark's compile (compile_census --compile-threads): census keys, TMA descriptors included, build for
    sm_90 from the key alone, on a pool of threads, in a fresh process."""
    picked = [
        [name, cuda_key(name, next(iter(testbed_keys[name])))]
        for name in ("_gemm_tma_kernel", "_lattice_cosine_kernel", "_row_bias_silu_kernel")
    ]
    script = (
        "import json\n"
        "from benchmarks.micro.compile_census import compile_sm90\n"
        f"entries = [[n, tuple(tuple(f) for f in k)] for n, k in json.loads({json.dumps(picked)!r})]\n"
        "print('seconds', compile_sm90(entries, 2))\n"
    )
    assert "seconds" in check_in_fresh_process(script, sm90_triton)
