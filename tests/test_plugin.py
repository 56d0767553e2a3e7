"""The SGLang plugin on CPU, against the real sglang 0.5.23 package: entry point, idempotent
registration, the DFlash-family answers of LiLiCorrSpecAlgo, argument parsing, and ServerArgs
resolution up to where SGLang needs a GPU, with every bad input that is reachable without one.

Resolution runs with --device cuda on this CPU machine: SGLang resolves arguments without
touching a GPU, and DFlash-family resolution (ours and SGLang's DFLASH) refuses --device cpu.
"""

from __future__ import annotations

import inspect
from importlib.metadata import entry_points

import pytest
import torch

from test_serving import draft_config, drafter_tensors, write_tiny_draft, write_tiny_target

pytest.importorskip("sglang")

from sglang.srt.arg_groups.overrides import resolving_view  # noqa: E402
from sglang.srt.server_args import prepare_server_args  # noqa: E402
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm  # noqa: E402

from sglang_lilicorr.train.heads import serving_tensors  # noqa: E402
from sglang_lilicorr.serving import ALGORITHM_NAME  # noqa: E402
from sglang_lilicorr.serving.algorithm import LiLiCorrSpecAlgo  # noqa: E402
from sglang_lilicorr.serving.plugin import register  # noqa: E402
from sglang_lilicorr.serving.server_args import ServingConfigError  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def registered():
    register()


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return write_tiny_target(tmp_path_factory.mktemp("target"))


@pytest.fixture(scope="module")
def draft(tmp_path_factory):
    return write_tiny_draft(tmp_path_factory.mktemp("draft") / "d")


def server_args(target, *extra, draft=None, algo="lilicorr", device="cuda"):
    argv = ["--model-path", str(target), "--speculative-algorithm", algo, "--device", device]
    if draft is not None:
        argv += ["--speculative-draft-model-path", str(draft)]
    return prepare_server_args(argv + [str(x) for x in extra])


def resolve(*args, **kwargs):
    sa = server_args(*args, **kwargs)
    sa.resolve_once()
    return resolving_view(sa)


# --- registration ---------------------------------------------------------------------------


def test_entry_point_is_discovered():
    eps = [ep for ep in entry_points(group="sglang.srt.plugins") if ep.name == "lilicorr"]
    assert len(eps) == 1, "install the package (pip install -e .) so its entry point is visible"
    assert eps[0].value == "sglang_lilicorr.serving.plugin:register"
    assert eps[0].load() is register


def test_sglang_plugin_loader_registers_lilicorr_idempotently():
    from sglang.srt.plugins import load_plugins

    load_plugins()  # what every SGLang process runs first
    register()
    register()  # again, as every process does: no "already registered" error
    algo = SpeculativeAlgorithm.from_string("lilicorr")
    assert isinstance(algo, LiLiCorrSpecAlgo) and algo.name == ALGORITHM_NAME
    assert SpeculativeAlgorithm.from_string("LILICORR") is algo
    from sglang.srt.arg_groups.resolution_hooks import _HOOKS

    from sglang_lilicorr.serving.plugin import TARGET_ATTENTION_STEP, default_target_attention

    assert _HOOKS[TARGET_ATTENTION_STEP].count(default_target_attention) == 1  # the target backend's default, once


def predicates():
    """Every no-argument is_*/supports_*/has_*/need_*/carries_* method of SGLang's enum."""
    for name, fn in vars(SpeculativeAlgorithm).items():
        if name.startswith(("is_", "supports_", "has_", "need_", "carries_")) and callable(fn):
            if len(inspect.signature(fn).parameters) == 1:
                yield name


def test_lilicorr_answers_like_dflash():
    algo = SpeculativeAlgorithm.from_string("lilicorr")
    public = {n for n, v in vars(SpeculativeAlgorithm).items() if callable(v) and not n.startswith("_")}
    assert not sorted(n for n in public if not hasattr(algo, n)), "the scheduler calls these on any algorithm"
    differs = {n for n in predicates() if getattr(algo, n)() != getattr(SpeculativeAlgorithm.DFLASH, n)()}
    assert differs == {"supports_mixed_chunk"}  # declined on purpose (see algorithm.py)
    assert algo.is_dflash_family() and algo.supports_target_verify_for_draft()


def test_future_map_is_built_for_lilicorr():
    algo = SpeculativeAlgorithm.from_string("lilicorr")

    class Pool:
        size, req_to_token = 4, torch.zeros(5, 8, dtype=torch.int32)

    fm = algo.create_future_map(torch.device("cpu"), Pool(), needs_cpu_seq_lens=False)
    assert fm.spec_algo is algo


# --- argument parsing and resolution --------------------------------------------------------


def test_argument_parsing_accepts_lilicorr(target, draft):
    sa = server_args(target, draft=draft, algo="LILICORR")
    assert sa.speculative_algorithm == "LILICORR"


def test_resolution_applies_dflash_defaults(target, draft):
    cfg = resolve(target, draft=draft)
    assert cfg.speculative_algorithm == ALGORITHM_NAME
    assert cfg.speculative_num_draft_tokens == 16  # the head's block size, from the draft
    assert (cfg.speculative_num_steps, cfg.speculative_eagle_topk) == (1, 1)
    assert cfg.max_running_requests == 48
    assert cfg.speculative_draft_attention_backend == "triton"


def test_resolution_keeps_explicit_matching_values(target, draft):
    cfg = resolve(target, "--speculative-num-draft-tokens", 16, "--max-running-requests", 5, draft=draft)
    assert (cfg.speculative_num_draft_tokens, cfg.max_running_requests) == (16, 5)


# --- the target's attention backend -------------------------------------------------------------------------


HOPPER = {"is_hopper_with_cuda_12_3": True, "is_sm90": True}  # an H100/H200 as SGLang's default backend sees it


@pytest.fixture
def default_lines():
    """The target-backend default lines server_args logs (caplog cannot see them: SGLang's resolution reconfigures
    the root logger)."""
    import logging

    from sglang_lilicorr.serving import server_args as resolution

    said = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: said.append(record.getMessage())
    resolution.logger.addHandler(handler)
    yield lambda: [m for m in said if "--attention-backend defaults" in m]
    resolution.logger.removeHandler(handler)


@pytest.mark.parametrize("extra", [[], ["--enable-deterministic-inference"]], ids=["default", "deterministic"])
def test_the_target_runs_triton_where_sglang_would_pick_fa3(extra, target, draft, default_lines):
    """SGLang's own default on Hopper (fa3, which LILICORR was never served on) is what a DFLASH server gets; a LILICORR
    server gets triton, set before SGLang's default and said in one warning line."""
    from sglang.srt.runtime_context import override_platform

    with override_platform(**HOPPER):
        dflash = resolve(target, *extra, draft=draft, algo="DFLASH")
        assert default_lines() == []
        lilicorr = resolve(target, *extra, draft=draft)
    assert dflash.attention_backend == "fa3"
    assert (lilicorr.attention_backend, lilicorr.prefill_attention_backend, lilicorr.decode_attention_backend) == (
        "triton",
        None,
        None,
    )
    assert default_lines() == [
        "LILICORR: --attention-backend defaults to triton (the target's prefill and decode attention), the backend "
        "LILICORR is served and proven on, where SGLang's own default can be one it was never served on (fa3 on "
        "Hopper); pass --attention-backend flashinfer for the other one accepted."
    ]


@pytest.mark.parametrize(
    "extra, want",
    [
        (["--attention-backend", "flashinfer"], ("flashinfer", "flashinfer")),
        (["--attention-backend", "triton"], ("triton", "triton")),
        (["--decode-attention-backend", "triton"], ("triton", "triton")),  # prefill: the default
        (
            ["--prefill-attention-backend", "flashinfer", "--decode-attention-backend", "flashinfer"],
            ("flashinfer",) * 2,
        ),
    ],
    ids=["flashinfer", "triton", "decode-triton", "split-flashinfer"],
)
def test_an_accepted_target_backend_is_served(extra, want, target, draft, default_lines):
    from sglang.srt.arg_groups.overrides import attention_backends_of
    from sglang.srt.runtime_context import override_platform

    with override_platform(**HOPPER):
        cfg = resolve(target, *extra, draft=draft)
    assert attention_backends_of(cfg) == want
    said = default_lines()
    assert len(said) == (extra[0] == "--decode-attention-backend")  # the default serves the phase left unset
    assert all("to triton (the target's prefill attention)" in line for line in said)


@pytest.mark.parametrize(
    "extra, match",
    [
        (
            ["--attention-backend", "fa3"],
            "--attention-backend fa3 is not supported .* never been served and checked on fa3",
        ),
        (["--attention-backend", "fa4"], "--attention-backend fa4 is not supported"),
        (["--attention-backend", "torch_native"], "--attention-backend torch_native is not supported"),
        (["--attention-backend", "aiter"], "--attention-backend aiter is not supported"),
        (["--prefill-attention-backend", "fa3"], "--prefill-attention-backend fa3 is not supported .* drop the split"),
        (
            ["--prefill-attention-backend", "flashinfer"],
            "prefill attention would run flashinfer and its decode .* triton",
        ),
    ],
    ids=["fa3", "fa4", "torch_native", "aiter", "prefill-fa3", "split-pair"],
)
def test_a_target_backend_never_served_is_refused_before_serving(extra, match, target, draft):
    from sglang.srt.runtime_context import override_platform

    with override_platform(**HOPPER), pytest.raises(ServingConfigError, match=match) as refused:
        resolve(target, *extra, draft=draft)
    assert "pass --attention-backend triton or flashinfer" in str(refused.value) or "alone." in str(refused.value)


def test_an_explicit_verify_attention_needs_the_triton_target(target, draft, monkeypatch):
    from sglang_lilicorr.serving import verify_attention as va

    monkeypatch.setenv(va.ENV, va.SPLIT_KV)
    resolve(target, "--attention-backend", "triton", draft=draft)
    resolve(target, draft=draft)  # the default: triton
    with pytest.raises(ServingConfigError, match="the target runs flashinfer, which verifies with its own kernel"):
        resolve(target, "--attention-backend", "flashinfer", draft=draft)
    monkeypatch.delenv(va.ENV)
    resolve(target, "--attention-backend", "flashinfer", draft=draft)


def test_worker_factory_returns_our_worker_and_draft_class(target, draft, monkeypatch):
    from sglang.srt.mem_cache import kv_cache_configurator
    from sglang.srt.models.registry import ModelRegistry

    from sglang_lilicorr.serving.models.lilicorr_draft import LiLiCorrDraftModel
    from sglang_lilicorr.serving.worker import LiLiCorrWorker

    # the factory widens the req_to_token rows for the process (kv_rows.py); undone after the test
    monkeypatch.setattr(
        kv_cache_configurator,
        "get_req_to_token_extra_context_len",
        kv_cache_configurator.get_req_to_token_extra_context_len,
    )
    sa = server_args(target, draft=draft)
    sa.resolve_once()
    assert SpeculativeAlgorithm.from_string("lilicorr").create_worker(sa) is LiLiCorrWorker
    assert ModelRegistry.resolve_model_cls(["LiLiCorrDraftModel"])[0] is LiLiCorrDraftModel
    assert kv_cache_configurator.get_req_to_token_extra_context_len.lilicorr_widened


def test_cpu_device_is_refused_like_dflash(target, draft):
    with pytest.raises(ServingConfigError, match="CUDA GPUs only"):
        resolve(target, draft=draft, device="cpu")
    with pytest.raises(ValueError, match="DFLASH speculative decoding is not supported"):
        resolve(target, draft=draft, algo="DFLASH", device="cpu")  # SGLang's own refusal


# --- bad inputs -------------------------------------------------------------------------------


def test_lilicorr_walk_is_checked_before_the_server_starts(target, draft, monkeypatch):
    """LILICORR_WALK: greedy by default, viterbi served, anything else refused by name before any process starts."""
    from sglang_lilicorr.serving.proposer import walk_rule

    monkeypatch.delenv("LILICORR_WALK", raising=False)
    assert walk_rule() == "greedy"
    monkeypatch.setenv("LILICORR_WALK", "viterbi")
    resolve(target, draft=draft)
    assert walk_rule() == "viterbi"
    monkeypatch.setenv("LILICORR_WALK", "beam")
    with pytest.raises(
        ServingConfigError, match=r"^LILICORR_WALK='beam' is not a decode rule: set it to one of greedy, viterbi\.$"
    ):
        resolve(target, draft=draft)


def test_lilicorr_verify_width_is_checked_before_the_server_starts(target, draft, monkeypatch):
    """LILICORR_VERIFY_WIDTH: adaptive by default; one width of the draft's block or a list of them served; anything
    else refused by name, with what it may be, before any process starts."""
    for ok in ("adaptive", "16", "1,4,16"):
        monkeypatch.setenv("LILICORR_VERIFY_WIDTH", ok)
        resolve(target, draft=draft)
    monkeypatch.setenv("LILICORR_VERIFY_WIDTH", "32")
    with pytest.raises(ServingConfigError, match=r"^LILICORR_VERIFY_WIDTH='32' is not a verify width: set it to"):
        resolve(target, draft=draft)


def edited_draft(folder, *, config=None, tensors=None):
    return write_tiny_draft(folder, config=config, tensors=tensors)


def no_head_tensors(folder):
    return edited_draft(folder, tensors=drafter_tensors())


def other_head_geometry(folder):
    from sglang_lilicorr.config import LiLiCorrConfig
    from sglang_lilicorr.head import LiLiCorrHead

    head = LiLiCorrHead(LiLiCorrConfig(candidate_topk=8, hidden_size=0, num_layers=1, num_heads=4, factor_dim=16), 64)
    return edited_draft(folder, tensors={**drafter_tensors(), **serving_tensors(head.bfloat16())})


def no_weights(folder):
    write_tiny_draft(folder)
    (folder / "model.safetensors").unlink()
    return folder


def missing_key(folder):
    config = draft_config()
    del config["dflash_config"]["lilicorr_factor_dim"]
    return edited_draft(folder, config=config)


BAD_DRAFTS = {
    "no-head": (
        lambda f: edited_draft(f, config=draft_config(with_head=False), tensors=drafter_tensors()),
        "use --speculative-algorithm DFLASH|Serve it with --speculative-algorithm DFLASH",
    ),
    "topk-not-power-of-two": (lambda f: edited_draft(f, config=draft_config(candidate_topk=6)), "candidate_topk=6"),
    "topk-too-wide": (lambda f: edited_draft(f, config=draft_config(candidate_topk=32)), "candidate_topk=32"),
    "block-too-large": (lambda f: edited_draft(f, config=draft_config(block_size=64)), "block_size=64 is unsupported"),
    "missing-lilicorr-key": (missing_key, "lilicorr_factor_dim"),
    "no-head-tensors": (no_head_tensors, "holds no `lilicorr.` tensors"),
    "head-geometry": (other_head_geometry, "do not match the lilicorr_\\* geometry"),
    "no-weights": (no_weights, "model.safetensors is missing"),
}


@pytest.mark.parametrize("case", sorted(BAD_DRAFTS))
def test_bad_draft_is_refused_before_serving(case, target, tmp_path):
    make, match = BAD_DRAFTS[case]
    folder = make(tmp_path / "d")
    with pytest.raises(ServingConfigError, match=match):
        resolve(target, draft=folder)


def test_missing_draft_path(target):
    with pytest.raises(ServingConfigError, match="needs --speculative-draft-model-path"):
        resolve(target)


def test_draft_path_that_does_not_exist(target, tmp_path):
    # SGLang reads the draft config first (to resolve algorithm aliases) and refuses the path itself.
    with pytest.raises(OSError, match="nowhere"):
        resolve(target, draft=tmp_path / "nowhere")


def test_draft_path_must_be_a_local_folder(tmp_path):
    from sglang_lilicorr.serving.server_args import inspect_draft

    with pytest.raises(ServingConfigError, match="not a local folder"):
        inspect_draft("org/some-draft")  # a hub id: SGLang would fetch its config.json, we need the folder


@pytest.mark.parametrize(
    "overrides, match",
    [
        ({"hidden_size": 128, "intermediate_size": 256}, "hidden_size=64 but the target"),
        ({"vocab_size": 300}, "vocab_size=256 but the target"),
    ],
    ids=["hidden", "vocab"],
)
def test_draft_target_mismatch(overrides, match, draft, tmp_path):
    with pytest.raises(ServingConfigError, match=match):
        resolve(write_tiny_target(tmp_path / "t", **overrides), draft=draft)


def test_a_draft_shorter_than_the_served_context_is_refused_before_serving(target, tmp_path, monkeypatch):
    """SGLang gives the draft worker the target's context length and refuses to start a draft whose
    max_position_embeddings is shorter; we say so first, with the fixes. Positions past the draft's
    trained length are not checked: the draft proposes there (acceptance drops, outputs stay exact)."""
    monkeypatch.delenv("SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN", raising=False)
    short = edited_draft(tmp_path / "d", config={**draft_config(), "max_position_embeddings": 256})  # the target: 512
    with pytest.raises(
        ServingConfigError,
        match="draft max_position_embeddings=256 is below the 512-token context "
        ".* serve with --context-length 256, or set SGLANG_ALLOW_OVERWRITE_LONGER",
    ):
        resolve(target, draft=short)
    with pytest.raises(ServingConfigError, match="below the 300-token context"):
        resolve(target, "--context-length", 300, draft=short)
    resolve(target, "--context-length", 256, draft=short)
    monkeypatch.setenv("SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN", "1")  # SGLang stretches the draft to the context
    resolve(target, draft=short)


@pytest.mark.parametrize(
    "extra, match",
    [
        (["--pp-size", 2], "--pp-size > 1"),
        (["--enable-mixed-chunk"], "--enable-mixed-chunk"),
        (["--speculative-num-draft-tokens", 8], "differs from the draft's block_size=16"),
        (["--speculative-dflash-block-size", 8], "--speculative-dflash-block-size 8 differs"),
        (["--speculative-num-steps", 3], "--speculative-num-steps 3"),
        (["--speculative-eagle-topk", 4], "--speculative-eagle-topk 4"),
        (["--speculative-draft-window-size", 64], "--speculative-draft-window-size"),
        (["--speculative-draft-attention-backend", "trtllm_mha"], "trtllm_mha is not supported"),
        (["--speculative-draft-attention-backend", "fa3"], "fa3: SGLang can run .* checked with triton only"),
        (["--speculative-adaptive"], "--speculative-adaptive"),
    ],
    ids=lambda v: v if isinstance(v, str) and v.startswith("--") else None,
)
def test_unsupported_option_is_named(extra, match, target, draft):
    with pytest.raises(ServingConfigError, match=match):
        resolve(target, *extra, draft=draft)


def test_a_quantized_target_names_the_unquant_draft_fix(target, draft):
    with pytest.raises(ServingConfigError, match="serves with --speculative-draft-model-quantization unquant"):
        resolve(target, "--quantization", "fp8", draft=draft)  # the draft inherits fp8
    cfg = resolve(target, "--quantization", "fp8", "--speculative-draft-model-quantization", "unquant", draft=draft)
    assert cfg.quantization == "fp8" and cfg.speculative_draft_model_quantization is None


@pytest.mark.parametrize(
    "extra, match",
    [
        (["--attn-dp-size", 2, "--tp-size", 2], "attn-dp-size"),
        (["--attn-cp-size", 2, "--tp-size", 2], "attn-cp-size"),
        (["--disaggregation-mode", "prefill"], "disaggregation"),
        (["--speculative-use-block-verification"], "block-verification"),
    ],
    ids=["dp-attention", "context-parallel", "disaggregation", "block-verification"],
)
def test_unsupported_option_refused_by_us_or_sglang(extra, match, target, draft):
    """Options SGLang may reject itself before our validator runs: either way, before serving,
    with the option named."""
    with pytest.raises(ValueError, match=match):
        resolve(target, *extra, draft=draft)


# --- tensor parallelism and replicas ----------------------------------------------------------


@pytest.mark.parametrize("tp", [2, 4])
def test_tensor_parallel_is_served(tp, target, draft):
    """The tiny draft (4 heads, 2 KV heads, intermediate 128) shards over 2 and 4 ranks, as SGLang's DFlash draft
    needs."""
    cfg = resolve(target, "--tp-size", tp, draft=draft)
    assert cfg.tp_size == tp and cfg.speculative_algorithm == ALGORITHM_NAME


@pytest.mark.parametrize(
    "tp, config, match",
    [
        (
            3,
            {},
            r"--tp-size 3 does not fit the draft.*num_attention_heads=4 is not divisible by 3.*"
            r"--tp-size in \[1, 2, 4\]",
        ),
        (8, {}, r"num_attention_heads=4 is not divisible by 8"),
        (
            2,
            {"num_key_value_heads": 3, "num_attention_heads": 6},
            r"num_key_value_heads=3 neither divides nor is divisible by 2",
        ),
        (
            4,
            {"intermediate_size": 98},
            r"intermediate_size=98 is not divisible by 4 \(lilicorr train --draft-intermediate-size\)",
        ),
    ],
    ids=["heads-3", "heads-8", "kv-heads", "intermediate"],
)
def test_a_draft_that_does_not_shard_over_the_tp_ranks_is_refused(tp, config, match, target, tmp_path):
    folder = edited_draft(tmp_path / "d", config={**draft_config(), **config})
    with pytest.raises(ServingConfigError, match=match):
        resolve(target, "--tp-size", tp, draft=folder)


def test_data_parallel_replicas_are_served(target, draft):
    """--dp-size N without DP attention: N independent replicas (SGLang's data-parallel controller), each a whole
    LILICORR server with its own draft; nothing in the worker depends on the replica."""
    cfg = resolve(target, "--dp-size", 2, draft=draft)
    assert cfg.dp_size == 2 and not cfg.enable_dp_attention and cfg.attn_dp_size == 1
    cfg = resolve(target, "--dp-size", 2, "--tp-size", 2, draft=draft)
    assert (cfg.dp_size, cfg.tp_size) == (2, 2)
    with pytest.raises(ValueError, match="attn-dp-size"):
        resolve(target, "--dp-size", 2, "--tp-size", 2, "--enable-dp-attention", draft=draft)
