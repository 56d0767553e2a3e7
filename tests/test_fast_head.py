"""FastLiLiCorrSelect (serving select path) proposes what the proposal pipeline proposes on the PyTorch plan (the
head's own forward, PyTorch top-K and walk) under every plan its kernels serve, and its Triton epilogues
(kernels/head_*.py) equal their PyTorch definitions.

CPU: small configs; the Triton kernels run under Triton's interpreter (tests/conftest.py selects
it before anything imports triton). GPU (`-m gpu`): the paper config in bf16, eager and CUDA-graph
replay. Inputs come from the session's seed (tests/conftest.py, LILICORR_TEST_SEED).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from sglang_lilicorr.config import LiLiCorrConfig
from sglang_lilicorr.fast_path.select import FastLiLiCorrSelect
from sglang_lilicorr.head import LiLiCorrHead, confidence_features
from sglang_lilicorr.fast_path.counters import KernelCounters
from sglang_lilicorr.kernels import topk_lse_triton
from sglang_lilicorr.kernels.head_nodes import confidence_up_triton, lattice_nodes_triton
from sglang_lilicorr.kernels.head_norm import add_rmsnorm_triton, rmsnorm_triton, row_bias_silu_triton
from sglang_lilicorr.kernels.head_scores import lattice_cosine_triton
from sglang_lilicorr.kernels.tuning import CosineLaunch, TopKLaunch
from sglang_lilicorr.fast_path import pipeline
from sglang_lilicorr.fast_path.plan import PYTORCH, HeadGeometry, SelectPlan, SelectPlans, plans_for
from benchmarks.micro.head_bench import fused_stages, greedy_margin
from sglang_lilicorr.walk import greedy_walk, path_score, viterbi

from sm90_build import check_in_fresh_process
from triton_mode import CUDA, INTERPRETER, needs_interpreter

SMALL = LiLiCorrConfig(block_size=6, candidate_topk=4, factor_dim=16, hidden_size=32, num_heads=4, num_layers=2)
HM, VOCAB = 24, 64


def make_head(cfg, hm, seed, dtype=torch.float32, device="cpu"):
    torch.manual_seed(seed)
    head = LiLiCorrHead(cfg, model_hidden_size=hm)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # trained-looking scales: every parameter non-trivial
        for name, p in head.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            elif p.dim() >= 2 and "embedding" not in name:
                p.copy_(torch.randn(p.shape, generator=g) / p.shape[-1] ** 0.5)
            else:
                p.copy_(0.3 * torch.randn(p.shape, generator=g))
    return head.to(device=device, dtype=dtype).eval()


def make_inputs(b, s, hm, vocab, seed, dtype=torch.float32, device="cpu"):
    g = torch.Generator().manual_seed(seed + 1)
    hidden = torch.randn(b, s, hm, generator=g)
    anchor = torch.randn(b, hm, generator=g)
    lm_head = torch.randn(vocab, hm, generator=g) * 0.5
    embed = torch.randn(vocab, hm, generator=g)
    return [t.to(device=device, dtype=dtype) for t in (hidden, anchor, lm_head, embed)]


def select_with(head, plan: SelectPlan | None = None, **kwargs) -> FastLiLiCorrSelect:
    """The select of `head` with `plan` at every batch size (None: the plans of kernels/tuning.py for its device);
    `kwargs`: embed_weight= or token_table=."""
    return FastLiLiCorrSelect(head, plans=None if plan is None else SelectPlans.every(plan), **kwargs)


def logits_of(hidden, lm_head):
    """The LM head's logits [b*S, V] of slot states [b, S, Hm]."""
    return F.linear(hidden.reshape(-1, hidden.shape[-1]).to(lm_head.dtype), lm_head)


def select(fast: FastLiLiCorrSelect, hidden, anchor, lm_head) -> pipeline.Proposal:
    """What the draft graph runs: the LM head, then the select's proposal."""
    return fast.propose(logits_of(hidden, lm_head), hidden, anchor)


def pytorch_proposal(head, table, hidden, anchor, lm_head, walk: str = "greedy") -> pipeline.Proposal:
    """The proposal on the PyTorch plan: LiLiCorrHead.forward on the token table's rows, PyTorch top-K and walk."""
    plans = plans_for(HeadGeometry.of(head), PYTORCH, walk=walk)
    return select(FastLiLiCorrSelect(head, token_table=table, plans=plans), hidden, anchor, lm_head)


def handed_over(fast: FastLiLiCorrSelect, candidates) -> FastLiLiCorrSelect:
    """fast with `candidates` (vals, ids, lse) handed to it as its plans' merge, as tensor parallelism does."""
    plans = fast.plans.map(lambda plan, bound: dataclasses.replace(plan, merge=lambda logits: candidates))
    return FastLiLiCorrSelect(fast.head, token_table=fast.token_table, plans=plans)


def candidates_of(fast: FastLiLiCorrSelect, hidden, lm_head):
    """The select's candidates (vals [b, S, K], ids [b, S, K], lse [b, S]): the pipeline's top-K step on its plan."""
    b, s, k = *hidden.shape[:2], fast.topk
    vals, ids, lse = pipeline.candidates(logits_of(hidden, lm_head), k, fast.plan(b))
    return vals.view(b, s, k), ids.view(b, s, k), lse.view(b, s)


def request_error(start, pair, r_start, r_pair):
    """[b] largest score difference of each request."""
    err = (start - r_start.float()).abs().amax(dim=-1)
    return torch.maximum(err, (pair - r_pair.float()).abs().flatten(1).amax(dim=-1)) if pair.shape[1] else err


def assert_select_matches(fast, head, hidden, anchor, lm_head, atol, min_clear=1):
    """Candidates equal; scores within atol; the draft tokens are exactly the greedy walk of our
    scores, and equal the PyTorch plan's wherever its path has no near-tie (best-vs-second
    gap above twice that request's score error); at least `min_clear` requests must be clear."""
    tokens, ids, lp, start, pair = select(fast, hidden, anchor, lm_head)  # the select's own scores
    r_tokens, r_ids, r_lp, r_start, r_pair = pytorch_proposal(head, fast.token_table, hidden, anchor, lm_head)
    assert torch.equal(ids, r_ids)
    torch.testing.assert_close(lp, r_lp, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(start, r_start.float(), atol=atol, rtol=0)
    torch.testing.assert_close(pair, r_pair.float(), atol=atol, rtol=0)
    path = greedy_walk(start.cpu(), pair.cpu()).to(ids.device)  # the walk is exact on given scores
    assert torch.equal(tokens, ids.gather(2, path.unsqueeze(-1)).squeeze(-1))
    clear = greedy_margin(r_start, r_pair) > 2 * request_error(start, pair, r_start, r_pair) + 1e-6
    assert int(clear.sum()) >= min_clear, f"only {int(clear.sum())} of {clear.numel()} requests clear of near-ties"
    assert torch.equal(tokens[clear], r_tokens[clear])
    assert tokens.shape == r_tokens.shape and tokens.dtype == torch.int64


def assert_same_bits(first: FastLiLiCorrSelect, second: FastLiLiCorrSelect, *inputs) -> None:
    """Draft ids, candidate ids and log-probs equal bit for bit."""
    for got, want in zip(select(first, *inputs), select(second, *inputs)):
        assert torch.equal(got, want)


# --- the pipeline's steps ------------------------------------------------------------------------


@needs_interpreter
def test_both_top_k_steps_give_the_same_candidates_and_gradient(seed):
    """The Triton top-K (kernels=True) and its PyTorch definition choose the same candidates, ties to the lowest id,
    and under autograd both hand the logits' gradient to the candidates' log-probs (training's torch route)."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(6, 40, generator=g)
    logits[0, 5:9] = 3.0  # a tie across the K-th place
    grads = []
    for kernels in (True, False):
        x = logits.clone().requires_grad_(True)
        vals, ids, lse = pipeline.candidates(x, 4, SelectPlan(route="torch", kernels=kernels))
        (vals - lse[:, None]).mul(torch.arange(1.0, 5.0)).sum().backward()
        grads.append((ids, x.grad))
    assert torch.equal(grads[0][0], grads[1][0]) and grads[0][0][0].tolist() == [5, 6, 7, 8]
    torch.testing.assert_close(grads[0][1], grads[1][1])


# --- end to end --------------------------------------------------------------------------------

CPU_PLANS = {  # the fused routes the interpreter runs (no PDL, no side stream there)
    "unfolded": SelectPlan(route="unfolded"),  # Triton kernels around cuBLAS GEMMs
    "folded": SelectPlan(route="folded"),  # every GEMM a Triton GEMM with its epilogue, the lattice's norms in them
}


@pytest.mark.parametrize("plan", [pytest.param(name, marks=needs_interpreter) for name in CPU_PLANS] + ["pytorch"])
@pytest.mark.parametrize("slots", [SMALL.num_slots, 2])
def test_select_fp32_equals_the_pytorch_plan(seed, monkeypatch, plan, slots):
    if plan == "pytorch":  # the PyTorch path end to end (top-K and walk in PyTorch too)
        monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    head = make_head(SMALL, HM, seed)
    hidden, anchor, lm_head, embed = make_inputs(4, slots, HM, VOCAB, seed)
    plans = plans_for(HeadGeometry.of(head), PYTORCH) if plan == "pytorch" else SelectPlans.every(CPU_PLANS[plan])
    assert_select_matches(
        FastLiLiCorrSelect(head, embed_weight=embed, plans=plans), head, hidden, anchor, lm_head, atol=2e-4
    )


def test_kernel_counters_grow_outside_a_capture():
    """The counters are sized up front; a batch that needs more grows them to zeros (eager)."""
    counters = KernelCounters("cpu", size=1)
    assert counters.at_least(1).numel() == 1
    grown = counters.at_least(5)
    assert grown.shape == (5,) and grown.dtype == torch.int32 and not grown.any() and counters.at_least(3) is grown


@needs_interpreter
def test_select_bf16_within_tolerance(seed):
    head = make_head(SMALL, HM, seed, dtype=torch.bfloat16)
    hidden, anchor, lm_head, embed = make_inputs(12, SMALL.num_slots, HM, VOCAB, seed, dtype=torch.bfloat16)
    fast = FastLiLiCorrSelect(head, embed_weight=embed)
    assert fast.plan(12).fused and fast.plan(1).fused  # TRITON_INTERPRET=1 picks the Triton path on CPU
    assert_select_matches(fast, head, hidden, anchor, lm_head, atol=0.25)


@pytest.mark.parametrize("plan", [pytest.param(name, marks=needs_interpreter) for name in CPU_PLANS] + ["pytorch"])
def test_viterbi_select_commits_the_viterbi_path_of_the_heads_scores(seed, monkeypatch, plan):
    """walk="viterbi" (LILICORR_WALK=viterbi) commits walk.viterbi over the head's own start/pair with the ids gathered
    (the reference decoder's Viterbi, reference/propose.py), from the logits (the draft graph's route) and from
    candidates handed over (tensor parallel); candidates and log-probs are the greedy select's bits, and the two rules
    commit other drafts on these inputs. The PyTorch path drafts the PyTorch plan's Viterbi exactly; a Triton path's
    draft scores, under the PyTorch plan's scores, within its score error of its best path."""
    cfg = SMALL
    head = make_head(cfg, HM, seed)
    hidden, anchor, lm_head, embed = make_inputs(6, cfg.num_slots, HM, VOCAB, seed)
    if plan == "pytorch":  # top-K and the decoders in PyTorch
        monkeypatch.delenv("TRITON_INTERPRET", raising=False)
        plans = plans_for(HeadGeometry.of(head), PYTORCH)
    else:
        plans = SelectPlans.every(CPU_PLANS[plan])
    viterbi_plans = plans.map(lambda p, bound: dataclasses.replace(p, walk="viterbi"))
    fast = FastLiLiCorrSelect(head, embed_weight=embed, plans=viterbi_plans)
    tokens, ids, lp, candidates = assert_viterbi_select(fast, head, hidden, anchor, lm_head, exact=plan == "pytorch")
    assert torch.equal(select(handed_over(fast, candidates), hidden, anchor, lm_head).draft, tokens)
    g_tokens, g_ids, g_lp = select(FastLiLiCorrSelect(head, embed_weight=embed, plans=plans), hidden, anchor, lm_head)[
        :3
    ]
    assert torch.equal(g_ids, ids) and torch.equal(g_lp, lp) and not torch.equal(g_tokens, tokens)


def assert_viterbi_select(fast, head, hidden, anchor, lm_head, exact: bool):
    """A walk="viterbi" select drafts walk.viterbi over its own start/pair with the ids gathered; under the PyTorch
    plan's scores that path is that plan's best within the two scores' error (`exact`: its very tokens).
    -> the select's (tokens, ids, log-probs) and its candidates."""
    tokens, ids, lp, start, pair = select(fast, hidden, anchor, lm_head)  # the head's scores, as the select has them
    candidates = candidates_of(fast, hidden, lm_head)
    path = viterbi(start, pair)
    assert torch.equal(tokens, ids.gather(2, path.unsqueeze(-1)).squeeze(-1))
    r_tokens, _, _, r_start, r_pair = pytorch_proposal(head, fast.token_table, hidden, anchor, lm_head, "viterbi")
    if exact:
        assert torch.equal(tokens, r_tokens)
    slack = 2 * head.config.num_slots * request_error(start, pair, r_start, r_pair) + 1e-5
    assert bool(
        (path_score(r_start, r_pair, path) >= path_score(r_start, r_pair, viterbi(r_start, r_pair)) - slack).all()
    )
    return tokens, ids, lp, candidates


@needs_interpreter
@pytest.mark.parametrize("walk", ["greedy", "viterbi"])
@pytest.mark.parametrize("route", ["unfolded", "folded"])
def test_fused_stages_compose_to_the_scores(seed, route, walk):
    head = make_head(SMALL, HM, seed)
    hidden, anchor, lm_head, embed = make_inputs(3, SMALL.num_slots, HM, VOCAB, seed)
    fast = select_with(head, SelectPlan(route=route, walk=walk), embed_weight=embed)
    proposal = select(fast, hidden, anchor, lm_head)
    vals, ids, lse = candidates_of(fast, hidden, lm_head)
    assert torch.equal(ids, proposal.ids)
    stages = fused_stages(fast, vals, ids, lse, hidden, anchor)
    assert list(stages) == ["projections", "nodes", "lattice", "factors"]
    s_start, s_pair, draft = stages["factors"]()  # the greedy walk runs in the cosine kernel, Viterbi's after it
    assert torch.equal(s_start, proposal.start) and torch.equal(s_pair, proposal.pair)
    assert torch.equal(stages["nodes"]()[0], proposal.log_probs.flatten(0, 1))
    assert torch.equal(draft, pipeline.walk(s_start, s_pair, ids, fast.plan(3)))
    assert torch.equal(draft, proposal.draft)
    cat, sumsq = stages["lattice"]()  # folded: [x, x * t] and the sums of squares of x's rows
    assert cat.shape == (3 * SMALL.num_slots * SMALL.candidate_topk, 2 * head.width) and (sumsq is None) == (
        route == "unfolded"
    )
    pytorch = FastLiLiCorrSelect(head, embed_weight=embed, plans=plans_for(HeadGeometry.of(head), PYTORCH))
    with pytest.raises(ValueError, match=r"runs the torch route"):
        fused_stages(pytorch, vals, ids, lse, hidden, anchor)


def test_select_without_token_proj_and_one_layer(seed, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    cfg = dataclasses.replace(SMALL, hidden_size=0, num_layers=1, candidate_topk=2)
    head = make_head(cfg, 32, seed)
    assert head.token_proj is None
    hidden, anchor, lm_head, embed = make_inputs(4, cfg.num_slots, 32, VOCAB, seed)
    fast = FastLiLiCorrSelect(
        head, token_table=head.token_table(embed), plans=plans_for(HeadGeometry.of(head), PYTORCH)
    )
    assert_select_matches(fast, head, hidden, anchor, lm_head, atol=2e-4)


def test_bad_inputs_are_named(seed):
    head = make_head(SMALL, HM, seed)
    hidden, anchor, lm_head, embed = make_inputs(2, SMALL.num_slots, HM, VOCAB, seed)
    with pytest.raises(ValueError, match="exactly one"):
        FastLiLiCorrSelect(head)
    with pytest.raises(ValueError, match="token_table"):
        FastLiLiCorrSelect(head, token_table=torch.zeros(VOCAB, 7))
    with pytest.raises(ValueError, match="walk='beam' is not a decode rule; choose one of greedy, viterbi"):
        plans_for(HeadGeometry.of(head), PYTORCH, walk="beam")
    two_rules = SelectPlans((1,), (SelectPlan(route="torch", kernels=False), SelectPlan(route="torch", walk="viterbi")))
    with pytest.raises(ValueError, match=r"one walk rule at every batch size, got \['greedy', 'viterbi'\]"):
        FastLiLiCorrSelect(head, embed_weight=embed, plans=two_rules)
    fast = FastLiLiCorrSelect(head, embed_weight=embed, plans=plans_for(HeadGeometry.of(head), PYTORCH))
    logits = logits_of(hidden, lm_head)
    with pytest.raises(ValueError, match=r"hidden must be \[b, S, 24\]"):
        fast.propose(logits, hidden[..., :5], anchor)
    with pytest.raises(ValueError, match="slots"):
        fast.propose(logits, torch.zeros(2, SMALL.num_slots + 1, HM), anchor)
    with pytest.raises(ValueError, match="anchor_hidden"):
        fast.propose(logits, hidden, anchor[:1])
    with pytest.raises(ValueError, match=r"logits must be \[10, 64\] \(b\*S slots x vocabulary\), got \(10, 10\)"):
        fast.propose(logits[:, :10], hidden, anchor)
    if not INTERPRETER:
        with pytest.raises(ValueError, match=r"\['kernels'\] need a device with \['kernels'\]"):
            select_with(head, SelectPlan(), embed_weight=embed)
    if not CUDA:
        with pytest.raises(ValueError, match=r"\['overlap', 'pdl'\] need a device with"):
            select_with(head, SelectPlan(overlap=True, pdl=True), embed_weight=embed)


@needs_interpreter
def test_pdl_off_sm90_is_refused_by_each_kernel():
    """pdl=True compiles griddepcontrol (sm_90+ PTX): off such a device each wrapper says so."""
    x = torch.randn(4, 16)
    with pytest.raises(ValueError, match="add_rmsnorm_triton: pdl=True needs a CUDA device of compute capability 9.0"):
        add_rmsnorm_triton(x, x.clone(), torch.ones(16), 1e-6, pdl=True)
    with pytest.raises(ValueError, match="topk_lse_triton: pdl=True"):
        topk_lse_triton(x, 2, pdl=True)


@pytest.mark.sglang
def test_head_bench_smoke_runs_and_checks(tmp_path, monkeypatch):
    pytest.importorskip("sglang.srt.models.lilicorr", reason="sglang not installed")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # PyTorch top-K and walk
    from benchmarks.micro import head_bench

    out = tmp_path / "bench.json"
    head_bench.main(["--smoke", "--variants", "torch", "served", "--bs", "2", "--out", str(out)])
    import json

    res = json.loads(out.read_text())
    assert res["errors"] == {}
    assert res["plans"]["bs2"]["route"] == "torch"  # the served plan on this CPU (no interpreter): the PyTorch path
    assert res["checks"]["bs2_torch_candidate_ids_equal"] and res["checks"]["bs2_torch_draft_ids_equal_where_clear"]
    row = res["rows"][0]
    for key in (
        "topk_lse_ours",
        "topk_lse_builtin",
        "head_walk_torch",
        "head_walk_builtin",
        "post_logits_torch",
        "select_builtin",
    ):
        assert row[key] > 0
    assert head_bench.main(["--plot", str(out)]) == 0 and out.with_suffix(".png").stat().st_size > 10_000  # the figure


# --- kernels against their PyTorch definitions ---------------------------------------------------


@needs_interpreter
@pytest.mark.parametrize("splits, tiles", [(1, 3), (3, 3), (1, 21), (2, 21)])
@pytest.mark.parametrize("group, collect", [(64, 8), (32, 4)])  # the default launch; shorter sub-tiles, fewer collected
def test_topk_candidates_exact_when_the_best_share_a_subtile(seed, splits, tiles, group, collect):
    """The top-K kernel ranks sub-tiles by their maximum and re-reads the K best: adversarial rows
    (all K best in one sub-tile, ascending / descending runs, ties across sub-tiles and at chunk
    edges, -inf padding) must still give the exact stable top-K, with chunks shorter and longer
    than the tiles it ranks at once (the rest through its K-best buffer)."""
    from sglang_lilicorr.kernels import topk_lse_reference

    g = torch.Generator().manual_seed(seed)
    GROUP = group
    vocab, k = tiles * 4 * GROUP + 5, 8  # tiles of 4 sub-tiles, the last one partial
    assert (-(-(tiles + 1) // splits) > collect) == (tiles > collect)  # tiles per split
    rows = torch.randn(6, vocab, generator=g)
    rows[0, 2 * GROUP : 2 * GROUP + k] = 10.0 + torch.arange(k)  # every winner in one sub-tile
    rows[1] = torch.arange(vocab).float()  # ascending: each tile beats the buffer
    rows[2] = -torch.arange(vocab).float()  # descending: nothing after the first sub-tile enters
    rows[3, GROUP - 1 :: GROUP] = 7.0  # ties: one winner per sub-tile, lower index first
    rows[4, -k:] = 9.0  # winners in the last, partial sub-tile
    rows[5, : vocab // 2] = float("-inf")
    rows = rows.to(torch.bfloat16)
    vals, ids, lse = topk_lse_triton(
        rows, k, splits=splits, launch=TopKLaunch(block=4 * GROUP, group=group, collect_tiles=collect)
    )
    r_vals, r_ids, r_lse = topk_lse_reference(rows, k)
    assert torch.equal(ids, r_ids) and torch.equal(vals, r_vals)
    torch.testing.assert_close(lse, r_lse)


@needs_interpreter
def test_confidence_up_kernel_equals_folded_layernorm_mlp(seed):
    head = make_head(SMALL, HM, seed)
    g = torch.Generator().manual_seed(seed)
    vals = torch.randn(7, SMALL.candidate_topk, generator=g).sort(dim=-1, descending=True).values
    lse = vals.logsumexp(-1) + torch.rand(7, generator=g)
    fast = FastLiLiCorrSelect(head, embed_weight=torch.randn(VOCAB, HM))
    lp, up = confidence_up_triton(vals, lse, fast.w_feat, fast.b_feat, fast.feat_ln_eps, torch.float32)
    torch.testing.assert_close(lp, vals - lse[:, None])
    ref = F.silu(head.feature_mlp.up_proj(head.feature_norm(confidence_features(lp))))
    torch.testing.assert_close(up, ref.reshape(-1, ref.shape[-1]), atol=1e-5, rtol=1e-5)


@needs_interpreter
def test_node_and_norm_kernels_equal_torch(seed):
    g = torch.Generator().manual_seed(seed)
    b, s, k, h, v = 2, 3, 4, 48, 20  # h not a power of two: masked columns
    ids = torch.randint(0, v, (b, s, k), generator=g)
    table, pass_proj = torch.randn(v, h, generator=g), torch.randn(b, s, h, generator=g)
    feat, const = torch.randn(b * s * k, h, generator=g), torch.randn(s + 2, k, h, generator=g)
    w = torch.rand(h, generator=g) + 0.5
    x, xn = lattice_nodes_triton(ids, table, pass_proj, feat, const, w, 1e-6)
    ref = (table[ids] + pass_proj[:, :, None] + feat.view(b, s, k, h) + const[:s]).reshape(-1, h)
    torch.testing.assert_close(x, ref)
    torch.testing.assert_close(xn, F.rms_norm(ref, (h,), w, 1e-6))
    cat, sumsq = torch.zeros(b * s * k, 2 * h), torch.empty(b * s * k, 3)  # folded norms: x into [x, .], partials
    x2, parts = lattice_nodes_triton(ids, table, pass_proj, feat, const, w, 1e-6, out=cat[:, :h], sumsq_out=sumsq)
    assert x2.data_ptr() == cat.data_ptr() and parts is sumsq and not cat[:, h:].any()
    torch.testing.assert_close(cat[:, :h], ref)
    torch.testing.assert_close(sumsq, ref.pow(2).view(-1, 3, 16).sum(-1))
    with pytest.raises(ValueError, match=r"sumsq_out \(24, 2\) torch.float32 must be a contiguous fp32 \[24, 3\]"):
        lattice_nodes_triton(ids, table, pass_proj, feat, const, w, 1e-6, sumsq_out=torch.empty(24, 2))

    torch.testing.assert_close(rmsnorm_triton(x, w, 1e-6), F.rms_norm(x, (h,), w, 1e-6))
    y, t = torch.randn_like(x), torch.randn(b, h, generator=g)
    x0 = x.clone()
    out = add_rmsnorm_triton(x, y, w, 1e-6, cross=t)
    assert torch.equal(x, x0)  # the last residual sum is only normalised
    n = F.rms_norm(x0 + y, (h,), w, 1e-6)
    torch.testing.assert_close(out, torch.cat([n, n * t.repeat_interleave(s * k, 0)], -1))
    out = add_rmsnorm_triton(x, y, w, 1e-6)
    torch.testing.assert_close(x, x0 + y)
    torch.testing.assert_close(out, n)

    pre, bias = torch.randn(b * 5, h, generator=g), torch.randn(b, h + 3, generator=g)[:, 3:]
    ref = F.silu(pre + bias.repeat_interleave(5, 0))
    torch.testing.assert_close(row_bias_silu_triton(pre, bias, rows_per_group=5), ref)


@needs_interpreter
@pytest.mark.parametrize("k", [1, 4, 8])
@pytest.mark.parametrize("block_d", [128, 1024])
def test_cosine_kernel_equals_normalised_dot(seed, k, block_d):
    g = torch.Generator().manual_seed(seed)
    b, s, d = 3, 4, 140  # D in one step, or two 128-wide steps, the second partial
    edges = torch.randn(b, s, k, 2 * d, generator=g)
    edges[0, 1, 0, :d] = 0.0  # a zero vector: F.normalize's eps floor
    anchor = torch.randn(b, d + 5, generator=g)[:, :d]
    start, pair = lattice_cosine_triton(edges, anchor, 8.0, 1e-6, CosineLaunch(block_d=block_d))
    out_vec, in_vec = F.normalize(edges.view(b, s, k, 2, d), dim=-1, eps=1e-6).unbind(3)
    a = F.normalize(anchor, dim=-1, eps=1e-6)
    torch.testing.assert_close(start, 8.0 * torch.einsum("bd,bkd->bk", a, in_vec[:, 0]), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(pair, 8.0 * out_vec[:, :-1] @ in_vec[:, 1:].transpose(-1, -2), atol=1e-5, rtol=1e-5)


@needs_interpreter
@pytest.mark.parametrize("b, s, k", [(3, 15, 8), (2, 1, 4), (2, 5, 1), (4, 6, 3), (2, 4, 16)])
def test_cosine_walk_kernel_equals_cosine_then_greedy_walk(seed, b, s, k):
    """The walk in the cosine kernel's last program per request commits the candidates of
    walk.greedy_walk over the kernel's own scores (ties to the lowest index: duplicated in vectors
    tie exactly, a zero out vector ties a whole row) and leaves its counters zero."""
    from sglang_lilicorr.kernels.head_scores import lattice_cosine_walk_triton
    from sglang_lilicorr.walk import greedy_walk

    g = torch.Generator().manual_seed(seed)
    d = 40
    edges = torch.randn(b, s, k, 2 * d, generator=g)
    if k > 1:
        edges[:, :, 1, d:] = edges[:, :, 0, d:]  # candidates 0 and 1 score the same everywhere
        edges[0, 0, k - 1, :d] = 0.0  # a zero out vector: its row of scores is all equal
    anchor = torch.randn(b, d, generator=g)
    ids = torch.randint(0, 5000, (b, s, 2 * k), generator=g)[..., ::2]  # strided [b, S, K]
    counters = torch.zeros(b + 2, dtype=torch.int32)
    for _ in range(2):  # the counters are reusable
        start, pair, draft = lattice_cosine_walk_triton(edges, anchor, 8.0, 1e-6, ids, counters)
        want_start, want_pair = lattice_cosine_triton(edges, anchor, 8.0, 1e-6)
        assert torch.equal(start, want_start) and torch.equal(pair, want_pair)
        assert torch.equal(draft, ids.gather(2, greedy_walk(start, pair).unsqueeze(-1)).squeeze(-1))
        assert not counters.any()


@needs_interpreter
def test_cosine_walk_kernel_rejects_bad_ids_and_counters():
    from sglang_lilicorr.kernels.head_scores import lattice_cosine_walk_triton

    edges, anchor, ids = torch.randn(2, 3, 4, 16), torch.randn(2, 8), torch.zeros(2, 3, 4, dtype=torch.int64)
    with pytest.raises(ValueError, match=r"ids \(2, 4, 3\).*must be \[b, S, K\]"):
        lattice_cosine_walk_triton(edges, anchor, 8.0, 1e-6, ids.view(2, 4, 3), torch.zeros(2, dtype=torch.int32))
    with pytest.raises(ValueError, match="counters must be int32 zeros with >= 2 entries"):
        lattice_cosine_walk_triton(edges, anchor, 8.0, 1e-6, ids, torch.zeros(1, dtype=torch.int32))
    with pytest.raises(ValueError, match="counters must be int32"):
        lattice_cosine_walk_triton(edges, anchor, 8.0, 1e-6, ids, torch.zeros(4, dtype=torch.int64))
    with pytest.raises(ValueError, match="K=17 candidates.*K <= 16"):
        lattice_cosine_walk_triton(torch.randn(2, 3, 17, 16), anchor, 8.0, 1e-6, ids, torch.zeros(4, dtype=torch.int32))


_AOT = """
import sys
from sm90_build import build
from sglang_lilicorr.kernels import head_nodes, head_norm, head_scores, topk_lse_fused as tk, tuning, walk

bf, f32, i32, i64, c = "*bf16", "*fp32", "i32", "*i64", "constexpr"
L, CL = tuning.TopKLaunch(), tuning.CosineLaunch()
R, G = L.block // L.group, L.group
split = [bf, i32, i32, i32, i64, f32, f32, f32, i64, f32] + [c] * 8
confidence = [f32] * 5 + [bf, i32, i32, "fp32", "fp32"] + [c] * 3
# the cosine kernel's walk: successors, counters, ids + strides, draft
walk_args = [i64, "*i32", i64, i32, i32, i32, i64]
def cosine_args(t):  # edges, anchor (+ stride), start, pair, S, K, D, sigma, eps, the walk's
    return [t, t, i32, f32, f32, i32, i32, i32, "fp32", "fp32"] + walk_args + [c] * 7
P = dict(PDL=True)  # as served on sm_90 (kernels/pdl.py)
cases = [  # kernel, argument types, constexprs, warps, maxnreg, arguments divisible by 16 at the paper config
    (head_nodes._confidence_up_kernel, confidence, dict(KP=8, BLOCK_H=256, **P), 4, None, ()),
    (head_nodes._lattice_nodes_kernel, [i64, bf, bf, bf, f32, bf, bf, bf, f32] + [i32] * 5 + ["fp32", c, c, c, c],
     dict(ROWS=1, BLOCK_H=1024, SUMSQ=False, **P), 4, None, ()),
    (head_nodes._lattice_nodes_kernel, [i64, bf, bf, bf, f32, bf, bf, bf, f32] + [i32] * 5 + ["fp32", c, c, c, c],
     dict(ROWS=1, BLOCK_H=1024, SUMSQ=True, **P), 4, None, ()),
    (head_norm._add_rmsnorm_kernel, [bf] * 4 + [i32, bf, i32, i32, i32, "fp32", c, c, c, c, c],
     dict(ROWS=1, BLOCK_H=1024, CROSS=True, ADD=True, **P), 4, None, ()),
    (head_norm._add_rmsnorm_kernel, [bf] * 4 + [i32, bf, i32, i32, i32, "fp32", c, c, c, c, c],
     dict(ROWS=1, BLOCK_H=1024, CROSS=False, ADD=False, PDL=False), 4, None, ()),
    (head_norm._row_bias_silu_kernel, [bf, bf, i32, i32, i32, i32, c, c, c],
     dict(ROWS=1, BLOCK_N=1024, **P), 4, None, ()),
    (head_scores._lattice_cosine_kernel, cosine_args(bf),
     dict(KP=16, BLOCK_D=CL.block_d, F32_DOT=False, PRECISION="tf32", WALK=True, SP=16, **P),
     CL.num_warps, None, (0, 1, 2, 7)),
    (head_scores._lattice_cosine_kernel, cosine_args(f32),
     dict(KP=16, BLOCK_D=128, F32_DOT=True, PRECISION="ieee", WALK=False, SP=16, PDL=False), 4, None, (0, 1, 2, 7)),
    (head_scores._lattice_cosine_kernel, cosine_args(bf),  # LILICORR_WALK=viterbi
     dict(KP=16, BLOCK_D=CL.block_d, F32_DOT=False, PRECISION="tf32", WALK=False, SP=16, **P),
     CL.num_warps, None, (0, 1, 2, 7)),
    (walk._walk_kernel, [f32, f32, i64, i32, i32] + [i32] * 6 + [i64, i32, i32, i32, c, c, c, c, c],
     dict(KP=8, SP=16, GATHER=True, VITERBI=False, **P), 1, None, ()),
    (walk._walk_kernel, [f32, f32, i64, i32, i32] + [i32] * 6 + [i64, i32, i32, i32, c, c, c, c, c],
     dict(KP=8, SP=16, GATHER=True, VITERBI=True, **P), 1, None, ()),
    (tk._topk_lse_split_kernel, split, dict(K=8, KP=8, R=R, G=G, TP=L.collect_tiles, FINAL=False, NARROW=True, **P),
     L.num_warps, L.maxnreg, range(10)),
    (tk._topk_lse_split_kernel, split, dict(K=8, KP=8, R=R, G=G, TP=L.collect_tiles, FINAL=False, NARROW=False, **P),
     L.num_warps, L.maxnreg, range(10)),
    (tk._topk_lse_split_kernel, split,
     dict(K=8, KP=8, R=R, G=G, TP=L.collect_tiles, FINAL=True, NARROW=False, PDL=False),
     L.num_warps, L.maxnreg, range(10)),
    (tk._topk_lse_merge_kernel, [i64, f32, f32, i32, f32, i64, f32] + [c] * 5, dict(K=8, KP=8, SP=64, NARROW=True, **P),
     1, None, (0, 1, 2, 4, 5, 6)),
    (tk._topk_lse_merge_kernel, [i64, f32, f32, i32, f32, i64, f32] + [c] * 5,
     dict(K=8, KP=8, SP=128, NARROW=False, PDL=False), 4, None, (0, 1, 2, 4, 5, 6)),
]
for fn, types, consts, warps, maxnreg, aligned in cases:
    stages = ({"num_stages": 1 if consts["F32_DOT"] else CL.num_stages}
              if fn is head_scores._lattice_cosine_kernel else {})
    r = build(fn, types, consts, aligned=aligned, num_warps=warps, **stages,
              **({"maxnreg": maxnreg} if maxnreg else {}))
    print(fn.__name__, consts, "registers", r["registers"], "spill bytes", r["spills"])
    wide = any("ld.global" in line and ".v4" in line for line in r["ptx"].splitlines())
    if fn is tk._topk_lse_split_kernel and not wide:
        sys.exit("the top-K split kernel does not use 16-byte loads")
    if fn in (head_nodes._confidence_up_kernel, head_nodes._lattice_nodes_kernel) and consts["PDL"]:
        if "ld.global" not in r["ptx"][: r["ptx"].index("griddepcontrol.wait")]:
            sys.exit(f"{fn.__name__}: its constants (weights, node_const) are not loaded before the wait")
    if consts.get("F32_DOT") is False and "cp.async" not in r["ptx"]:
        sys.exit("the cosine kernel's D loop is not pipelined (no cp.async)")
    if r["spills"]:
        sys.exit(f"{fn.__name__} {consts} spills {r['spills']} bytes")
    if ("griddepcontrol.wait" in r["ptx"]) != consts["PDL"]:
        sys.exit(f"{fn.__name__} {consts}: griddepcontrol present = {not consts['PDL']}")
print("compiled", len(cases))
"""


def test_select_kernels_compile_for_sm90_without_spills(sm90_triton):
    """The interpreter does not compile; this lowers every select-path kernel to sm_90 (Triton's
    bundled ptxas), in a fresh process, at the paper config's constexprs and launch options: no
    register spills, and 16-byte loads in the top-K stream."""
    out = check_in_fresh_process(_AOT, sm90_triton)
    assert out.rstrip().endswith(f"compiled {out.count(' registers ')}"), out[-2000:]


# --- GPU: paper config, fp32 (exact walk) and bf16 (scores within tolerance), graph replay ------


def _replay_equals_eager(fast, *inputs):
    eager = select(fast, *inputs)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        select(fast, *inputs)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = select(fast, *inputs)
    graph.replay()
    torch.cuda.synchronize()
    for e, c in zip(eager, captured):
        assert torch.equal(e, c)


GPU_PLANS = {  # the fused routes on CUDA, each at every batch size (PDL needs sm_90)
    "unfolded": SelectPlan(),
    "unfolded_overlap": SelectPlan(overlap=True),
    "unfolded_overlap_pdl": SelectPlan(overlap=True, pdl=True),
    "folded": SelectPlan(route="folded"),
    "folded_overlap_pdl": SelectPlan(route="folded", overlap=True, pdl=True),
}


def _gpu_select(head, plan_name: str, walk: str = "greedy", **kwargs) -> FastLiLiCorrSelect:
    plan = dataclasses.replace(GPU_PLANS[plan_name], walk=walk)
    if plan.pdl and torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("PDL needs sm_90+")
    return select_with(head, plan, **kwargs)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
def test_gpu_paper_config_bs1_served_tables_fp32(monkeypatch):
    """bs 1 (120 lattice rows) with the served plans: on sm_90, the folded route under PDL (every GEMM in Triton, the
    lattice norms folded into them, the factor GEMM with its norm, h*t, bias + SiLU); fp32 (TF32 off): the draft
    tokens are the greedy walk of the kernel's own scores, which match the PyTorch plan's; graph replay == eager."""
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    cfg, hm, vocab = LiLiCorrConfig(), 4096, 32000
    head = make_head(cfg, hm, 0, device="cuda")
    hidden, anchor, lm_head, embed = make_inputs(1, cfg.num_slots, hm, vocab, 0, device="cuda")
    lm_head *= 0.1
    fast = FastLiLiCorrSelect(head, embed_weight=embed)
    plan = fast.plan(1)
    if plan.pdl:  # the tables this test is about
        assert plan.route == "folded"
    assert_select_matches(fast, head, hidden, anchor, lm_head, atol=2e-3, min_clear=0)
    _replay_equals_eager(fast, hidden, anchor, lm_head)


BIT_EQUAL_PLANS = {  # name -> two changes of the served plans that must give the same bits (bf16)
    "overlap": (lambda plan, bound: plan, lambda plan, bound: dataclasses.replace(plan, overlap=False)),
}


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("b", [1, 4])
@pytest.mark.parametrize("width", [1024, 256])
@pytest.mark.parametrize("changes", list(BIT_EQUAL_PLANS))
def test_gpu_plans_that_change_no_value(changes, b, width):
    """Two changes of the served plans (BIT_EQUAL_PLANS): the same draft tokens, candidates and log-probs bit for bit
    (bf16); the first against the PyTorch plan within tolerance, and its graph replay equal to eager."""
    cfg, hm, vocab = LiLiCorrConfig(hidden_size=width, factor_dim=width), 4096, 32000
    head = make_head(cfg, hm, 0, dtype=torch.bfloat16, device="cuda")
    hidden, anchor, lm_head, embed = make_inputs(b, cfg.num_slots, hm, vocab, 0, dtype=torch.bfloat16, device="cuda")
    lm_head *= 0.1
    with torch.no_grad():
        table = head.token_table(embed)
    served = FastLiLiCorrSelect(head, token_table=table).plans
    first, second = (
        FastLiLiCorrSelect(head, token_table=table, plans=served.map(change)) for change in BIT_EQUAL_PLANS[changes]
    )
    assert_same_bits(first, second, hidden, anchor, lm_head)
    assert_select_matches(first, head, hidden, anchor, lm_head, atol=0.25, min_clear=0)
    _replay_equals_eager(first, hidden, anchor, lm_head)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("plan", list(GPU_PLANS))
def test_gpu_paper_config_fp32_equals_the_pytorch_plan(plan, monkeypatch):
    """fp32 on CUDA (TF32 off): scores agree to ~1e-4, so nearly every request is clear of
    near-ties and the draft tokens must equal the PyTorch plan's."""
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    cfg, hm, vocab, b = LiLiCorrConfig(), 4096, 32000, 4  # 480 lattice rows
    head = make_head(cfg, hm, 0, device="cuda")
    hidden, anchor, lm_head, embed = make_inputs(b, cfg.num_slots, hm, vocab, 0, device="cuda")
    lm_head *= 0.1
    fast = _gpu_select(head, plan, embed_weight=embed)
    assert_select_matches(fast, head, hidden, anchor, lm_head, atol=2e-3, min_clear=b // 2)
    _replay_equals_eager(fast, hidden, anchor, lm_head)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("plan", list(GPU_PLANS))
def test_gpu_viterbi_select_drafts_the_pytorch_plans_viterbi(plan, monkeypatch):
    """LILICORR_WALK=viterbi on CUDA, fp32 (TF32 off), paper config, each fused route: the draft is the Viterbi path of
    the kernels' own scores, the PyTorch plan's Viterbi path within the scores' error; replay equals eager."""
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    cfg, hm, vocab, b = LiLiCorrConfig(), 4096, 32000, 4
    head = make_head(cfg, hm, 0, device="cuda")
    hidden, anchor, lm_head, embed = make_inputs(b, cfg.num_slots, hm, vocab, 0, device="cuda")
    lm_head *= 0.1
    fast = _gpu_select(head, plan, walk="viterbi", embed_weight=embed)
    assert_viterbi_select(fast, head, hidden, anchor, lm_head, exact=False)
    _replay_equals_eager(fast, hidden, anchor, lm_head)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("plan", list(GPU_PLANS))
@pytest.mark.parametrize("width", [1024, 256])  # the paper head; the testbed's (rows in one 256-wide tile)
def test_gpu_paper_config_bf16_graph_replay(plan, width):
    """bf16 at paper scale: random weights near-tie almost every request, so the tokens are only
    checked where clear (none required); scores within tolerance; replay equals eager exactly."""
    cfg, hm, vocab, b = LiLiCorrConfig(hidden_size=width, factor_dim=width), 4096, 32000, 4
    head = make_head(cfg, hm, 0, dtype=torch.bfloat16, device="cuda")
    hidden, anchor, lm_head, embed = make_inputs(b, cfg.num_slots, hm, vocab, 0, dtype=torch.bfloat16, device="cuda")
    lm_head *= 0.1
    fast = _gpu_select(head, plan, embed_weight=embed)
    assert_select_matches(fast, head, hidden, anchor, lm_head, atol=0.25, min_clear=0)
    _replay_equals_eager(fast, hidden, anchor, lm_head)
