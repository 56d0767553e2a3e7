"""Which verification serves T > 0 (serving/verification.py), on CPU: the detection on both builds (SGLang's
availability test monkeypatched), the start-up line, the refusal per request's sampling parameters, the
hook through which SGLang's scheduler aborts a refused request, and LILICORR_T_GT_0=refuse-start."""

from __future__ import annotations

import types
from collections import defaultdict

import pytest

pytest.importorskip("sglang")

from sglang.srt.sampling.sampling_params import SamplingParams  # noqa: E402

from sglang_lilicorr.serving import verification  # noqa: E402
from sglang_lilicorr.serving.draft_check import ServingConfigError  # noqa: E402
from sglang_lilicorr.serving.verification import Verification  # noqa: E402
from test_plugin import draft, registered, resolve, target  # noqa: E402,F401  (fixtures)

EXACT, FALLBACK = Verification(True, "refuse"), Verification(False, "refuse")
GREEDY = [
    SamplingParams(temperature=0.0),
    SamplingParams(temperature=0.0, top_k=50),
    SamplingParams(temperature=0.7, top_k=1),
]
SAMPLED = [
    SamplingParams(temperature=1.0),
    SamplingParams(temperature=0.6, top_p=0.9),
    SamplingParams(temperature=1.0, top_k=2),
]


@pytest.fixture
def sampling_verify(monkeypatch):
    """Sets what SGLang's `is_dflash_sampling_verify_available()` answers (False where flashinfer is missing)."""
    from sglang.srt.speculative import dflash_utils

    return lambda available: monkeypatch.setattr(dflash_utils, "_DFLASH_SAMPLING_VERIFY_AVAILABLE", available)


@pytest.mark.parametrize("available", [True, False])
def test_detection_is_sglangs_own_availability_test(available, sampling_verify, monkeypatch):
    monkeypatch.delenv(verification.ENV, raising=False)
    sampling_verify(available)
    assert Verification.detect() == Verification(exact_sampling=available, policy="refuse")


def test_start_up_line_says_what_verifies_t_0_and_t_above_0():
    t0 = "LILICORR verification: T = 0 greedy (longest prefix matching the target argmax); T > 0 "
    assert EXACT.startup_line() == t0 + "exact rejection sampling (SGLang's DFlash sampling verification)."
    assert FALLBACK.startup_line() == t0 + (
        "refused: each request is aborted, only SGLang's greedy fallback is available (LILICORR_T_GT_0=refuse; "
        "install flashinfer for exact rejection sampling)."
    )
    assert Verification(False, "allow-greedy").startup_line() == t0 + (
        "GREEDY FALLBACK, not sampled from the target's distribution (LILICORR_T_GT_0=allow-greedy; "
        "install flashinfer for exact rejection sampling)."
    )


@pytest.mark.parametrize("params", GREEDY + SAMPLED, ids=lambda p: f"T{p.temperature}-k{p.top_k}")
def test_only_sampled_requests_are_refused_and_only_under_the_greedy_fallback(params):
    sampled = params in SAMPLED
    assert verification.is_sampled(params) == sampled
    refusal = FALLBACK.request_refusal(params)
    assert (refusal is not None) == sampled
    if sampled:
        assert refusal.endswith("Install flashinfer, or send temperature 0.") and "greedy argmax" in refusal
    assert EXACT.request_refusal(params) is None
    assert Verification(False, "allow-greedy").request_refusal(params) is None


def test_a_policy_that_is_not_one_is_named(monkeypatch):
    monkeypatch.setenv(verification.ENV, "strict")
    with pytest.raises(
        ServingConfigError, match="LILICORR_T_GT_0='strict' is not a policy .* refuse, allow-greedy, refuse-start"
    ):
        verification.policy()


@pytest.fixture
def fresh_hooks(monkeypatch):
    """SGLang's hook registry and the hooked function, restored after the test."""
    import sglang.srt.managers.scheduler as scheduler
    from sglang.srt.plugins.hook_registry import HookRegistry
    from sglang.srt.speculative import dflash_utils

    monkeypatch.setattr(HookRegistry, "_hooks", defaultdict(list))
    monkeypatch.setattr(HookRegistry, "_patched", set())
    for module in (dflash_utils, scheduler):
        monkeypatch.setattr(module, "validate_dflash_request", module.validate_dflash_request)
    return scheduler


def test_the_scheduler_aborts_refused_requests_at_admission(fresh_hooks):
    """After install, the scheduler's own per-request DFlash check (whose message it turns into
    FINISH_ABORT before scheduling) returns the refusal for a sampled request, and nothing new for others."""
    scheduler = fresh_hooks

    def request(params, hidden=False):
        return types.SimpleNamespace(sampling_params=params, return_hidden_states=hidden)

    assert scheduler.validate_dflash_request(request(SAMPLED[0]), False) is None
    verification.install_request_refusal(FALLBACK)
    from sglang.srt.plugins.hook_registry import HookRegistry, HookSource, HookType

    ((hook_type, _, source),) = HookRegistry._hooks[verification.REQUEST_CHECK]  # one AFTER hook, naming our plugin
    assert (hook_type, source) == (HookType.AFTER, HookSource("lilicorr", "sglang-lilicorr"))
    assert scheduler.validate_dflash_request(request(SAMPLED[0]), False) == verification.REQUEST_REFUSAL
    for params in GREEDY:
        assert scheduler.validate_dflash_request(request(params), False) is None
    assert "return_hidden_states" in scheduler.validate_dflash_request(
        request(GREEDY[0], hidden=True), True
    )  # SGLang's own


def test_a_refusal_another_plugins_hook_would_keep_from_running_stops_the_start(fresh_hooks):
    """SGLang applies a target's hooks once: where another plugin hooked the request check first, ours would never
    run and sampled requests would be served greedily; the server does not start instead."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(verification.REQUEST_CHECK, lambda result, *a, **k: result, HookType.AFTER)
    HookRegistry.apply_hooks()
    with pytest.raises(ServingConfigError, match="another plugin already hooked .*validate_dflash_request"):
        verification.install_request_refusal(FALLBACK)


def test_refuse_start_refuses_only_a_server_without_exact_sampling(target, draft, sampling_verify, monkeypatch):  # noqa: F811
    monkeypatch.setenv(verification.ENV, "refuse-start")
    sampling_verify(False)
    with pytest.raises(
        ServingConfigError,
        match="LILICORR_T_GT_0=refuse-start: SGLang's DFlash sampling verification .* "
        "Install flashinfer, or set LILICORR_T_GT_0=refuse",
    ):
        resolve(target, draft=draft)
    sampling_verify(True)
    resolve(target, draft=draft)
    sampling_verify(False)
    for policy in ("refuse", "allow-greedy"):
        monkeypatch.setenv(verification.ENV, policy)
        resolve(target, draft=draft)
    monkeypatch.setenv(verification.ENV, "strict")
    with pytest.raises(ServingConfigError, match="LILICORR_T_GT_0='strict'"):
        resolve(target, draft=draft)


def test_the_decision_cannot_be_changed_after_start_up():
    """The worker reads one Verification for the server's life: it is frozen."""
    import dataclasses

    with pytest.raises(dataclasses.FrozenInstanceError):
        FALLBACK.policy = "allow-greedy"
    assert FALLBACK.refuses_sampled
