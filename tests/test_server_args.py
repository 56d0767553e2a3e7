"""serving/server_args.py's refusals one at a time, on a plain namespace (no SGLang resolution): every unsupported
option has its own test, flipped alone from a server the checks accept, and the values at each check's edge pass."""

import types

import pytest

from sglang_lilicorr.serving import server_args
from sglang_lilicorr.serving.draft_check import ServingConfigError


def accepted(**over):
    base = dict(
        device="cuda",
        enable_dp_attention=False,
        attn_dp_size=None,
        pp_size=1,
        attn_cp_size=1,
        disaggregation_mode="null",
        enable_unified_memory=False,
        enable_mixed_chunk=False,
        enable_two_batch_overlap=False,
        speculative_adaptive=False,
        speculative_use_block_verification=False,
        speculative_draft_window_size=None,
        speculative_draft_model_quantization=None,
        enable_lora=False,
        lora_paths=None,
        speculative_accept_threshold_single=1.0,
        speculative_accept_threshold_acc=1.0,
        speculative_num_steps=None,
        speculative_eagle_topk=None,
        speculative_draft_attention_backend=None,
    )
    base.update(over)
    return types.SimpleNamespace(**base)


@pytest.mark.parametrize(
    "over",
    [
        {},
        {"device": "cuda:1"},
        {"attn_dp_size": 1},
        {"disaggregation_mode": None},
        {"speculative_num_steps": 1, "speculative_eagle_topk": 1},
        {"lora_paths": []},
    ],
)
def test_a_plain_cuda_server_passes(over):
    server_args.check_options(accepted(**over))


@pytest.mark.parametrize(
    "over, match",
    [
        ({"enable_dp_attention": True}, "--attn-dp-size > 1 / --enable-dp-attention"),
        ({"attn_dp_size": 2}, "--attn-dp-size > 1"),
        ({"pp_size": 2}, "--pp-size > 1"),
        ({"attn_cp_size": 2}, "--attn-cp-size > 1"),
        ({"disaggregation_mode": "decode"}, "--disaggregation-mode is not supported"),
        ({"enable_unified_memory": True}, "drop --enable-unified-memory"),
        ({"enable_mixed_chunk": True}, "drop --enable-mixed-chunk"),
        ({"enable_two_batch_overlap": True}, "drop --enable-two-batch-overlap"),
        ({"speculative_adaptive": True}, "--speculative-adaptive is not supported"),
        ({"speculative_use_block_verification": True}, "--speculative-use-block-verification is not supported"),
        ({"speculative_draft_window_size": 64}, "--speculative-draft-window-size is not supported"),
        ({"speculative_draft_model_quantization": "fp8"}, "--speculative-draft-model-quantization unquant"),
        ({"enable_lora": True}, "--enable-lora / --lora-paths"),
        ({"lora_paths": ["a"]}, "--enable-lora / --lora-paths"),
        ({"speculative_accept_threshold_single": 0.9}, "--speculative-accept-threshold-single/-acc != 1"),
        ({"speculative_accept_threshold_acc": 0.5}, "--speculative-accept-threshold-single/-acc != 1"),
        ({"speculative_num_steps": 2}, "--speculative-num-steps 2 is not supported"),
        ({"speculative_eagle_topk": 4}, "--speculative-eagle-topk 4 is not supported"),
        ({"device": "cpu"}, "runs on CUDA GPUs only, got --device 'cpu'"),
        ({"device": None}, "runs on CUDA GPUs only, got --device None"),
    ],
)
def test_each_unsupported_option_is_refused_alone(over, match):
    with pytest.raises(ServingConfigError, match=match.replace("(", r"\(")):
        server_args.check_options(accepted(**over))


@pytest.mark.parametrize("backend", ["triton", None])
def test_the_served_draft_attention_backend_is_accepted(backend):
    server_args.check_draft_attention_backend(accepted(speculative_draft_attention_backend=backend))


@pytest.mark.parametrize("backend", ["flashinfer", "fa3", "fa4"])
def test_a_draft_attention_backend_never_served_is_refused_with_the_fix(backend):
    with pytest.raises(
        ServingConfigError,
        match=f"{backend}: SGLang can run.*served and checked with triton only; drop the flag .*or pass triton",
    ):
        server_args.check_draft_attention_backend(accepted(speculative_draft_attention_backend=backend))


def test_the_refusals_name_every_served_backend(monkeypatch):
    monkeypatch.setattr(server_args, "SERVED_DRAFT_ATTENTION_BACKENDS", ("triton", "flashinfer"))
    with pytest.raises(ServingConfigError, match="checked with triton, flashinfer only"):
        server_args.check_draft_attention_backend(accepted(speculative_draft_attention_backend="fa3"))
    with pytest.raises(ServingConfigError, match=r"pick triton, flashinfer\.$"):
        server_args.check_draft_attention_backend(accepted(speculative_draft_attention_backend="trtllm_mha"))


def test_a_draft_attention_backend_without_block_attention_is_refused():
    with pytest.raises(ServingConfigError, match="trtllm_mha is not supported.*bidirectionally.*pick triton"):
        server_args.check_draft_attention_backend(accepted(speculative_draft_attention_backend="trtllm_mha"))


def test_missing_draft_path_is_named():
    with pytest.raises(ServingConfigError, match="needs --speculative-draft-model-path"):
        server_args.draft_path(types.SimpleNamespace(speculative_draft_model_path=None))
    assert server_args.draft_path(types.SimpleNamespace(speculative_draft_model_path="d")) == "d"


def test_tensor_parallel_messages():
    assert server_args.tensor_parallel_problems(6, 6, 102, 4) == [
        "num_attention_heads=6 is not divisible by 4",
        "num_key_value_heads=6 neither divides nor is divisible by 4",
        "intermediate_size=102 is not divisible by 4 (lilicorr train --draft-intermediate-size)",
    ]
    assert server_args.tensor_parallel_problems(8, 2, 64, 4) == []  # 4 % 2 == 0
    assert server_args.tensor_parallel_problems(8, 3, 64, 2) == [
        "num_key_value_heads=3 neither divides nor is divisible by 2"
    ]
    assert server_args.tensor_parallel_problems(8, 2, 64, 2) == []  # kv == tp
    assert server_args.tensor_parallel_problems(8, 8, 63, 1) == []
    assert server_args.tensor_parallel_problems(9, 3, 64, 3) == [
        "intermediate_size=64 is not divisible by 3 (lilicorr train --draft-intermediate-size)"
    ]


@pytest.mark.parametrize(
    "prefill, attention, want",
    [("fa3", "flashinfer", "triton"), (None, "fa4", "triton"), ("trtllm_mha", "fa3", "triton"), (None, None, "triton")],
)
def test_the_draft_runs_triton_whatever_the_targets_backend(prefill, attention, want, monkeypatch):
    spec = types.SimpleNamespace(head=types.SimpleNamespace(block_size=16))
    monkeypatch.setattr(server_args, "inspect_draft", lambda path: spec)
    args = types.SimpleNamespace(
        speculative_draft_model_path="d",
        speculative_draft_attention_backend=None,
        prefill_attention_backend=prefill,
        attention_backend=attention,
        max_running_requests=None,
    )
    server_args.resolve_server_args(args)
    assert (args.speculative_draft_attention_backend, args.speculative_num_draft_tokens, args.max_running_requests) == (
        want,
        16,
        48,
    )
    assert (args.speculative_num_steps, args.speculative_eagle_topk) == (1, 1)


@pytest.mark.parametrize(
    "override, want",
    [
        (None, (2, 512)),
        ("", (2, 512)),
        ("{}", (2, 512)),
        ('{"num_hidden_layers": 3, "max_position_embeddings": 1024}', (3, 1024)),
    ],
)
def test_the_target_config_takes_the_json_override(override, want, tmp_path):
    """--json-model-override-args reaches the target's config the draft is checked against (its context length
    included); none, or an empty string, overrides nothing."""
    (tmp_path / "config.json").write_text(
        '{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "intermediate_size": 128, '
        '"num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2, "vocab_size": 256, '
        '"max_position_embeddings": 512}'
    )
    args = types.SimpleNamespace(
        model_path=str(tmp_path), trust_remote_code=False, revision=None, json_model_override_args=override
    )
    text = server_args.target_text_config(args)
    assert (text.num_hidden_layers, text.max_position_embeddings) == want


# --- what mutation testing found untested: each refusal's whole message, the loader's options, the warning ------


def message(call) -> str:
    with pytest.raises(ServingConfigError) as refused:
        call()
    return str(refused.value)


def test_each_refusal_in_full():
    assert message(lambda: server_args.draft_path(types.SimpleNamespace(speculative_draft_model_path=None))) == (
        "--speculative-algorithm LILICORR needs --speculative-draft-model-path: the folder of a LiLiCorr draft "
        '(config.json with architectures ["LiLiCorrDraftModel"] + model.safetensors), as written by `lilicorr export`.'
    )
    assert message(lambda: server_args.check_options(accepted(device="cpu"))) == (
        "--speculative-algorithm LILICORR runs on CUDA GPUs only, got --device 'cpu': serve on a CUDA device "
        "(--device cuda), or without speculative decoding."
    )
    assert message(lambda: server_args.check_options(accepted(speculative_num_steps=3))) == (
        "--speculative-num-steps 3 is not supported with --speculative-algorithm LILICORR: it drafts one linear block "
        "per step; drop the option (it resolves to 1)."
    )
    spec = types.SimpleNamespace(
        head=types.SimpleNamespace(block_size=16),
        config={"num_attention_heads": 6, "num_key_value_heads": 6, "intermediate_size": 102},
    )
    for option in ("speculative_num_draft_tokens", "speculative_dflash_block_size"):
        args = types.SimpleNamespace(
            **{"speculative_num_draft_tokens": None, "speculative_dflash_block_size": None, option: 8}
        )
        flag = "--" + option.replace("_", "-")
        assert message(lambda: server_args.check_block_size(spec, args)) == (
            f"{flag} 8 differs from the draft's block_size=16: the LiLiCorr head is trained for 16-token blocks. "
            f"Drop {flag} or set it to 16."
        )
    assert message(lambda: server_args.check_tensor_parallel(spec, 4)) == (
        "--tp-size 4 does not fit the draft, which SGLang's DFlash draft shards over the TP ranks: "
        "num_attention_heads=6 is not divisible by 4; num_key_value_heads=6 neither divides nor is divisible by 4; "
        "intermediate_size=102 is not divisible by 4 (lilicorr train --draft-intermediate-size). Serve with --tp-size "
        "in [1, 2, 3, 6], or with a draft whose shapes divide by 4."
    )


def test_the_target_is_loaded_with_the_servers_options(monkeypatch):
    import sglang.srt.utils.hf_transformers.common as common
    import sglang.srt.utils.hf_transformers.config as config

    seen = {}
    monkeypatch.setattr(config, "get_config", lambda path, **kw: seen.update(path=path, **kw) or "cfg")
    monkeypatch.setattr(common, "get_hf_text_config", lambda c: ("text", c))
    args = types.SimpleNamespace(
        model_path="m", trust_remote_code=True, revision="r1", json_model_override_args='{"a": 1}'
    )
    assert server_args.target_text_config(args) == ("text", "cfg")
    assert seen == {"path": "m", "trust_remote_code": True, "revision": "r1", "model_override_args": {"a": 1}}


def test_the_max_running_requests_default_is_said(monkeypatch, caplog):
    monkeypatch.setattr(
        server_args, "inspect_draft", lambda path: types.SimpleNamespace(head=types.SimpleNamespace(block_size=16))
    )
    args = types.SimpleNamespace(
        speculative_draft_model_path="d",
        speculative_draft_attention_backend="fa3",
        prefill_attention_backend=None,
        attention_backend=None,
        max_running_requests=None,
    )
    with caplog.at_level("WARNING", logger=server_args.logger.name):
        server_args.resolve_server_args(args)
    assert caplog.messages == ["LILICORR: --max-running-requests defaults to 48, as for DFLASH; set it to override."]


# --- the target's attention backend ------------------------------------------------------------------------------


def target(attention="triton", prefill=None, decode=None, algorithm="LILICORR"):
    return types.SimpleNamespace(
        speculative_algorithm=algorithm,
        attention_backend=attention,
        prefill_attention_backend=prefill,
        decode_attention_backend=decode,
    )


@pytest.mark.parametrize(
    "attention, prefill, decode",
    [
        ("triton", None, None),
        ("flashinfer", None, None),
        ("flashinfer", "flashinfer", "flashinfer"),  # SGLang resolves an equal split pair into --attention-backend
        ("triton", None, "triton"),
        ("fa3", "triton", "triton"),  # both phases named: --attention-backend is read by neither
    ],
)
def test_the_accepted_target_attention_backends_pass(attention, prefill, decode):
    assert server_args.SERVED_TARGET_ATTENTION_BACKENDS == ("triton", "flashinfer")
    assert server_args.check_target_attention_backend(target(attention, prefill, decode)) == (prefill or attention)


@pytest.mark.parametrize(
    "backend",
    ["fa3", "fa4", "flashmla", "cutlass_mla", "trtllm_mha", "trtllm_mla", "torch_native", "aiter", "wave", "x"],
)
def test_a_target_attention_backend_never_served_is_refused_with_the_fix(backend):
    assert message(lambda: server_args.check_target_attention_backend(target(backend))) == (
        f"--attention-backend {backend} is not supported with --speculative-algorithm LILICORR: the target's prefill "
        f"and decode attention has never been served and checked on {backend} (LILICORR accepts triton, flashinfer); "
        "pass --attention-backend triton or flashinfer (triton is served and proven lossless)."
    )


@pytest.mark.parametrize(
    "prefill, decode, flag, phase",
    [
        ("fa3", None, "--prefill-attention-backend fa3", "prefill"),
        (None, "fa4", "--decode-attention-backend fa4", "decode"),
        ("fa3", "fa3", "--prefill-attention-backend fa3", "prefill and decode"),
    ],
)
def test_each_phase_the_target_runs_is_checked(prefill, decode, flag, phase):
    backend = flag.split()[-1]
    assert message(lambda: server_args.check_target_attention_backend(target("triton", prefill, decode))) == (
        f"{flag} is not supported with --speculative-algorithm LILICORR: the target's {phase} attention has never been "
        f"served and checked on {backend} (LILICORR accepts triton, flashinfer); pass --attention-backend triton or "
        "flashinfer (triton is served and proven lossless) and drop the split flags."
    )


def test_a_split_pair_of_two_accepted_backends_is_refused():
    assert message(lambda: server_args.check_target_attention_backend(target("triton", "flashinfer"))) == (
        "The target's prefill attention would run flashinfer and its decode attention triton (--attention-backend, "
        "--prefill-attention-backend, --decode-attention-backend): LILICORR has been served with one backend for both, "
        "never with SGLang's hybrid of two; pass --attention-backend flashinfer or triton alone."
    )


def test_the_target_refusals_name_every_accepted_backend(monkeypatch):
    monkeypatch.setattr(server_args, "SERVED_TARGET_ATTENTION_BACKENDS", ("triton",))
    with pytest.raises(ServingConfigError, match=r"accepts triton\); pass --attention-backend triton \("):
        server_args.check_target_attention_backend(target("flashinfer"))


DEFAULT_LINE = (
    "LILICORR: --attention-backend defaults to triton (the target's {} attention), the backend LILICORR is served and "
    "proven on, where SGLang's own default can be one it was never served on (fa3 on Hopper); pass --attention-backend "
    "flashinfer for the other one accepted."
)


@pytest.mark.parametrize(
    "algorithm, prefill, decode, phases",
    [
        ("LILICORR", None, None, "prefill and decode"),
        ("lilicorr", None, None, "prefill and decode"),  # before SGLang upper-cases the name
        ("LILICORR", "triton", None, "decode"),
        ("LILICORR", None, "flashinfer", "prefill"),
    ],
)
def test_an_unset_target_backend_defaults_to_triton_and_says_so(algorithm, prefill, decode, phases, caplog):
    args = target(None, prefill, decode, algorithm)
    with caplog.at_level("WARNING", logger=server_args.logger.name):
        server_args.default_target_attention_backend(args)
    assert args.attention_backend == "triton"
    assert caplog.messages == [DEFAULT_LINE.format(phases)]


@pytest.mark.parametrize(
    "attention, prefill, decode, algorithm",
    [
        ("flashinfer", None, None, "LILICORR"),  # named: kept
        ("fa3", None, None, "LILICORR"),  # named (or a model's): kept, and refused by validate_server_args
        (None, "triton", "triton", "LILICORR"),  # both phases named: --attention-backend is not read
        (None, None, None, "DFLASH"),  # another algorithm: SGLang's own default
        (None, None, None, None),  # no speculation
    ],
)
def test_the_target_backend_default_changes_nothing_else(attention, prefill, decode, algorithm, caplog):
    args = target(attention, prefill, decode, algorithm)
    with caplog.at_level("WARNING", logger=server_args.logger.name):
        server_args.default_target_attention_backend(args)
    assert args.attention_backend == attention and caplog.messages == []
