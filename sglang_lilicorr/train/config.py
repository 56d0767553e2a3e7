"""TrainConfig: every knob of `lilicorr train`, validated when built (before any model loads)."""

from __future__ import annotations

import dataclasses
import math
import re
from pathlib import Path
from typing import Any

from ..baselines import MARKOV_HEAD_TYPES, DominoConfig, DSparkConfig
from ..config import LiLiCorrConfig
from ..drafter.config import ROPE_TYPES, RopeScaling
from ..errors import UsageError
from ..losses import ObjectiveWeights
from .heads import HEADS, HeadConfig

_HEAD = LiLiCorrConfig()
TRAIN_MODES = ("joint", "head")  # --train: what a run updates
# the options that take an integer >= 1
AT_LEAST_ONE = (
    "batch_size grad_accum epochs num_anchors log_every save_every keep_checkpoints max_bad_steps draft_layers "
    "num_context_features eval_examples"
).split()
_OBJECTIVE = ObjectiveWeights()


class TrainConfigError(UsageError):
    """A training option is out of range; the message names the option and the fix."""


@dataclasses.dataclass
class TrainConfig:
    target: str  # HF model directory (frozen target + its tokenizer)
    data: str  # training conversations jsonl (from `lilicorr regenerate`)
    output_dir: str
    eval_data: str | None = None  # held-out conversations; default: hold out eval_examples of data
    eval_examples: int = 64  # held-out conversations evaluated at every eval step
    exclude: str | None = None  # evaluation prompts (jsonl): a training conversation that overlaps one is refused
    # drafter geometry
    draft_layers: int = 1
    num_context_features: int = 5
    block_size: int = _HEAD.block_size
    mask_token: str | None = None  # default: the tokenizer's mask token
    draft_intermediate_size: int = 0  # 0 = the target's
    rope_scaling: str = "default"  # the drafter's rope: default, or yarn (long inputs)
    rope_factor: float = 1.0  # yarn: how far the rope is stretched (> 1)
    rope_original_max_position: int = 0  # yarn: the length it is stretched from (0 = the target's max positions)
    # the head trained beside the drafter (train/heads.py): lilicorr, domino, dspark or none (gamma = 0: none too)
    head: str = "lilicorr"
    train: str = "joint"  # what the run updates: joint (drafter and head, the paper) or head (a frozen drafter)
    corrector_width: int = 0  # domino: GRU and MLP width, dspark: Markov rank (0 = the drafter's hidden width)
    markov_head_type: str = "vanilla"  # dspark: vanilla, gated or rnn
    # LiLiCorr head geometry
    candidate_topk: int = _HEAD.candidate_topk  # K
    head_hidden_size: int = _HEAD.hidden_size  # the lattice transformer's width
    head_layers: int = _HEAD.num_layers
    head_heads: int = _HEAD.num_heads
    head_mlp_ratio: float = _HEAD.mlp_ratio  # FFN width / head width
    factor_dim: int = _HEAD.factor_dim  # d_e
    logit_scale: float = _HEAD.logit_scale  # sigma
    # objective (Eq. 7; App. G margin)
    beta: float = _OBJECTIVE.beta  # DFlash decay
    gamma: float = _OBJECTIVE.gamma  # reranker weight; 0 = vanilla DFlash
    lam: float = _OBJECTIVE.lam  # lambda, the distractor's weight
    use_margin: bool = _OBJECTIVE.use_margin
    mu: float = _OBJECTIVE.mu
    rho: float = _OBJECTIVE.rho
    # optimisation
    lr_drafter: float = 6e-4
    wd_drafter: float = 0.0
    lr_head: float = 1.5e-4
    wd_head: float = 0.01
    warmup_ratio: float = 0.04
    grad_clip: float = 1.0
    bf16: bool = True
    epochs: int = 6
    max_steps: int = 0  # > 0 caps the run
    max_minutes: float = 0.0  # > 0: stop (evaluated, checkpointed) after this much wall time; the schedule is cut there
    batch_size: int = 1  # sequences per rank and micro-step
    grad_accum: int = 1  # micro-steps per optimizer step (global batch = batch_size * grad_accum * ranks)
    max_length: int = 3072
    num_anchors: int = 64  # blocks per sequence
    seed: int = 0
    log_every: int = 10
    eval_every: int = 0  # held-out eval + curve snapshot every N steps (0 = at log steps)
    save_every: int = 500
    keep_checkpoints: int = 2  # resumable checkpoints kept (the newest; older ones are the fallback)
    max_bad_steps: int = 10  # non-finite steps skipped before the run stops
    resume: bool = True  # --no-resume: a new run, in a folder without one (or with --move-aside)
    move_aside: bool = False  # with --no-resume: the run in --output-dir is moved to OUTPUT.old-N (never deleted)
    resume_with_changes: bool = False  # resume although the data or a setting differs from the checkpoint's
    accept_legacy_checkpoints: bool = False  # resume from checkpoints without checksums (older runs), warned
    init_from: str | None = None  # an exported draft whose weights start the run (a resumed run ignores it)
    chat_template_kwargs: dict[str, Any] = dataclasses.field(default_factory=lambda: {"enable_thinking": False})

    def __post_init__(self) -> None:
        self.validate()

    def objective(self) -> ObjectiveWeights:
        gamma = 0.0 if self.head == "none" else self.gamma  # no head: the drafter's loss alone
        return ObjectiveWeights(
            beta=self.beta, gamma=gamma, lam=self.lam, use_margin=self.use_margin, mu=self.mu, rho=self.rho
        )

    def head_config(self, block_size: int, rms_norm_eps: float, hidden_size: int = 0) -> HeadConfig | None:
        """The head's geometry for a drafter of `hidden_size`; None for plain DFlash (--head none, or gamma = 0)."""
        if self.head == "none" or self.gamma == 0:
            return None
        width = self.corrector_width or hidden_size
        if self.head == "domino":
            return DominoConfig(gru_hidden_dim=width, emb_dim=width)
        if self.head == "dspark":
            return DSparkConfig(markov_rank=width, markov_head_type=self.markov_head_type)
        return LiLiCorrConfig(
            block_size=block_size,
            candidate_topk=self.candidate_topk,
            factor_dim=self.factor_dim,
            logit_scale=self.logit_scale,
            num_layers=self.head_layers,
            hidden_size=self.head_hidden_size,
            num_heads=self.head_heads,
            mlp_ratio=self.head_mlp_ratio,
            rms_norm_eps=rms_norm_eps,
        )

    def validate(self) -> None:
        def need(ok: bool, name: str, what: str) -> None:
            if not ok:
                flag = "--" + name.replace("_", "-")
                raise TrainConfigError(
                    f"{flag} {getattr(self, name)!r} is not {what}", where=flag, fix="see `lilicorr train --help`"
                )

        rate = "a finite learning rate in (0, 1] (paper: 6e-4 drafter, 1.5e-4 head)"
        for name in ("lr_drafter", "lr_head"):
            need(_number(getattr(self, name)) and 0 < getattr(self, name) <= 1, name, rate)
        for name in ("wd_drafter", "wd_head"):
            need(_number(getattr(self, name)) and getattr(self, name) >= 0, name, "a finite number >= 0")
        need(_number(self.grad_clip) and self.grad_clip > 0, "grad_clip", "a finite number > 0 (paper: 1.0)")
        need(
            _number(self.warmup_ratio) and 0 <= self.warmup_ratio < 1,
            "warmup_ratio",
            "a fraction in [0, 1) (paper: 0.04)",
        )
        need(
            _number(self.max_minutes) and self.max_minutes >= 0,
            "max_minutes",
            "a number of minutes >= 0 (0 = no time limit)",
        )
        for name in AT_LEAST_ONE:
            need(isinstance(getattr(self, name), int) and getattr(self, name) >= 1, name, "an integer >= 1")
        need(self.head in HEADS, "head", f"one of {', '.join(HEADS)}")
        need(self.train in TRAIN_MODES, "train", f"one of {', '.join(TRAIN_MODES)}")
        need(self.markov_head_type in MARKOV_HEAD_TYPES, "markov_head_type", f"one of {', '.join(MARKOV_HEAD_TYPES)}")
        for name in ("max_steps", "eval_every", "draft_intermediate_size", "seed", "corrector_width"):
            need(isinstance(getattr(self, name), int) and getattr(self, name) >= 0, name, "an integer >= 0")
        self.validate_rope()
        need(
            self.init_from is None or (Path(self.init_from) / "config.json").is_file(),
            "init_from",
            "an exported draft folder (config.json + model.safetensors, from `lilicorr export`)",
        )
        need(
            isinstance(self.max_length, int) and self.max_length >= self.block_size + 2,
            "max_length",
            f"an integer >= block_size + 2 = {self.block_size + 2} (room for one block after a prompt token)",
        )
        try:
            self.objective()
            self.head_config(self.block_size, 1e-6, hidden_size=1)
        except ValueError as e:  # the objective's and the head's own range checks, under the CLI's names
            raise self.named_by_flag(str(e)) from None
        if self.move_aside and self.resume:
            raise TrainConfigError(
                "--move-aside starts a new run: it goes with --no-resume",
                where="--move-aside",
                fix="add --no-resume (the run there moves to OUTPUT.old-N), or drop --move-aside to resume that run",
            )
        if self.train == "head" and (self.init_from is None or self.head_config(self.block_size, 1e-6, 1) is None):
            raise TrainConfigError(
                "--train head trains a head on a trained drafter, which stays frozen: it needs --init-from DRAFT and "
                "a head",
                where="--train",
                fix="pass --init-from with a DFlash draft (and --head lilicorr, domino or dspark with gamma > 0), or "
                "--train joint",
            )
        need(
            self.gamma > 0 or self.head in ("lilicorr", "none"),
            "gamma",
            f"> 0 with --head {self.head} (its head's weight; --head none trains plain DFlash)",
        )

    # LiLiCorrConfig's fields under this config's names (the objective's are the same)
    HEAD_FIELDS = {
        "num_layers": "head_layers",
        "hidden_size": "head_hidden_size",
        "num_heads": "head_heads",
        "mlp_ratio": "head_mlp_ratio",
    }

    def named_by_flag(self, message: str) -> TrainConfigError:
        """A range error of LiLiCorrConfig or ObjectiveWeights as the error of the flag that set the field."""
        found = re.match(r"(?:LiLiCorrConfig|ObjectiveWeights)\.(\w+)=.*?: expected (.*?)\.?$", message)
        name = found and self.HEAD_FIELDS.get(found.group(1), found.group(1))
        if not found or name not in {f.name for f in dataclasses.fields(self)}:
            return TrainConfigError(message)
        flag = "--" + name.replace("_", "-")
        return TrainConfigError(
            f"{flag} {getattr(self, name)!r}: expected {found.group(2)}", where=flag, fix="see `lilicorr train --help`"
        )

    def validate_rope(self) -> None:
        if self.rope_scaling not in ROPE_TYPES:
            raise TrainConfigError(
                f"--rope-scaling {self.rope_scaling!r}: expected one of {', '.join(ROPE_TYPES)}",
                where="--rope-scaling",
                fix="pass default, or yarn for long inputs",
            )
        if not isinstance(self.rope_original_max_position, int) or self.rope_original_max_position < 0:
            raise TrainConfigError(
                f"--rope-original-max-position {self.rope_original_max_position!r}: expected an integer >= 0",
                where="--rope-original-max-position",
                fix="0 = the target's max_position_embeddings",
            )
        if self.rope_scaling == "yarn":
            if not (_number(self.rope_factor) and self.rope_factor > 1):
                raise TrainConfigError(
                    f"--rope-factor {self.rope_factor!r}: --rope-scaling yarn needs a factor > 1",
                    where="--rope-factor",
                    fix="e.g. 4 serves 4x the original length",
                )
            return
        if self.rope_factor != 1.0 or self.rope_original_max_position:
            given = "--rope-factor" if self.rope_factor != 1.0 else "--rope-original-max-position"
            raise TrainConfigError(
                f"{given} scales the rope only with --rope-scaling yarn",
                where=given,
                fix=f"add --rope-scaling yarn, or drop {given}",
            )

    def check_paths(self) -> None:
        """The input files exist (a usage error, exit 2, before anything loads)."""
        for name in ("data", "eval_data", "exclude"):
            value = getattr(self, name)
            if value is not None and not Path(value).is_file():
                raise TrainConfigError(
                    f"{value!r} is not an existing file",
                    where="--" + name.replace("_", "-"),
                    fix="pass a jsonl of conversations (`lilicorr regenerate` writes them)",
                )

    # what a resumed run must share with its checkpoint besides geometry and data: every setting shaping the updates
    # (not where things go, how long it runs, or how often it logs, evaluates and saves)
    NOT_COMPARED = (
        "target data eval_data output_dir exclude epochs max_steps max_minutes log_every eval_every save_every "
        "keep_checkpoints max_bad_steps resume move_aside resume_with_changes accept_legacy_checkpoints init_from"
    ).split()

    # settings added after runs were first checkpointed, with the value those runs had (state.check_resume_compatible)
    ADDED = {"head": "lilicorr", "corrector_width": 0, "markov_head_type": "vanilla", "train": "joint"}

    def resumed_settings(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in self.NOT_COMPARED}

    def drafter_rope(self, target_max_positions: int) -> RopeScaling:
        """The drafter's rope scaling for a target of `target_max_positions` positions."""
        if self.rope_scaling == "default":
            return RopeScaling()
        return RopeScaling(
            "yarn",
            factor=self.rope_factor,
            original_max_position_embeddings=self.rope_original_max_position or target_max_positions,
        )


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
