"""The serving path on CPU: the LiLiCorr proposal (top-K/LSE -> head -> walk) and its anchors, and
strict loading of LiLiCorrDraftModel (SGLang's DFlashDraftModel + our head) from a tiny checkpoint.

`write_tiny_target` / `write_tiny_draft` build the tiny Llama target config and LiLiCorr draft
checkpoint that test_plugin.py uses too.
"""

from __future__ import annotations

import copy
import json
import sys
import types
from pathlib import Path

import pytest
import torch

from sglang_lilicorr.checkpoint import save_checkpoint
from sglang_lilicorr.train.heads import serving_tensors
from sglang_lilicorr.config import LiLiCorrConfig
from sglang_lilicorr.head import LiLiCorrHead
from sglang_lilicorr.walk import WALKS

pytest.importorskip("sglang")

HIDDEN, VOCAB, TARGET_LAYERS = 64, 256, 4
HEAD_KEYS = dict(candidate_topk=8, hidden_size=0, num_layers=1, num_heads=4, factor_dim=32)


def write_tiny_target(folder: Path, **overrides) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": HIDDEN,
        "intermediate_size": 128,
        "num_hidden_layers": TARGET_LAYERS,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": VOCAB,
        "max_position_embeddings": 512,
        "rms_norm_eps": 1e-5,
        "torch_dtype": "bfloat16",
        "tie_word_embeddings": False,
    }
    (folder / "config.json").write_text(json.dumps({**config, **overrides}))
    return folder


def drafter_tensors(seed: int = 0) -> dict[str, torch.Tensor]:
    """One Qwen3-style DFlash layer at width 64 (names as SGLang's DFlash loader reads them)."""
    g = torch.Generator().manual_seed(seed)
    shapes = {
        "self_attn.q_proj.weight": (64, 64),
        "self_attn.k_proj.weight": (32, 64),
        "self_attn.v_proj.weight": (32, 64),
        "self_attn.o_proj.weight": (64, 64),
        "mlp.gate_proj.weight": (128, 64),
        "mlp.up_proj.weight": (128, 64),
        "mlp.down_proj.weight": (64, 128),
    }
    t = {f"layers.0.{n}": (torch.randn(*s, generator=g) * 0.02).bfloat16() for n, s in shapes.items()}
    for n, width in (
        ("self_attn.q_norm", 16),
        ("self_attn.k_norm", 16),
        ("input_layernorm", 64),
        ("post_attention_layernorm", 64),
    ):
        t[f"layers.0.{n}.weight"] = torch.ones(width, dtype=torch.bfloat16)
    t["norm.weight"] = torch.ones(HIDDEN, dtype=torch.bfloat16)
    t["hidden_norm.weight"] = torch.ones(HIDDEN, dtype=torch.bfloat16)
    t["fc.weight"] = (torch.randn(HIDDEN, 2 * HIDDEN, generator=g) * 0.02).bfloat16()
    return t


def draft_config(block_size: int = 16, with_head: bool = True, **head_keys) -> dict:
    dflash = {"block_size": block_size, "target_layer_ids": [1, 2], "mask_token_id": 3}
    if with_head:
        keys = {**HEAD_KEYS, **head_keys}
        dflash.update({f"lilicorr_{k}": v for k, v in keys.items()})
        dflash.update({"lilicorr_mlp_ratio": 2.0, "lilicorr_vector_eps": 1e-6, "lilicorr_logit_scale": 8.0})
    return {
        "architectures": ["LiLiCorrDraftModel" if with_head else "DFlashDraftModel"],
        "model_type": "qwen3",
        "hidden_size": HIDDEN,
        "intermediate_size": 128,
        "num_hidden_layers": 1,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "vocab_size": VOCAB,
        "max_position_embeddings": 512,
        "rms_norm_eps": 1e-5,
        "torch_dtype": "bfloat16",
        "block_size": block_size,
        "num_target_layers": TARGET_LAYERS,
        "dflash_config": dflash,
    }


def tiny_head(block_size: int = 16, seed: int = 0) -> LiLiCorrHead:
    torch.manual_seed(seed)
    return LiLiCorrHead(LiLiCorrConfig(block_size=block_size, rms_norm_eps=1e-5, **HEAD_KEYS), HIDDEN)


def write_tiny_draft(folder: Path, *, config: dict | None = None, tensors: dict | None = None) -> Path:
    """A LiLiCorr draft checkpoint (random weights) in SGLang's LiLiCorrDraftModel format."""
    if tensors is None:
        tensors = {**drafter_tensors(), **serving_tensors(tiny_head().bfloat16())}
    save_checkpoint(folder, config or draft_config(), tensors)
    return folder


# --- the proposal ---------------------------------------------------------------------------


def make_proposer(block_size: int = 16, max_rows: int = 4, slots: int = 8, walk: str = "greedy"):
    from sglang_lilicorr.serving.proposer import LiLiCorrProposer

    g = torch.Generator().manual_seed(1)
    head = tiny_head(block_size).float()
    lm = torch.randn(VOCAB, HIDDEN, generator=g)
    embed = torch.randn(VOCAB + 6, HIDDEN, generator=g)  # padded rows past V, as SGLang pads
    proposer = LiLiCorrProposer(head=head, lm_head_weight=lm, embed_weight=embed, block_size=block_size, walk=walk)
    proposer.allocate(num_request_slots=slots, max_rows=max_rows)
    return proposer, head, lm, embed


def reference_block(head, lm, embed, pass_hidden, anchor, walk: str = "greedy"):
    """The proposal written out with plain torch ops: full log-softmax, topk, head, the rule's decoder (walk.py)."""
    k = head.config.candidate_topk
    log_probs, ids = torch.log_softmax(pass_hidden @ lm.T, dim=-1).topk(k, dim=-1)
    start, pair = head(head.project_tokens(embed[ids]), log_probs, pass_hidden, anchor)
    return ids.gather(2, WALKS[walk](start, pair).unsqueeze(2)).squeeze(2)


def test_proposal_matches_reference_and_follows_request_slots():
    proposer, head, lm, embed = make_proposer()
    b, s = 3, proposer.slots
    g = torch.Generator().manual_seed(2)
    hidden = torch.randn(b * proposer.block_size, HIDDEN, generator=g)
    anchors = torch.randn(b, HIDDEN, generator=g)
    slots = torch.tensor([5, 1, 7])
    proposer.publish_anchors(anchors, slots)
    proposer.stage_anchors(slots)
    proposer(hidden)  # the draft-graph protocol: writes out[: b*S]
    got = proposer.out[: b * s].view(b, s)
    pass_hidden = hidden.view(b, proposer.block_size, HIDDEN)[:, 1:]
    want = reference_block(head, lm, embed[:VOCAB], pass_hidden, anchors)
    assert torch.equal(got, want)
    assert bool(((got >= 0) & (got < VOCAB)).all())

    # The batch reorders (filter/merge): each request keeps its own anchor, so its row follows it.
    order = torch.tensor([2, 0, 1])
    proposer.stage_anchors(slots[order])
    again = proposer.propose(pass_hidden[order], proposer.anchors[:b])
    assert torch.equal(again, want[order])


def test_viterbi_proposal_in_the_draft_graph_route_and_the_eager_one():
    """walk="viterbi" (LILICORR_WALK=viterbi): the draft-graph protocol and the eager proposal (the graphs warm
    captures run the same select) commit the Viterbi path of the head's scores, not the greedy walk's."""
    proposer, head, lm, embed = make_proposer(max_rows=5, walk="viterbi")
    b, s = 4, proposer.slots
    g = torch.Generator().manual_seed(8)
    hidden = torch.randn(b * proposer.block_size, HIDDEN, generator=g)
    anchors = torch.randn(b, HIDDEN, generator=g)
    proposer.publish_anchors(anchors, torch.arange(b))
    proposer.stage_anchors(torch.arange(b))
    proposer(hidden)
    pass_hidden = hidden.view(b, proposer.block_size, HIDDEN)[:, 1:]
    want = reference_block(head, lm, embed[:VOCAB], pass_hidden, anchors, walk="viterbi")
    assert torch.equal(proposer.out[: b * s].view(b, s), want)
    assert not torch.equal(want, reference_block(head, lm, embed[:VOCAB], pass_hidden, anchors))  # the rules part here
    assert proposer.warm(graph_batch_sizes=[1, 2], capture=False) == [3, 4, 5]
    assert torch.equal(proposer.propose_eager(pass_hidden), want)


def test_start_up_line_says_which_rule_commits_the_block():
    for walk, rule in (
        ("greedy", "the greedy walk (each slot the best continuation of the slot before; the paper's rule)"),
        ("viterbi", "the Viterbi path (the exact maximiser of the block's start + pair scores)"),
    ):
        assert make_proposer(walk=walk)[0].startup_line() == (
            f"LILICORR: each drafted block is committed by {rule} (LILICORR_WALK={walk}; one of greedy, viterbi)."
        )


def test_anchor_changes_the_proposal_only_through_its_request():
    proposer, *_ = make_proposer()
    g = torch.Generator().manual_seed(3)
    pass_hidden = torch.randn(2, proposer.slots, HIDDEN, generator=g)
    base = proposer.propose(pass_hidden, torch.zeros(2, HIDDEN))
    moved = torch.zeros(2, HIDDEN)
    moved[1] = 10 * torch.randn(HIDDEN, generator=g)
    other = proposer.propose(pass_hidden, moved)
    assert torch.equal(other[0], base[0])


def test_last_rows_of_prefill_and_verify():
    from sglang_lilicorr.serving.proposer import last_rows

    assert last_rows(num_rows=9, extend_lens=torch.tensor([4, 1, 4], dtype=torch.int32), commit_lens=None).tolist() == [
        3,
        4,
        8,
    ]
    # verify: 3 requests x block 16, committing 1, 16 and 5 rows
    rows = last_rows(num_rows=48, extend_lens=None, commit_lens=torch.tensor([1, 16, 5], dtype=torch.int32))
    assert rows.tolist() == [0, 31, 36]
    with pytest.raises(ValueError, match="extend_lens"):
        last_rows(num_rows=3, extend_lens=None, commit_lens=None)


def test_proposer_rejects_wrong_block_and_unallocated_use():
    from sglang_lilicorr.serving.proposer import LiLiCorrProposer

    head = tiny_head(16)
    with pytest.raises(ValueError, match="trained for 16"):
        LiLiCorrProposer(
            head=head, lm_head_weight=torch.zeros(VOCAB, HIDDEN), embed_weight=torch.zeros(VOCAB, HIDDEN), block_size=8
        )
    proposer = LiLiCorrProposer(
        head=head, lm_head_weight=torch.zeros(VOCAB, HIDDEN), embed_weight=torch.zeros(VOCAB, HIDDEN), block_size=16
    )
    with pytest.raises(RuntimeError, match="allocate"):
        proposer.stage_anchors(torch.tensor([0]))
    proposer.allocate(num_request_slots=4, max_rows=2)
    with pytest.raises(RuntimeError, match="exceeds"):
        proposer.stage_anchors(torch.tensor([0, 1, 2]))


@pytest.mark.gpu
@pytest.mark.parametrize("walk", list(WALKS))
def test_proposal_on_cuda_matches_cpu_and_replays_in_a_cuda_graph(walk):
    proposer, head, lm, embed = make_proposer(max_rows=4, walk=walk)
    from sglang_lilicorr.serving.proposer import LiLiCorrProposer

    dev = torch.device("cuda")
    gpu = LiLiCorrProposer(
        head=copy.deepcopy(head).to(dev),
        lm_head_weight=lm.to(dev),
        embed_weight=embed.to(dev),
        block_size=16,
        walk=walk,
    )
    gpu.allocate(num_request_slots=8, max_rows=4)
    g = torch.Generator().manual_seed(4)
    hidden = torch.randn(4 * 16, HIDDEN, generator=g)
    anchors = torch.randn(4, HIDDEN, generator=g)
    slots = torch.tensor([0, 3, 2, 6])
    for p, h, a, sl in ((proposer, hidden, anchors, slots), (gpu, hidden.to(dev), anchors.to(dev), slots.to(dev))):
        p.publish_anchors(a, sl)
        p.stage_anchors(sl)
    static = hidden.to(dev).clone()
    gpu(static)  # warm-up (Triton compiles) outside capture
    eager = gpu.out.clone()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        gpu(static)
    gpu.out.zero_()
    graph.replay()
    assert torch.equal(gpu.out, eager)  # the captured proposal replays exactly
    proposer(hidden)
    # Same math, other kernels: fp32 rounding may flip a near-tie in top-K or the walk.
    agree = (eager.cpu() == proposer.out).float().mean().item()
    assert agree >= 0.9, agree


def test_warm_runs_every_batch_size_and_eager_batches_keep_their_proposal(monkeypatch):
    """warm: with no capture (the CPU), the proposal once at every batch size above the draft graphs, up to the buffers'
    rows (every size where there are no draft graphs); propose_eager then proposes exactly what propose does for the
    staged anchors."""
    proposer, head, lm, embed = make_proposer(max_rows=5)
    seen = []
    direct = proposer.propose
    monkeypatch.setattr(proposer, "propose", lambda h, a: seen.append(h.shape[0]) or direct(h, a))
    assert proposer.warm(graph_batch_sizes=[1, 2], capture=True) == [3, 4, 5] and seen == [3, 4, 5]
    assert proposer.eager_graphs == {} and proposer.eager_in.shape == (5, proposer.slots, HIDDEN)
    assert proposer.warm(graph_batch_sizes=[], capture=False) == [1, 2, 3, 4, 5]
    # no batch above --max-running-requests runs: none is warmed (the request pool holds one row more)
    seen.clear()
    assert proposer.warm(graph_batch_sizes=[1, 2], capture=True, max_batch=4) == [3, 4] and seen == [3, 4]
    assert proposer.warm(graph_batch_sizes=[1, 2], capture=False, max_batch=2) == []
    g = torch.Generator().manual_seed(6)
    pass_hidden = torch.randn(3, proposer.slots, HIDDEN, generator=g)
    anchors = torch.randn(3, HIDDEN, generator=g)
    proposer.publish_anchors(anchors, torch.tensor([0, 1, 2]))
    proposer.stage_anchors(torch.tensor([2, 0, 1]))
    want = reference_block(head, lm, embed[:VOCAB], pass_hidden, anchors[[2, 0, 1]])
    assert torch.equal(proposer.propose_eager(pass_hidden), want)


@pytest.mark.gpu
def test_eager_batches_replay_graphs_that_propose_as_the_direct_call():
    """Above the draft graphs' largest batch, warm captures graphs every EAGER_BUCKET requests and at the last row;
    each batch size replays the smallest that holds it, with the direct call's drafts."""
    from sglang_lilicorr.serving.proposer import EAGER_BUCKET, LiLiCorrProposer

    _, head, lm, embed = make_proposer()
    dev = torch.device("cuda")
    gpu = LiLiCorrProposer(
        head=copy.deepcopy(head).to(dev), lm_head_weight=lm.to(dev), embed_weight=embed.to(dev), block_size=16
    )
    rows = 3 * EAGER_BUCKET + 3
    gpu.allocate(num_request_slots=rows, max_rows=rows)
    gpu.warm(graph_batch_sizes=[1, 2, 4, EAGER_BUCKET], capture=True)
    assert sorted(gpu.eager_graphs) == [2 * EAGER_BUCKET, 3 * EAGER_BUCKET, rows]
    g = torch.Generator().manual_seed(7)
    gpu.publish_anchors(torch.randn(rows, HIDDEN, generator=g).to(dev), torch.arange(rows, device=dev))
    gpu.stage_anchors(torch.arange(rows, device=dev).flip(0))
    for b in (EAGER_BUCKET + 1, 2 * EAGER_BUCKET, 2 * EAGER_BUCKET + 5, rows):
        pass_hidden = torch.randn(b, gpu.slots, HIDDEN, generator=g).to(dev)
        want = gpu.propose(pass_hidden, gpu.anchors[:b]).clone()
        assert torch.equal(gpu.propose_eager(pass_hidden), want), b


# --- strict draft loading (builds SGLang's DFlashDraftModel on CPU) --------------------------


@pytest.fixture(scope="module")
def draft_model_env(tmp_path_factory):
    """Publish CPU server args (the DFlash layers read them) and stub vllm's rotary op import."""
    sys.modules.setdefault("vllm", types.ModuleType("vllm"))
    if "vllm._custom_ops" not in sys.modules:
        ops = types.ModuleType("vllm._custom_ops")
        ops.rotary_embedding = None  # imported by the rotary layer, never called on CPU
        sys.modules["vllm._custom_ops"] = ops
    from sglang.srt.runtime_context import publish
    from sglang.srt.server_args import ServerArgs

    target = write_tiny_target(tmp_path_factory.mktemp("target"))
    publish(ServerArgs(model_path=str(target), device="cpu"), role="scheduler")
    from transformers import AutoConfig

    def build(config: dict):
        folder = tmp_path_factory.mktemp("cfg")
        (folder / "config.json").write_text(json.dumps(config))
        from sglang_lilicorr.serving.models.lilicorr_draft import LiLiCorrDraftModel

        return LiLiCorrDraftModel(AutoConfig.from_pretrained(folder))

    return build


def test_draft_model_loads_every_tensor_strictly(draft_model_env):
    model = draft_model_env(draft_config())
    assert model.lilicorr is None  # SGLang's built-in head path stays off
    head = tiny_head().bfloat16()
    tensors = {**drafter_tensors(), **serving_tensors(head)}
    model.load_weights(iter(tensors.items()))
    for name, value in head.state_dict().items():
        assert torch.equal(model.lilicorr_head.state_dict()[name].bfloat16(), value), name
    assert torch.equal(model.fc.weight.bfloat16(), tensors["fc.weight"])


@pytest.mark.parametrize(
    "edit, match",
    [
        (lambda t: t.pop("layers.0.mlp.up_proj.weight"), "lacks 1 drafter tensor"),
        (lambda t: t.update({"layers.1.mlp.up_proj.weight": t["layers.0.mlp.up_proj.weight"]}), "no parameter for"),
        (lambda t: t.pop("lilicorr.out_head.weight"), "missing tensor 'out_head.weight'"),
        (lambda t: t.update({"lilicorr.extra.weight": torch.zeros(2)}), "unexpected tensor 'extra.weight'"),
        (lambda t: t.update({"lilicorr.in_head.weight": torch.zeros(3, 3)}), "has shape"),
        (lambda t: t["lilicorr.anchor_norm.weight"].fill_(float("nan")), "NaN"),
    ],
    ids=["missing-drafter", "extra-drafter", "missing-head", "extra-head", "head-shape", "head-nan"],
)
def test_draft_model_rejects_bad_checkpoints(draft_model_env, edit, match):
    from sglang_lilicorr.serving.server_args import ServingConfigError

    model = draft_model_env(draft_config())
    tensors = {**drafter_tensors(), **serving_tensors(tiny_head().bfloat16())}
    edit(tensors)
    with pytest.raises(ServingConfigError, match=match):
        model.load_weights(iter(tensors.items()))


def test_draft_model_refuses_another_block_size(draft_model_env):
    from sglang_lilicorr.serving.server_args import ServingConfigError

    model = draft_model_env(draft_config())
    with pytest.raises(ServingConfigError, match="--speculative-num-draft-tokens 16"):
        model.set_block_size(8)
    model.set_block_size(16)
    assert model.block_size == 16


# --- the worker's overrides that run without a GPU --------------------------------------------


def test_eager_proposal_protocol_of_the_worker():
    """DFlashWorkerV2 hands the drafted slots' hidden states [b*S, Hm] to
    _greedy_sample_from_vocab_parallel_head when no draft graph ran; LILICORR answers with the
    head's block for the batch's staged anchors."""
    from sglang_lilicorr.serving.worker import LiLiCorrWorker

    proposer, head, lm, embed = make_proposer()
    worker = object.__new__(LiLiCorrWorker)  # the overrides only read these attributes
    worker.proposer, worker._draft_sampler, worker._warned_eager = proposer, None, False
    g = torch.Generator().manual_seed(5)
    pass_hidden = torch.randn(2, proposer.slots, HIDDEN, generator=g)
    anchors = torch.randn(2, HIDDEN, generator=g)
    proposer.publish_anchors(anchors, torch.tensor([3, 4]))
    proposer.stage_anchors(torch.tensor([4, 3]))
    flat = worker._greedy_sample_from_vocab_parallel_head(hidden_states=pass_hidden.reshape(-1, HIDDEN), lm_head=None)
    want = reference_block(head, lm, embed[:VOCAB], pass_hidden, anchors[[1, 0]])
    assert torch.equal(flat.view(2, -1), want)


def test_append_publishes_each_requests_anchor_from_the_appends_own_projection(monkeypatch):
    """The draft KV append projects every target row once (fc + hidden_norm); LILICORR's anchor of
    each request is that projection's row at its last verified token: after prefill (extend_lens)
    and after verify (commit_lens of blocks padded to B rows)."""
    from sglang.srt.models.dflash import DFlashDraftModel
    from sglang.srt.speculative.dflash_worker_v2 import DFlashWorkerV2
    from sglang_lilicorr.serving.models.lilicorr_draft import LiLiCorrDraftModel
    from sglang_lilicorr.serving.proposer import last_rows
    from sglang_lilicorr.serving.worker import LiLiCorrWorker

    monkeypatch.setattr(DFlashDraftModel, "project_target_hidden", lambda self, x: 2 * x)  # stands in for fc + norm
    appended = []

    def append(self, *, target_hidden, cache_loc, **_):
        appended.append(self.draft_model.project_target_hidden(target_hidden[: cache_loc.numel()]))

    monkeypatch.setattr(DFlashWorkerV2, "_append_target_hidden_to_draft_kv_by_loc", append)
    proposer, *_ = make_proposer()
    draft = object.__new__(LiLiCorrDraftModel)  # only the projection bookkeeping is exercised
    object.__setattr__(draft, "_context_hidden", None)
    worker = object.__new__(LiLiCorrWorker)
    worker.proposer, worker.draft_model, worker.append_graphs = proposer, draft, None
    g = torch.Generator().manual_seed(9)

    worker._batch_slots = torch.tensor([5, 2])
    hidden = torch.randn(10 + 3, HIDDEN, generator=g)  # two prompts of 4 and 6 tokens + 3 padding rows
    worker._append_target_hidden_to_draft_kv_by_loc(
        target_hidden=hidden, cache_loc=torch.arange(10), positions=torch.arange(10), extend_lens=torch.tensor([4, 6])
    )
    assert torch.equal(proposer.anchor_table[[5, 2]], 2 * hidden[[3, 9]])

    worker._batch_slots = torch.tensor([2, 5])
    hidden = torch.randn(2 * 16, HIDDEN, generator=g)  # two verify blocks; 3 and 1 rows committed
    worker._append_target_hidden_to_draft_kv_by_loc(
        target_hidden=hidden, cache_loc=torch.arange(32), positions=torch.arange(32), commit_lens=torch.tensor([3, 1])
    )
    assert torch.equal(proposer.anchor_table[[2, 5]], 2 * hidden[[2, 16]])
    assert len(appended) == 2 and draft.take_context_hidden() is None  # each projection is taken once
    # the static verify row base equals the general rule
    commit = torch.tensor([16, 1, 7], dtype=torch.int32)
    assert torch.equal(
        proposer.anchor_rows(num_rows=48, extend_lens=None, commit_lens=commit),
        last_rows(num_rows=48, extend_lens=None, commit_lens=commit),
    )


@pytest.mark.parametrize("walk", list(WALKS))
def test_the_worker_builds_its_proposer_with_lilicorr_walk_and_says_so(walk, monkeypatch, caplog):
    """LiLiCorrWorker.__init__ (SGLang's DFlash worker stood in for by the attributes it sets) proposes with the rule
    LILICORR_WALK names and logs the proposer's start-up line."""
    from sglang.srt.speculative.dflash_worker_v2 import DFlashWorkerV2

    from sglang_lilicorr.serving import worker as worker_module

    head = tiny_head()
    target = types.SimpleNamespace(
        lm_head=types.SimpleNamespace(weight=torch.zeros(VOCAB, HIDDEN)),
        get_input_embeddings=lambda: types.SimpleNamespace(weight=torch.zeros(VOCAB, HIDDEN)),
    )

    def dflash_init(self, *args):
        self.draft_model = types.SimpleNamespace(lilicorr_head=head)
        self.model_runner = types.SimpleNamespace(model=target, model_config=types.SimpleNamespace(vocab_size=VOCAB))
        self.block_size = 16

    monkeypatch.setattr(DFlashWorkerV2, "__init__", dflash_init)
    monkeypatch.setattr(worker_module, "LiLiCorrDraftModel", types.SimpleNamespace)
    monkeypatch.setattr(worker_module, "get_parallel", lambda: types.SimpleNamespace(tp_group=None))
    monkeypatch.setattr(worker_module, "install_request_refusal", lambda verification: None)
    monkeypatch.setenv("LILICORR_WALK", walk)
    with caplog.at_level("INFO", logger=worker_module.__name__):
        worker = worker_module.LiLiCorrWorker(None, 0, 0, None)
    assert worker.proposer.select.walk_rule == walk
    assert worker.proposer.startup_line() in caplog.messages


def test_target_lm_head_must_be_dense_and_unpadded():
    from sglang_lilicorr.serving.server_args import ServingConfigError
    from sglang_lilicorr.serving.worker import lm_head_rows

    head = types.SimpleNamespace(weight=torch.zeros(VOCAB + 64, HIDDEN, dtype=torch.bfloat16))
    rows, shard = lm_head_rows(head, VOCAB, tp_group=None)
    assert rows.shape == (VOCAB, HIDDEN) and shard is None  # padding rows dropped
    with pytest.raises(ServingConfigError, match="quantized"):
        lm_head_rows(types.SimpleNamespace(weight=torch.zeros(VOCAB, HIDDEN, dtype=torch.int8)), VOCAB, None)
    added = types.SimpleNamespace(weight=head.weight, shard_indices=types.SimpleNamespace(num_added_elements=4))
    with pytest.raises(ServingConfigError, match="added vocabulary"):
        lm_head_rows(added, VOCAB, None)
    with pytest.raises(ServingConfigError, match="64 rows for a 256-token vocabulary"):
        lm_head_rows(types.SimpleNamespace(weight=head.weight[:64]), VOCAB, None)


def shard_indices(start: int, size: int, padded: int):
    """SGLang's VocabParallelEmbeddingShardIndices fields the worker reads (no added vocabulary)."""
    return types.SimpleNamespace(
        org_vocab_start_index=start, num_org_elements=size, num_org_elements_padded=padded, num_added_elements=0
    )


def test_vocabulary_parallel_lm_head_and_embedding_on_a_tp_rank():
    """Rank 2 of 4 over a 200-token vocabulary padded to 256 (64 per rank): its LM head rows 128..191 with their
    shard; the input embedding gathered over the TP group to every row of the vocabulary."""
    from sglang_lilicorr.serving.server_args import ServingConfigError
    from sglang_lilicorr.serving.worker import full_embedding, lm_head_rows

    vocab, gathered = 200, []
    full = torch.randn(256, HIDDEN).bfloat16()
    group = types.SimpleNamespace(
        world_size=4, all_gather_into_tensor=lambda out, inp: None, all_gather=lambda w, dim: gathered.append(w) or full
    )
    lm = types.SimpleNamespace(weight=full[128:192], shard_indices=shard_indices(128, 64, 64))
    rows, shard = lm_head_rows(lm, vocab, group)
    assert rows.shape == (64, HIDDEN) and (shard.start, shard.size, shard.vocab_size, shard.ranks) == (128, 64, 200, 4)
    assert shard.gather is group.all_gather_into_tensor
    last = types.SimpleNamespace(weight=full[192:], shard_indices=shard_indices(192, 8, 64))
    assert lm_head_rows(last, vocab, group)[0].shape == (8, HIDDEN)  # rank 3: the 8 real rows, padding dropped
    embed = types.SimpleNamespace(weight=full[128:192], shard_indices=shard_indices(128, 64, 64), tp_group=group)
    assert full_embedding(embed, vocab) is full and gathered[0] is embed.weight
    whole = types.SimpleNamespace(weight=full[:vocab])  # a replicated embedding is taken as is
    assert full_embedding(whole, vocab) is whole.weight
    with pytest.raises(ServingConfigError, match="no input embedding"):
        full_embedding(types.SimpleNamespace(), vocab)
    quantized = types.SimpleNamespace(
        weight=full[128:192].to(torch.int8), shard_indices=shard_indices(128, 64, 64), tp_group=group
    )
    with pytest.raises(ServingConfigError, match="--tp-size 1"):
        full_embedding(quantized, vocab)


def test_static_buffers_take_writes_in_and_out_of_inference_mode():
    """SGLang may allocate pools under torch.inference_mode and run the scheduler loop under
    no_grad: the proposer's static buffers must accept in-place writes in both."""
    proposer, *_ = make_proposer()
    with torch.inference_mode():
        proposer.allocate(num_request_slots=8, max_rows=4)
        rows = torch.randn(2, HIDDEN)
    with torch.no_grad():
        proposer.publish_anchors(rows, torch.tensor([1, 2]))
        proposer.stage_anchors(torch.tensor([2, 1]))
        proposer(torch.randn(2 * proposer.block_size, HIDDEN))
    assert torch.equal(proposer.anchors[:2], rows[[1, 0]])


@pytest.mark.parametrize(
    "key, value", [("num_attention_heads", None), ("intermediate_size", None), ("num_attention_heads", 0)]
)
def test_a_draft_without_the_shapes_sglang_builds_it_with_is_refused_by_name(tmp_path, key, value):
    from sglang_lilicorr.serving.draft_check import examine_draft

    config = draft_config()
    if value is None:
        del config[key]
    else:
        config[key] = value
    (problem,) = examine_draft(write_tiny_draft(tmp_path / "d", config=config)).problems
    assert f"has no positive integer {key} (got {value!r})" in str(problem) and "config.json" in str(problem)


def test_layer_ids_and_mask_token_are_read_where_sglang_reads_them(tmp_path):
    """dflash_config first, else the config's top level; a mask token named by text, SGLang looks its id up."""
    from sglang_lilicorr.serving.draft_check import TargetShape, examine_draft

    target = TargetShape(hidden_size=HIDDEN, vocab_size=VOCAB, num_layers=TARGET_LAYERS)
    config = draft_config()
    config["target_layer_ids"] = config["dflash_config"].pop("target_layer_ids")
    config["mask_token_id"] = config["dflash_config"].pop("mask_token_id")
    assert not examine_draft(write_tiny_draft(tmp_path / "top", config=config), target).problems
    del config["mask_token_id"]
    config["dflash_config"]["mask_token"] = "<|mask|>"
    assert not examine_draft(write_tiny_draft(tmp_path / "named", config=config), target).problems
    config["dflash_config"]["mask_token"] = ""
    (problem,) = examine_draft(write_tiny_draft(tmp_path / "none", config=config), target).problems
    assert "mask_token_id=None is not a token id" in str(problem)
