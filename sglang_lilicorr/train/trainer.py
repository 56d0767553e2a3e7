"""`lilicorr train`: the DFlash drafter and a head trained jointly, on one GPU or DDP (torchrun): AdamW, cosine warm-up
schedule, gradient clip, bf16 autocast over fp32 masters. A step is G = grad_accum x ranks micro-batches; micro-batch j
= rank + ranks * micro holds sequences j, j + G, ... seeded by step * G + j, so any split trains the same gradient."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import math
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from ..drafter import DFlashDrafter, DrafterConfig, default_target_layer_ids, sample_anchors
from ..errors import LiLiCorrError
from ..frozen_target import FrozenTarget, loading_target
from ..ownership import HeldError, claim_folder, sha256_of, sole_writer, space_for
from ..reference.propose import BlockProposer
from ..reference.replay import Replayer, pooled_tau
from .config import TrainConfig, TrainConfigError
from .data import DataError, Example, collate, epoch_batches, load_conversations, read_jsonl
from .heads import Head, HeadConfig, build_head
from .joint import JointModel, metric_sums, pooled_metrics, ratios
from .prompts import check_disjoint, eval_guard
from .state import LATEST, STATE_FILE, TENSORS_FILE, IncompatibleCheckpointError, check_resume_compatible, trim_metrics
from .state import draft_geometry, point_latest, set_aside_newer, load_draft_weights, load_trainable, prune_checkpoints
from .state import remove_orphans, resume_point, save_snapshot, save_training_checkpoint, trainable_tensors
from .timing import PhaseTimer


class TrainingDiverged(LiLiCorrError, RuntimeError):
    """Too many steps had a non-finite loss or gradient; the last good checkpoint is kept."""


def resolve_mask_token(tokenizer, name: str | None, vocab_size: int) -> tuple[str, int]:
    name = name or getattr(tokenizer, "mask_token", None)
    if not name:
        raise TrainConfigError(
            "the tokenizer has no mask token",
            where="--mask-token",
            fix="pass --mask-token with an existing special token (SmolLM2: <empty_output>)",
        )
    token_id = tokenizer.convert_tokens_to_ids(name)
    if token_id is None or token_id == getattr(tokenizer, "unk_token_id", None) or not 0 <= token_id < vocab_size:
        raise TrainConfigError(
            f"mask token {name!r} is not a single token of the target vocabulary ({vocab_size})",
            where="--mask-token",
            fix="pick a special token of the target's tokenizer",
        )
    return name, int(token_id)


def drafter_config_for(model, tokenizer, cfg: TrainConfig) -> DrafterConfig:
    """Drafter geometry: an --init-from draft's own (`init_drafter_config`), else the target's and the run's options."""
    tc = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    n_layers, lm_head = int(tc.num_hidden_layers), model.get_output_embeddings().weight.shape
    if cfg.init_from:
        drafter = init_drafter_config(cfg, n_layers, lm_head)
        check_mask_token(tokenizer, drafter, cfg.init_from)
        return drafter
    hidden, heads = int(tc.hidden_size), int(tc.num_attention_heads)
    rope = getattr(tc, "rope_parameters", None) or {}
    mask_name, mask_id = resolve_mask_token(tokenizer, cfg.mask_token, lm_head[0])
    features = min(cfg.num_context_features, max(1, n_layers - 3))
    max_positions = int(getattr(tc, "max_position_embeddings", 32768))
    return DrafterConfig(
        hidden_size=hidden,
        vocab_size=int(lm_head[0]),
        num_target_layers=n_layers,
        target_layer_ids=tuple(default_target_layer_ids(n_layers, features)),
        mask_token_id=mask_id,
        mask_token=mask_name,
        num_hidden_layers=cfg.draft_layers,
        num_attention_heads=heads,
        num_key_value_heads=int(getattr(tc, "num_key_value_heads", heads) or heads),
        head_dim=int(getattr(tc, "head_dim", None) or hidden // heads),
        intermediate_size=cfg.draft_intermediate_size or int(tc.intermediate_size),
        block_size=cfg.block_size,
        rope_theta=float(rope.get("rope_theta", getattr(tc, "rope_theta", 1_000_000.0))),
        rms_norm_eps=float(getattr(tc, "rms_norm_eps", 1e-6)),
        max_position_embeddings=max_positions,
        rope_scaling=cfg.drafter_rope(max_positions),
    )


# the options that shape a new drafter, with the DrafterConfig field each sets: a run started from a draft has the
# draft's geometry, and one of these given another value is refused
GEOMETRY_OPTIONS = {
    "draft_layers": "num_hidden_layers",
    "num_context_features": "num_context_features",
    "block_size": "block_size",
    "draft_intermediate_size": "intermediate_size",
    "mask_token": "mask_token",
}
RECORDED_GEOMETRY = ("draft_layers", "num_context_features", "block_size")  # the FFN width and mask token stay as given


def init_drafter_config(cfg: TrainConfig, target_layers: int, lm_head_shape) -> DrafterConfig:
    """The drafter of a run started from a draft (--init-from): the draft's geometry with the run's rope scaling; it
    must fit the target, and a geometry option set otherwise is refused (IncompatibleCheckpointError)."""
    draft = draft_geometry(cfg.init_from)
    where = f"--init-from {cfg.init_from}"
    vocab, hidden = (int(n) for n in lm_head_shape)
    for field, target in (("hidden_size", hidden), ("vocab_size", vocab), ("num_target_layers", target_layers)):
        if getattr(draft, field) != target:
            raise IncompatibleCheckpointError(
                f"the draft's {field} {getattr(draft, field)} is not the target's {target}: it drafts for another "
                "model",
                where=where,
                fix="pass the draft made for this target (or this draft's target as --target)",
            )
    defaults = {f.name: f.default for f in dataclasses.fields(TrainConfig)}
    for option, field in GEOMETRY_OPTIONS.items():
        given, own = getattr(cfg, option), getattr(draft, field)
        if given != defaults[option] and given != own:
            flag = "--" + option.replace("_", "-")
            raise IncompatibleCheckpointError(
                f"{flag} {given!r} differs from the draft's {field} {own!r}",
                where=where,
                fix=f"drop {flag}: a run started from a draft has the draft's geometry",
            )
    return dataclasses.replace(draft, rope_scaling=cfg.drafter_rope(draft.max_position_embeddings))


def check_mask_token(tokenizer, drafter: DrafterConfig, where: str) -> None:
    """Where the tokenizer names the draft's mask token, its id must be the draft's (as SGLang checks)."""
    token_id = tokenizer.get_vocab().get(drafter.mask_token)
    if token_id is not None and token_id != drafter.mask_token_id:
        raise IncompatibleCheckpointError(
            f"the draft's mask token {drafter.mask_token!r} is id {drafter.mask_token_id}, the target's tokenizer "
            f"gives it id {token_id}",
            where=f"--init-from {where}",
            fix="pass the draft made for this target's tokenizer",
        )


def build_optimizer(drafter: DFlashDrafter, head: Head | None, cfg: TrainConfig) -> torch.optim.AdamW:
    """AdamW over what the run trains, a group each: the drafter (not with --train head: frozen, no state), the head."""
    trained = [("drafter", drafter, cfg.lr_drafter, cfg.wd_drafter)] if cfg.train == "joint" else []
    if head is not None:
        trained.append(("head", head, cfg.lr_head, cfg.wd_head))
    return torch.optim.AdamW(
        [{"params": list(m.parameters()), "lr": lr, "weight_decay": wd, "name": name} for name, m, lr, wd in trained]
    )


def build_models(
    cfg: TrainConfig, drafter_cfg: DrafterConfig, head_cfg: HeadConfig | None, target: FrozenTarget, device
) -> tuple[DFlashDrafter, Head | None, JointModel, torch.optim.AdamW]:
    """A fresh drafter (frozen with --train head) and head on `device`, their JointModel, and the optimizer."""
    drafter = DFlashDrafter(drafter_cfg).to(device).requires_grad_(cfg.train == "joint")
    head = None if head_cfg is None else build_head(head_cfg, drafter_cfg).to(device)
    return drafter, head, JointModel(drafter, head, target), build_optimizer(drafter, head, cfg)


def cosine_with_warmup(optimizer, total_steps: int, warmup_ratio: float) -> torch.optim.lr_scheduler.LambdaLR:
    warmup = max(1, math.ceil(warmup_ratio * total_steps))

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, total_steps - warmup)
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def load_target(path: str, device: torch.device, bf16: bool):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    dtype = torch.bfloat16 if bf16 and device.type == "cuda" else torch.float32
    with loading_target(path):
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device)
        tokenizer = AutoTokenizer.from_pretrained(path)
    return model, tokenizer


def held_out_turns(path: str, limit: int) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, output ids) of the first `limit` held-out turns where the rows carry them; else []."""
    turns = []
    for _, row in read_jsonl(path):
        turns += [(list(t["prompt_ids"]), list(t["output_ids"])) for t in row.get("turns") or []]
        if len(turns) >= limit:
            break
    return turns[:limit]


def is_run_folder(folder: Path) -> bool:
    """A training run written before runs carried a marker: `latest` naming one of its checkpoints."""
    try:
        name = (folder / LATEST).read_text().strip()
    except (OSError, UnicodeDecodeError):
        return False
    return name.startswith("step-") and (folder / "checkpoints" / name / STATE_FILE).is_file()


def claim_output_dir(cfg: TrainConfig, create: bool) -> None:
    """--output-dir must be new, empty or a training run: train never writes into a folder it did not create."""
    fix = "pick a new or empty folder, or a run's own folder to resume it (train never writes elsewhere)"
    claim_folder(cfg.output_dir, "run", "--output-dir", recognise=is_run_folder, create=create, fix=fix)


def run_identity(cfg: TrainConfig) -> dict:
    """What a checkpoint records of its run and a resume compares: the data's sha256 and the update-shaping settings."""
    return {
        "data_sha256": sha256_of(cfg.data),
        "eval_data_sha256": None if cfg.eval_data is None else sha256_of(cfg.eval_data),
        **cfg.resumed_settings(),
    }


def split_eval(
    examples: list[Example], cfg: TrainConfig, tokenizer, write_cache: bool
) -> tuple[list[Example], list[Example]]:
    if cfg.eval_data:
        held = load_conversations(cfg.eval_data, tokenizer, cfg.max_length, cfg.chat_template_kwargs, write_cache)
        seen = {tuple(e.input_ids.tolist()) for e in examples}
        if any(tuple(e.input_ids.tolist()) in seen for e in held):
            raise DataError(
                f"evaluation conversations also occur in {cfg.data}",
                where=cfg.eval_data,
                fix="held-out data must not be training data: pass another --eval-data",
            )
        return examples, held[: cfg.eval_examples]
    if cfg.eval_examples > len(examples) // 2:
        raise TrainConfigError(
            f"--eval-examples {cfg.eval_examples} would hold out more than half of the {len(examples)} "
            "usable conversations",
            where=cfg.data,
            fix=f"pass --eval-examples {max(1, len(examples) // 2)} or less, "
            "or --eval-data with held-out conversations",
        )
    return examples[: -cfg.eval_examples], examples[-cfg.eval_examples :]


def forward_at_anchors(model, batch: dict[str, torch.Tensor], num_anchors: int, seed: int, weights, device):
    """The joint model (or its DDP wrapper) on a collated batch at num_anchors anchors a row, sampled with `seed`."""
    anchors, valid = sample_anchors(batch["loss_mask"], num_anchors, torch.Generator().manual_seed(seed))
    ids, attention_mask, loss_mask = batch["input_ids"], batch["attention_mask"], batch["loss_mask"]
    return model(ids, attention_mask, loss_mask, anchors.to(device), valid.to(device), weights)


def on_every_rank(flag: bool, world: int, device) -> bool:
    """True when the flag is True on every rank (so all ranks skip a step, or stop, together)."""
    if world == 1:
        return flag
    t = torch.tensor([0.0 if flag else 1.0], device=device)
    dist.all_reduce(t)
    return t.item() == 0


def global_batch_metrics(outputs: list, tokens: int, env: "Distributed") -> tuple[dict[str, float], int]:
    """This rank's step outputs and tokens -> the step's metrics and tokens pooled over every rank."""
    sums = metric_sums(outputs)
    if env.world > 1:
        names = sorted(sums)
        flat = torch.tensor(
            [x for n in names for x in sums[n]] + [float(tokens)], dtype=torch.float64, device=env.device
        )
        dist.all_reduce(flat)
        values = flat.tolist()
        sums, tokens = {n: (values[2 * i], values[2 * i + 1]) for i, n in enumerate(names)}, int(values[-1])
    return ratios(sums), tokens


class Distributed:
    """torchrun environment (WORLD_SIZE / RANK / LOCAL_RANK) or a single process."""

    def __init__(self) -> None:
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        self.rank = int(os.environ.get("RANK", "0"))
        local = int(os.environ.get("LOCAL_RANK", "0"))
        self.device = torch.device("cuda", local) if torch.cuda.is_available() else torch.device("cpu")
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        if self.world > 1 and not dist.is_initialized():
            dist.init_process_group("nccl" if self.device.type == "cuda" else "gloo")

    @property
    def main(self) -> bool:
        return self.rank == 0

    def barrier(self) -> None:
        if self.world > 1:
            dist.barrier()


class Evaluator:
    """Held-out metrics at fixed anchors, pooled over micro-batches, plus the exact replay tau."""

    def __init__(
        self, joint: JointModel, eval_set: list[Example], turns, cfg: TrainConfig, pad_id: int, autocast, device
    ) -> None:
        self.joint, self.cfg, self.autocast, self.device, self.turns = joint, cfg, autocast, device, turns
        self.batches = [
            collate(eval_set[i : i + cfg.batch_size], pad_id) for i in range(0, len(eval_set), cfg.batch_size)
        ]

    @torch.no_grad()
    def __call__(self, weights) -> dict[str, float]:
        self.joint.eval()
        outputs = []
        with self.autocast:
            for i, batch in enumerate(self.batches):
                batch = {k: v.to(self.device) for k, v in batch.items()}
                seed = self.cfg.seed + i
                outputs.append(forward_at_anchors(self.joint, batch, self.cfg.num_anchors, seed, weights, self.device))
            out = {f"eval/{k}": v for k, v in pooled_metrics(outputs).items()} if outputs else {}
            if self.turns:
                proposer = BlockProposer(self.joint.target, self.joint.drafter, self.joint.head)
                replayer = Replayer(self.joint.target, {"draft": proposer})
                replays = [replayer.turn(p, o)["draft"] for p, o in self.turns]
                out.update({f"eval/tau_t0/{name}": pooled_tau(replays, name) for name in proposer.draft_names})
        self.joint.train()
        return out


@dataclasses.dataclass
class Job:
    """What a run trains, built once (`build_job`): models, optimizer, schedule, data, length (`total`) and identity."""

    cfg: TrainConfig
    env: Distributed
    out_dir: Path
    drafter_cfg: DrafterConfig
    head_cfg: HeadConfig | None
    drafter: DFlashDrafter
    head: Head | None
    joint: JointModel
    optimizer: torch.optim.AdamW
    scheduler: torch.optim.lr_scheduler.LambdaLR
    train_set: list[Example]
    evaluate: Evaluator
    pad_id: int
    per_epoch: int
    total: int
    identity: dict
    skipped: int = 0  # steps skipped for a non-finite loss so far (a resumed run's, from its checkpoint)

    @property
    def metrics_path(self) -> Path:
        return self.out_dir / "metrics.jsonl"

    def trainable(self) -> dict[str, torch.Tensor]:
        return trainable_tensors(self.drafter.state_dict(), None if self.head is None else self.head.state_dict())


def train(cfg: TrainConfig) -> dict[str, float]:
    """Run (or resume) a training job; returns the last logged metrics."""
    from tqdm.auto import tqdm

    cfg.check_paths()
    claim_output_dir(cfg, create=False)  # before anything loads or is written (every rank: they fail alike)
    if cfg.exclude:  # evaluation prompts must not be training data
        check_disjoint(cfg.data, eval_guard(cfg.exclude))
    env = Distributed()
    with sole_writer_of_run(cfg, env):
        check_start_over(cfg)
        torch.manual_seed(cfg.seed)
        job = build_job(cfg, env)
        # about what one checkpoint and snapshot take on disk: float32 masters, two Adam moments, a bf16 copy
        need = sum(t.numel() for t in job.trainable().values()) * (3 * 4 + 2)
        with space_for(job.out_dir, need, "--output-dir"):
            step = start_point(job)
            bar = tqdm(total=job.total, initial=step, disable=not env.main, desc="train", dynamic_ncols=True)
            with contextlib.closing(bar):  # an error line starts a line
                return train_loop(job, step, bar)


@contextlib.contextmanager
def sole_writer_of_run(cfg: TrainConfig, env: Distributed):
    """Rank 0 holds the run folder's lock for the run's life; held elsewhere, every rank stops (HeldError)."""
    with contextlib.ExitStack() as lock:
        refused = None
        if env.main:
            try:
                lock.enter_context(sole_writer(cfg.output_dir, "--output-dir", "run"))
            except HeldError as e:
                refused = e
        if not on_every_rank(refused is None, env.world, env.device):
            raise refused or HeldError(
                f"{cfg.output_dir} is being written by another process", where="--output-dir", fix="see rank 0's error"
            )
        yield


RUN_STATE = ("checkpoints", LATEST, "metrics.jsonl", "snapshots")  # what a run writes into its folder


def run_state(folder: Path) -> list[str]:
    """What of a run's own state a folder holds (a log a driver wrote there before the run is none of it)."""
    return [name for name in RUN_STATE if (folder / name).exists()]


def check_start_over(cfg: TrainConfig) -> None:
    """--no-resume starts only in a folder without a run (else exit 2), unless --move-aside moves it first."""
    out = Path(cfg.output_dir)
    if cfg.resume or cfg.move_aside or not out.is_dir() or not run_state(out):
        return
    raise TrainConfigError(
        f"{out} holds a run ({', '.join(run_state(out))}): --no-resume would mix two runs' steps in one folder",
        where="--no-resume",
        fix=f"add --move-aside to move that run to {aside_name(out)} (nothing is deleted) and start a new one, "
        "or pass a new --output-dir",
    )


def aside_name(out: Path) -> Path:
    """Where --move-aside moves the run in `out`: `OUT.old-N`, the first N free."""
    n = 1
    while out.with_name(f"{out.name}.old-{n}").exists():
        n += 1
    return out.with_name(f"{out.name}.old-{n}")


def build_job(cfg: TrainConfig, env: Distributed) -> Job:
    """The target, the data, a fresh drafter and head, their optimizer and schedule."""
    model, tokenizer = load_target(cfg.target, env.device, cfg.bf16)
    drafter_cfg = drafter_config_for(model, tokenizer, cfg)
    features = len(drafter_cfg.target_layer_ids)
    if cfg.init_from:  # the run records the draft's depth and block (RECORDED_GEOMETRY), what it trains with
        recorded = {option: getattr(drafter_cfg, GEOMETRY_OPTIONS[option]) for option in RECORDED_GEOMETRY}
        cfg = dataclasses.replace(cfg, **recorded)
    if features != cfg.num_context_features:  # the target has fewer layers: the run records what it trains with
        if env.main:
            print(
                f"warning: --num-context-features {cfg.num_context_features}: the target's "
                f"{drafter_cfg.num_target_layers} layers give at most {features}; the run trains with {features} "
                "(and records that).",
                file=sys.stderr,
            )
        cfg = dataclasses.replace(cfg, num_context_features=features)
    head_cfg = cfg.head_config(drafter_cfg.block_size, drafter_cfg.rms_norm_eps, drafter_cfg.hidden_size)
    target = FrozenTarget(model, drafter_cfg.target_layer_ids)
    examples = load_conversations(cfg.data, tokenizer, cfg.max_length, cfg.chat_template_kwargs, write_cache=env.main)
    train_set, eval_set = split_eval(examples, cfg, tokenizer, write_cache=env.main)
    turns = held_out_turns(cfg.eval_data, cfg.eval_examples) if cfg.eval_data else []
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    drafter, head, joint, optimizer = build_models(cfg, drafter_cfg, head_cfg, target, env.device)
    per_epoch = len(epoch_batches(len(train_set), cfg.batch_size * cfg.grad_accum, cfg.seed, 0, env.rank, env.world))
    total = cfg.max_steps if cfg.max_steps > 0 else cfg.epochs * per_epoch
    autocast = torch.autocast(env.device.type, dtype=torch.bfloat16, enabled=cfg.bf16)
    return Job(
        cfg=cfg,
        env=env,
        out_dir=Path(cfg.output_dir),
        drafter_cfg=drafter_cfg,
        head_cfg=head_cfg,
        drafter=drafter,
        head=head,
        joint=joint,
        optimizer=optimizer,
        scheduler=cosine_with_warmup(optimizer, total, cfg.warmup_ratio),
        train_set=train_set,
        evaluate=Evaluator(joint, eval_set, turns, cfg, pad_id, autocast, env.device),
        pad_id=pad_id,
        per_epoch=per_epoch,
        total=total,
        identity=run_identity(cfg),
    )


def start_point(job: Job) -> int:
    """Claim the folder -> the start step: the newest loadable checkpoint's, else 0 (--init-from or fresh)."""
    cfg, env, out_dir = job.cfg, job.env, job.out_dir
    warn = functools.partial(print, file=sys.stderr)
    if env.main:
        if cfg.move_aside and out_dir.is_dir() and run_state(out_dir):
            out_dir.rename(aside := aside_name(out_dir))
            warn(f"moved the run in {out_dir} to {aside} (nothing deleted); a new run starts in {out_dir}")
        claim_output_dir(cfg, create=True)
        if cfg.resume:
            remove_orphans(out_dir)  # what a kill mid-save left behind; the other ranks wait, then read
    env.barrier()
    found = resume_point(out_dir, warn, env.device, cfg.accept_legacy_checkpoints) if cfg.resume else None
    step = 0
    if found is not None:
        step = resume_from(job, *found)
    elif cfg.init_from:
        load_draft_weights(cfg.init_from, job.drafter, job.head, job.drafter_cfg, job.head_cfg)
    if env.main:
        if found is None and cfg.resume and job.metrics_path.is_file() and job.metrics_path.stat().st_size:
            warn(
                f"warning: {out_dir} has logged metrics but no checkpoint yet: the run starts over from step 0 "
                "and logs those steps again."
            )
        trim_metrics(job.metrics_path, step)
    return step


def resume_from(job: Job, path: Path, checkpoint: tuple, opt_state: dict) -> int:
    """Load a checkpoint `resume_point` found -> its step; newer ones set aside, `latest` names this one."""
    state, _, _, tensors = checkpoint
    run = None if job.cfg.resume_with_changes else job.identity
    check_resume_compatible(state, job.drafter_cfg, job.head_cfg, str(path), run, job.cfg.ADDED)
    progress, global_batch = state.get("progress", {}), job.cfg.batch_size * job.cfg.grad_accum * job.env.world
    if progress.get("global_batch", global_batch) != global_batch:  # a step's data and the schedule depend on it
        raise IncompatibleCheckpointError(
            f"its steps took {progress['global_batch']} sequences (ranks x --grad-accum x --batch-size), this run's "
            f"{global_batch}: it would train some data twice or skip some",
            where=str(path),
            fix="resume with ranks x --grad-accum x --batch-size equal to the checkpoint's, or start a new run",
        )
    load_trainable(tensors, job.drafter, job.head, str(path / TENSORS_FILE))
    configured = [(g["initial_lr"], g["weight_decay"]) for g in job.optimizer.param_groups]
    try:
        job.optimizer.load_state_dict(opt_state["optimizer"])
    except ValueError as e:  # --resume-with-changes across --train: other parameter groups
        raise IncompatibleCheckpointError(
            f"its optimizer state does not fit this run's trained parameters ({e})",
            where=str(path),
            fix="resume with the run's own --train, or start a new run (--init-from an export of this one)",
        ) from e
    job.scheduler.load_state_dict(opt_state["scheduler"])
    if job.cfg.resume_with_changes:  # this run's --lr-* and --wd-* take over at the step resumed
        job.scheduler.base_lrs = [lr for lr, _ in configured]
        for group, (lr, wd) in zip(job.optimizer.param_groups, configured):
            group.update(initial_lr=lr, weight_decay=wd, lr=lr * job.scheduler.lr_lambdas[0](job.scheduler.last_epoch))
    step, job.skipped = int(state["step"]), int(progress.get("skipped", 0))
    job.env.barrier()  # every rank has read its checkpoint
    if job.env.main:
        for bad in set_aside_newer(job.out_dir, path):
            print(f"warning: kept the checkpoint that did not load as {bad}", file=sys.stderr)
        point_latest(job.out_dir, path)
        print(f"resumed from {path} at step {step}", file=sys.stderr)
    return step


def train_loop(job: Job, step: int, progress_bar) -> dict[str, float]:
    """Train from `step` to the end: updates, logs, evaluations, snapshots, checkpoints -> the last logged metrics."""
    cfg, env = job.cfg, job.env
    device_ids = [env.device.index] if env.device.type == "cuda" else None
    trainable = DistributedDataParallel(job.joint, device_ids=device_ids) if env.world > 1 else job.joint
    weights = cfg.objective()
    timer = job.joint.timer = PhaseTimer(env.device)
    eval_every = cfg.eval_every or cfg.log_every
    total, per_rank_step = job.total, cfg.batch_size * cfg.grad_accum
    last: dict[str, float] = {}
    tokens, bad, window_start = 0, job.skipped, time.perf_counter()
    order: tuple[int, list[list[int]]] = (-1, [])  # (epoch, this rank's batches of it)
    deadline = time.time() + 60 * cfg.max_minutes if cfg.max_minutes > 0 else None
    while step < total:
        epoch, index = divmod(step, job.per_epoch)
        if order[0] != epoch:
            order = (epoch, epoch_batches(len(job.train_set), per_rank_step, cfg.seed, epoch, env.rank, env.world))
        trainable.train()
        job.optimizer.zero_grad(set_to_none=True)
        timer.start_step()
        finite, outputs, step_tokens = accumulate_gradients(job, trainable, order[1][index], step, weights, timer)
        tokens += step_tokens
        grad_norm = torch.nn.utils.clip_grad_norm_(job.joint.parameters(), cfg.grad_clip)
        bad = update_or_skip(job, finite and bool(torch.isfinite(grad_norm)), bad, step)
        job.scheduler.step()
        timer.mark("optimizer")
        step += 1
        progress_bar.update(1)
        if deadline is not None and not on_every_rank(time.time() < deadline, env.world, env.device):
            total = step  # the time budget ends the run here: last log, eval, snapshot and checkpoint
            if env.main:
                print(f"stopping at step {step}: --max-minutes {cfg.max_minutes} reached.", file=sys.stderr)

        evaluating = step % eval_every == 0 or step == total
        if step % cfg.log_every == 0 or evaluating:
            elapsed, steps_in_window = time.perf_counter() - window_start, timer.steps
            step_metrics, tokens = global_batch_metrics(outputs, tokens, env)
            last = {
                "step": step,
                "total_steps": total,
                "epoch": epoch,
                "grad_norm": float(grad_norm),
                "tokens_per_s": tokens / max(elapsed, 1e-9),
                "skipped_steps": bad,
                "time/wall_ms": 1e3 * elapsed / max(steps_in_window, 1),
                **timer.window(),
            }
            last.update({f"lr/{g['name']}": g["lr"] for g in job.optimizer.param_groups})
            last.update(step_metrics)
            if evaluating:  # the held-out metrics (and the time they took); rank 0 keeps the weights as a snapshot
                t_eval = time.perf_counter()
                last.update(job.evaluate(weights))
                last["time/eval_s"] = time.perf_counter() - t_eval
                if env.main:
                    save_snapshot(job.out_dir, step, job.trainable())
            if env.main:
                progress_bar.set_postfix(
                    {"loss": f"{last['loss/total']:.3f}", "tau": f"{last['accept_len/draft_argmax']:.2f}"}
                )
                log_row(job.metrics_path, last)
            tokens, window_start = 0, time.perf_counter()

        if step % cfg.save_every == 0 or step == total:
            progress = {"epoch": epoch, "batch": index + 1, "skipped": bad, "global_batch": per_rank_step * env.world}
            save_checkpoint(job, step, progress)
    return last


def accumulate_gradients(job: Job, trainable, ids: list[int], step: int, weights, timer) -> tuple[bool, list, int]:
    """Forward and backward of one step's micro-batches -> (every loss finite, their outputs, their tokens)."""
    cfg, env = job.cfg, job.env
    finite, outputs, tokens = True, [], 0
    for micro in range(cfg.grad_accum):
        part = ids[micro :: cfg.grad_accum]  # global micro-batch env.rank + env.world * micro (module docstring)
        batch = {k: v.to(env.device) for k, v in collate([job.train_set[i] for i in part], job.pad_id).items()}
        seed = cfg.seed * 7919 + (step * cfg.grad_accum + micro) * env.world + env.rank
        sync = micro == cfg.grad_accum - 1 or env.world == 1  # DDP reduces gradients on the last micro-step only
        with contextlib.nullcontext() if sync else trainable.no_sync():
            with job.evaluate.autocast:
                out = forward_at_anchors(trainable, batch, cfg.num_anchors, seed, weights, env.device)
            (out.terms.total / cfg.grad_accum).backward()
        timer.mark("backward")
        finite &= bool(torch.isfinite(out.terms.total.detach()))
        tokens += int(batch["attention_mask"].sum())
        outputs.append(out)
    return finite, outputs, tokens


def update_or_skip(job: Job, finite: bool, bad: int, step: int) -> int:
    """Step when loss and gradient are finite on every rank, else skip -> skips so far (TrainingDiverged at max)."""
    cfg = job.cfg
    if on_every_rank(finite, job.env.world, job.env.device):
        job.optimizer.step()
        return bad
    bad += 1
    job.optimizer.zero_grad(set_to_none=True)
    if job.env.main:
        print(
            f"warning: step {step + 1}: non-finite loss or gradient, "
            f"step skipped ({bad} of at most {cfg.max_bad_steps}).",
            file=sys.stderr,
        )
    if bad >= cfg.max_bad_steps:
        raise TrainingDiverged(
            f"{bad} steps with a non-finite loss or gradient (last at step {step + 1}); "
            f"the last good checkpoint is kept in {job.out_dir}. "
            f"Lower --lr-drafter / --lr-head (now {cfg.lr_drafter} / {cfg.lr_head}) or check the data."
        )
    return bad


def log_row(path: Path, row: dict[str, float]) -> None:
    """One metrics row appended (NaN written as null)."""
    with path.open("a") as f:
        f.write(json.dumps({k: None if v != v else v for k, v in row.items()}) + "\n")


def save_checkpoint(job: Job, step: int, progress: dict[str, int]) -> None:
    """Rank 0 writes the step's checkpoint and prunes the oldest; every rank waits for it."""
    if job.env.main:
        opt = {"optimizer": job.optimizer.state_dict(), "scheduler": job.scheduler.state_dict()}
        save_training_checkpoint(
            job.out_dir, step, progress, job.drafter_cfg, job.head_cfg, job.trainable(), opt, job.identity
        )
        prune_checkpoints(job.out_dir, job.cfg.keep_checkpoints)
    job.env.barrier()
