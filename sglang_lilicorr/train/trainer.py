"""`lilicorr train`: joint training of the DFlash drafter and the LiLiCorr head (paper Sec. 3.4,
Table hparams), one GPU or data-parallel under torchrun (DDP, same code path; gloo on CPU).

Optimisation: AdamW with two groups (drafter lr 6e-4 wd 0; head lr 1.5e-4 wd 0.01), cosine
schedule with 4% linear warm-up, gradient-norm clip 1.0, bf16 autocast over fp32 master
weights. gamma = 0 trains plain DFlash (no head is built and the export is a vanilla draft).
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from ..checkpoint import split_head
from ..config import LiLiCorrConfig
from ..drafter import DFlashDrafter, DrafterConfig, default_target_layer_ids, load_drafter_tensors, sample_anchors
from ..head import LiLiCorrHead
from ..losses import ObjectiveWeights
from .data import DataError, Example, collate, epoch_batches, load_conversations
from .joint import JointModel
from .state import (
    OPTIMIZER_FILE,
    check_resume_compatible,
    latest_checkpoint,
    read_training_checkpoint,
    save_training_checkpoint,
    trainable_tensors,
)
from ..frozen_target import FrozenTarget


@dataclasses.dataclass
class TrainConfig:
    target: str  # HF model directory (frozen target + its tokenizer)
    data: str  # training conversations jsonl (from `lilicorr regenerate`)
    output_dir: str
    eval_data: str | None = None  # held-out conversations; default: hold out eval_examples of data
    eval_examples: int = 8  # held-out conversations (taken from data when eval_data is unset); one eval batch
    # drafter geometry
    draft_layers: int = 1
    num_context_features: int = 5
    block_size: int = 16
    mask_token: str | None = None  # default: the tokenizer's mask token
    draft_intermediate_size: int = 0  # 0 = the target's
    # head geometry (paper defaults); gamma = 0 builds none
    candidate_topk: int = 8
    head_hidden_size: int = 1024
    head_layers: int = 2
    head_heads: int = 8
    head_mlp_ratio: float = 2.0
    factor_dim: int = 1024
    logit_scale: float = 8.0
    # objective (Eq. 7; App. G margin)
    beta: float = 7.0
    gamma: float = 0.25
    lam: float = 1.0
    use_margin: bool = False
    mu: float = 0.5
    rho: float = 2.0
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
    batch_size: int = 1  # per rank
    max_length: int = 3072
    num_anchors: int = 64  # blocks per sequence
    seed: int = 0
    log_every: int = 10
    save_every: int = 500
    resume: bool = True
    chat_template_kwargs: dict[str, Any] = dataclasses.field(default_factory=lambda: {"enable_thinking": False})

    def objective(self) -> ObjectiveWeights:
        return ObjectiveWeights(beta=self.beta, gamma=self.gamma, lam=self.lam, use_margin=self.use_margin, mu=self.mu, rho=self.rho)


# --- building blocks ---------------------------------------------------------------------


def resolve_mask_token(tokenizer, name: str | None, vocab_size: int) -> tuple[str, int]:
    name = name or getattr(tokenizer, "mask_token", None)
    if not name:
        raise DataError("the tokenizer has no mask token: pass --mask-token with an existing special token (SmolLM2: <empty_output>).")
    token_id = tokenizer.convert_tokens_to_ids(name)
    if token_id is None or token_id == getattr(tokenizer, "unk_token_id", None) or not 0 <= token_id < vocab_size:
        raise DataError(f"mask token {name!r} is not a single token of the target vocabulary ({vocab_size}); pick one that is.")
    return name, int(token_id)


def drafter_config_for(model, tokenizer, cfg: TrainConfig) -> DrafterConfig:
    """Drafter geometry from the target's config (width, heads, rope) and the run's options."""
    tc = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    n_layers = int(tc.num_hidden_layers)
    hidden = int(tc.hidden_size)
    heads = int(tc.num_attention_heads)
    rope = getattr(tc, "rope_parameters", None) or {}
    theta = float(rope.get("rope_theta", getattr(tc, "rope_theta", 1_000_000.0)))
    mask_name, mask_id = resolve_mask_token(tokenizer, cfg.mask_token, model.get_output_embeddings().weight.shape[0])
    features = min(cfg.num_context_features, max(1, n_layers - 3))
    return DrafterConfig(
        hidden_size=hidden,
        vocab_size=int(model.get_output_embeddings().weight.shape[0]),
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
        rope_theta=theta,
        rms_norm_eps=float(getattr(tc, "rms_norm_eps", 1e-6)),
        max_position_embeddings=int(getattr(tc, "max_position_embeddings", 32768)),
    )


def head_config_for(drafter: DrafterConfig, cfg: TrainConfig) -> LiLiCorrConfig | None:
    if cfg.gamma == 0:
        return None
    return LiLiCorrConfig(
        block_size=drafter.block_size, candidate_topk=cfg.candidate_topk, factor_dim=cfg.factor_dim,
        logit_scale=cfg.logit_scale, num_layers=cfg.head_layers, hidden_size=cfg.head_hidden_size,
        num_heads=cfg.head_heads, mlp_ratio=cfg.head_mlp_ratio, rms_norm_eps=drafter.rms_norm_eps,
    )


def build_optimizer(drafter: DFlashDrafter, head: LiLiCorrHead | None, cfg: TrainConfig) -> torch.optim.AdamW:
    groups = [{"params": list(drafter.parameters()), "lr": cfg.lr_drafter, "weight_decay": cfg.wd_drafter, "name": "drafter"}]
    if head is not None:
        groups.append({"params": list(head.parameters()), "lr": cfg.lr_head, "weight_decay": cfg.wd_head, "name": "head"})
    return torch.optim.AdamW(groups)


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
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device)
    tokenizer = AutoTokenizer.from_pretrained(path)
    return model, tokenizer


def split_eval(examples: list[Example], cfg: TrainConfig, tokenizer) -> tuple[list[Example], list[Example]]:
    if cfg.eval_data:
        held = load_conversations(cfg.eval_data, tokenizer, cfg.max_length, cfg.chat_template_kwargs)
        seen = {tuple(e.input_ids.tolist()) for e in examples}
        if any(tuple(e.input_ids.tolist()) in seen for e in held):
            raise DataError(f"{cfg.eval_data}: evaluation conversations also occur in {cfg.data}; held-out data must not be training data.")
        return examples, held
    n = min(cfg.eval_examples, len(examples) - 1)
    if n <= 0:
        return examples, []
    return examples[:-n], examples[-n:]


def anchors_for(batch: dict[str, torch.Tensor], num: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    anchors, valid = sample_anchors(batch["loss_mask"], num, torch.Generator().manual_seed(seed))
    return anchors, valid


# --- the loop ------------------------------------------------------------------------------


class Distributed:
    """torchrun environment (WORLD_SIZE / RANK / LOCAL_RANK) or a single process."""

    def __init__(self) -> None:
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        self.rank = int(os.environ.get("RANK", "0"))
        local = int(os.environ.get("LOCAL_RANK", "0"))
        if torch.cuda.is_available():
            self.device = torch.device("cuda", local)
            torch.cuda.set_device(self.device)
        else:
            self.device = torch.device("cpu")
        if self.world > 1 and not dist.is_initialized():
            dist.init_process_group("nccl" if self.device.type == "cuda" else "gloo")

    @property
    def main(self) -> bool:
        return self.rank == 0

    def barrier(self) -> None:
        if self.world > 1:
            dist.barrier()


def train(cfg: TrainConfig) -> dict[str, float]:
    """Run (or resume) a training job; returns the last logged metrics."""
    env = Distributed()
    torch.manual_seed(cfg.seed)
    model, tokenizer = load_target(cfg.target, env.device, cfg.bf16)
    drafter_cfg = drafter_config_for(model, tokenizer, cfg)
    head_cfg = head_config_for(drafter_cfg, cfg)
    target = FrozenTarget(model, drafter_cfg.target_layer_ids)
    examples = load_conversations(cfg.data, tokenizer, cfg.max_length, cfg.chat_template_kwargs)
    train_set, eval_set = split_eval(examples, cfg, tokenizer)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0

    drafter = DFlashDrafter(drafter_cfg).to(env.device)
    head = None if head_cfg is None else LiLiCorrHead(head_cfg, drafter_cfg.hidden_size).to(env.device)
    joint = JointModel(drafter, head, target)
    optimizer = build_optimizer(drafter, head, cfg)
    per_epoch = len(epoch_batches(len(train_set), cfg.batch_size, cfg.seed, 0, env.rank, env.world))
    total = cfg.max_steps if cfg.max_steps > 0 else cfg.epochs * per_epoch
    scheduler = cosine_with_warmup(optimizer, total, cfg.warmup_ratio)
    step = 0

    resume_from = latest_checkpoint(cfg.output_dir) if cfg.resume else None
    if resume_from is not None:
        state, _, _, tensors = read_training_checkpoint(resume_from)
        check_resume_compatible(state, drafter_cfg, head_cfg, str(resume_from))
        drafter_t, head_t = split_head(tensors)
        load_drafter_tensors(drafter, drafter_t, str(resume_from))
        if head is not None:
            head.load_state_dict(head_t, strict=True)
        opt_state = torch.load(resume_from / OPTIMIZER_FILE, map_location=env.device, weights_only=True)
        optimizer.load_state_dict(opt_state["optimizer"])
        scheduler.load_state_dict(opt_state["scheduler"])
        step = int(state["step"])

    trainable = DistributedDataParallel(joint, device_ids=[env.device.index] if env.device.type == "cuda" else None) if env.world > 1 else joint
    weights = cfg.objective()
    eval_batch = collate(eval_set[: cfg.eval_examples], pad_id) if eval_set else None
    metrics_path = Path(cfg.output_dir) / "metrics.jsonl"
    if env.main:
        Path(cfg.output_dir).mkdir(parents=True, exist_ok=True)
    progress_bar = _progress(total, step, env.main)
    last: dict[str, float] = {}
    tokens, window_start = 0, time.perf_counter()
    autocast = torch.autocast(env.device.type, dtype=torch.bfloat16, enabled=cfg.bf16)

    order: tuple[int, list[list[int]]] = (-1, [])  # (epoch, this rank's batches of it)
    while step < total:
        epoch, index = divmod(step, per_epoch)
        if order[0] != epoch:
            order = (epoch, epoch_batches(len(train_set), cfg.batch_size, cfg.seed, epoch, env.rank, env.world))
        batch_ids = order[1][index]
        batch = {k: v.to(env.device) for k, v in collate([train_set[i] for i in batch_ids], pad_id).items()}
        anchors, valid = anchors_for(batch, cfg.num_anchors, cfg.seed * 7919 + step * env.world + env.rank)
        trainable.train()
        with autocast:
            out = trainable(batch["input_ids"], batch["attention_mask"], batch["loss_mask"], anchors.to(env.device), valid.to(env.device), weights)
        optimizer.zero_grad(set_to_none=True)
        out.terms.total.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(joint.parameters(), cfg.grad_clip)
        optimizer.step()
        scheduler.step()
        step += 1
        tokens += int(batch["attention_mask"].sum()) * env.world
        progress_bar.update(1)

        if step % cfg.log_every == 0 or step == total:
            elapsed = time.perf_counter() - window_start
            last = {"step": step, "epoch": epoch, "grad_norm": float(grad_norm), "tokens_per_s": tokens / max(elapsed, 1e-9)}
            last.update({f"lr/{g['name']}": g["lr"] for g in optimizer.param_groups})
            last.update(out.metrics())
            if eval_batch is not None:
                last.update(evaluate(joint, eval_batch, cfg, weights, autocast, env.device))
            if env.main:
                progress_bar.set_postfix({"loss": f"{last['loss/total']:.3f}", "tau": f"{last['accept_len/draft_argmax']:.2f}"})
                with metrics_path.open("a") as f:
                    f.write(json.dumps({k: None if v != v else v for k, v in last.items()}) + "\n")  # NaN -> null
            tokens, window_start = 0, time.perf_counter()

        if step % cfg.save_every == 0 or step == total:
            if env.main:
                save_training_checkpoint(
                    cfg.output_dir, step, {"epoch": epoch, "batch": index + 1}, drafter_cfg, head_cfg,
                    trainable_tensors(drafter.state_dict(), None if head is None else head.state_dict()),
                    {"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict()},
                )
            env.barrier()
    progress_bar.close()
    return last


@torch.no_grad()
def evaluate(joint: JointModel, batch: dict[str, torch.Tensor], cfg: TrainConfig, weights, autocast, device) -> dict[str, float]:
    """Held-out metrics with fixed anchors: acceptance length of argmax vs LiLiCorr walk, losses."""
    joint.eval()
    batch = {k: v.to(device) for k, v in batch.items()}
    anchors, valid = anchors_for(batch, cfg.num_anchors, cfg.seed)
    with autocast:
        out = joint(batch["input_ids"], batch["attention_mask"], batch["loss_mask"], anchors.to(device), valid.to(device), weights)
    return {f"eval/{k}": v for k, v in out.metrics().items()}


def _progress(total: int, start: int, enabled: bool):
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=start, disable=not enabled, desc="train", dynamic_ncols=True)
