"""Which verification a LILICORR server runs for T = 0 and T > 0, said in one start-up line. SGLang verifies sampled
requests by exact rejection sampling where flashinfer provides it, else greedily; then LILICORR_T_GT_0 decides: `refuse`
(default: HTTP 400 at admission), `allow-greedy` or `refuse-start`."""

from __future__ import annotations

from dataclasses import dataclass

from . import ALGORITHM_NAME
from .draft_check import ServingConfigError, env_choice

ENV = "LILICORR_T_GT_0"
REFUSE, ALLOW_GREEDY, REFUSE_START = "refuse", "allow-greedy", "refuse-start"
POLICIES = (REFUSE, ALLOW_GREEDY, REFUSE_START)
REQUEST_CHECK = "sglang.srt.speculative.dflash_utils.validate_dflash_request"  # SGLang's per-request DFlash check

UNAVAILABLE = (
    "SGLang's DFlash sampling verification (exact rejection sampling) is unavailable on this build/device "
    "(its kernel needs flashinfer), so temperature > 0 would be verified by greedy argmax, not sampled"
)
REQUEST_REFUSAL = (
    f"{ALGORITHM_NAME} refuses temperature > 0 on this server: {UNAVAILABLE}. "
    "Install flashinfer, or send temperature 0."
)


def policy() -> str:
    """LILICORR_T_GT_0, checked."""
    return env_choice(ENV, POLICIES, REFUSE, "a policy for temperature > 0")


def sampled_verification_available() -> bool:
    """Whether SGLang verifies sampled DFlash requests by exact rejection sampling (its own test)."""
    from sglang.srt.speculative.dflash_utils import is_dflash_sampling_verify_available

    return is_dflash_sampling_verify_available()


def is_sampled(sampling_params) -> bool:
    """A request SGLang verifies by sampling, not by argmax (its `is_all_greedy` test, per request)."""
    return sampling_params.top_k > 1


@dataclass(frozen=True)
class Verification:
    exact_sampling: bool  # sampled requests are verified by exact rejection sampling
    policy: str

    @classmethod
    def detect(cls) -> "Verification":
        return cls(exact_sampling=sampled_verification_available(), policy=policy())

    @property
    def refuses_sampled(self) -> bool:
        return not self.exact_sampling and self.policy == REFUSE

    def startup_line(self) -> str:
        if self.exact_sampling:
            sampled = "exact rejection sampling (SGLang's DFlash sampling verification)"
        elif self.policy == ALLOW_GREEDY:
            sampled = (
                f"GREEDY FALLBACK, not sampled from the target's distribution ({ENV}={ALLOW_GREEDY}; "
                "install flashinfer for exact rejection sampling)"
            )
        else:
            sampled = (
                f"refused: each request is aborted, only SGLang's greedy fallback is available ({ENV}={REFUSE}; "
                "install flashinfer for exact rejection sampling)"
            )
        return (
            f"{ALGORITHM_NAME} verification: T = 0 greedy (longest prefix matching the target argmax); T > 0 {sampled}."
        )

    def request_refusal(self, sampling_params) -> str | None:
        """The abort message for a request this server must not serve, else None."""
        return REQUEST_REFUSAL if self.refuses_sampled and is_sampled(sampling_params) else None


def check_before_start() -> None:
    """In the launcher: the policy is valid, and refuse-start refuses a server without exact sampled verification."""
    if policy() == REFUSE_START and not sampled_verification_available():
        raise ServingConfigError(
            f"{ENV}={REFUSE_START}: {UNAVAILABLE}. Install flashinfer, or set {ENV}={REFUSE} (abort each request "
            f"with temperature > 0) or {ENV}={ALLOW_GREEDY} (serve them greedily) to start anyway."
        )


def install_request_refusal(verification: Verification) -> None:
    """In the scheduler: SGLang's per-request DFlash check also refuses what `verification` must not serve."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookSource, HookType

    def refuse(result, req, *args, **kwargs):
        return result or verification.request_refusal(req.sampling_params)

    if REQUEST_CHECK in HookRegistry._patched:  # hooked before (another plugin): a hook added now would never run
        raise ServingConfigError(
            f"{ALGORITHM_NAME} cannot refuse temperature > 0 here: another plugin already hooked {REQUEST_CHECK}. "
            f"Install flashinfer, set {ENV}={REFUSE_START} or {ALLOW_GREEDY}, or serve without that plugin."
        )
    HookRegistry.register(REQUEST_CHECK, refuse, HookType.AFTER, source=HookSource("lilicorr", "sglang-lilicorr"))
    HookRegistry.apply_hooks()
