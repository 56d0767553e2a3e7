"""Joint training on CPU: tiny random Llama / Qwen3 targets, drafter + LiLiCorr head, export, reload."""

import json
import math

import pytest
import torch

from sglang_lilicorr.checkpoint import CheckpointError
from sglang_lilicorr.errors import UsageError
from sglang_lilicorr.drafter import DFlashDrafter, sample_anchors
from sglang_lilicorr.head import LiLiCorrHead
from sglang_lilicorr.train.data import DataError, collate, load_conversations, tokenize_conversation
from sglang_lilicorr.drafter import load_draft
from sglang_lilicorr.train.export import export_checkpoint
from sglang_lilicorr.train.joint import JointModel, acceptance_length
from sglang_lilicorr.train.state import IncompatibleCheckpointError
from sglang_lilicorr.frozen_target import FrozenTarget, TargetMismatchError
from sglang_lilicorr.train.config import TrainConfig
from sglang_lilicorr.train.trainer import drafter_config_for, train


WORDS = "the cat sat on a mat and one two three four five six seven dog ran far".split()


def make_tokenizer(mask_token="<|mask|>"):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<|pad|>", "<|eos|>", mask_token],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([" ".join(WORDS)] * 5, trainer)
    out = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|eos|>", pad_token="<|pad|>", mask_token=mask_token)
    out.chat_template = (
        "{% for m in messages %}[{{ m.role }}]{{ m.content }}<|eos|>{% endfor %}"
        "{% if add_generation_prompt %}[assistant]{% endif %}"
    )
    return out


def make_target(directory, arch="llama", seed=0, mask_token="<|mask|>", extra_rows=0):
    """A tiny target and its tokenizer in `directory`; `extra_rows`: embedding rows past the tokenizer's tokens."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

    tok = make_tokenizer(mask_token)
    cls, cfg_cls = {"llama": (LlamaForCausalLM, LlamaConfig), "qwen3": (Qwen3ForCausalLM, Qwen3Config)}[arch]
    cfg = cfg_cls(
        vocab_size=len(tok) + extra_rows,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=6,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        tie_word_embeddings=False,
        initializer_range=0.3,
    )  # a peaked LM head: learnable in a few steps
    torch.manual_seed(seed)
    cls(cfg).save_pretrained(directory)
    tok.save_pretrained(directory)
    return str(directory)


def write_conversations(path, n, seed=0):
    """Repetitive assistant turns (learnable within a few steps)."""
    rng = torch.Generator().manual_seed(seed)
    with open(path, "w") as f:
        for i in range(n):
            start = int(torch.randint(0, len(WORDS), (1,), generator=rng))
            reply = " ".join(WORDS[(start + j) % len(WORDS)] for j in range(12))
            f.write(
                json.dumps(
                    {
                        "id": i,
                        "messages": [
                            {"role": "user", "content": f"count {i}"},
                            {"role": "assistant", "content": reply},
                        ],
                    }
                )
                + "\n"
            )
    return str(path)


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    root = tmp_path_factory.mktemp("train")
    return {
        "llama": make_target(root / "llama", "llama"),
        "qwen3": make_target(root / "qwen3", "qwen3", seed=1),
        "data": write_conversations(root / "train.jsonl", 10),
        "root": root,
    }


# the tiny runs' geometry and options as TrainConfig fields (test_train_ddp overrides a few)
TINY = dict(
    eval_examples=2,
    block_size=4,
    candidate_topk=4,
    head_hidden_size=32,
    head_layers=1,
    head_heads=4,
    factor_dim=16,
    bf16=False,
    max_steps=4,
    batch_size=2,
    num_anchors=6,
    log_every=2,
    save_every=2,
    max_length=64,
)
# the tiny head as `lilicorr train` flags (4 anchors), and with it the tiny run's other flags
TINY_HEAD_FLAGS = [
    "--no-bf16",
    "--head-hidden-size",
    "32",
    "--head-layers",
    "1",
    "--head-heads",
    "4",
    "--factor-dim",
    "16",
    "--num-anchors",
    "4",
]
TINY_FLAGS = [
    *TINY_HEAD_FLAGS,
    "--block-size",
    "4",
    "--candidate-topk",
    "4",
    "--batch-size",
    "2",
    "--max-length",
    "64",
    "--eval-examples",
    "2",
    "--chat-template-kwargs",
    "{}",
]


def tiny_cfg(workspace, out, **kw):
    return TrainConfig(
        **{**TINY, "target": workspace["llama"], "data": workspace["data"], "output_dir": str(out), **kw}
    )


def train_argv(target, data, out, *extra) -> list[str]:
    """`lilicorr train` of a tiny run (TINY_FLAGS, then `extra`: a flag repeated there wins)."""
    return ["train", "--target", str(target), "--data", str(data), "--output-dir", str(out), *TINY_FLAGS, *extra]


def recipe_argv(target, out, exclude, magpie, package=0, heldout=0, max_new_tokens=2) -> list[str]:
    """`lilicorr regenerate --recipe` of a small data set on the transformers engine."""
    return [
        "regenerate",
        "--target",
        str(target),
        "--recipe",
        "--output-dir",
        str(out),
        "--exclude",
        str(exclude),
        "--magpie",
        str(magpie),
        "--package",
        str(package),
        "--heldout",
        str(heldout),
        "--max-new-tokens",
        str(max_new_tokens),
        "--engine",
        "transformers",
    ]


def build_joint(workspace, arch, gamma=0.25):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(workspace[arch])
    tok = AutoTokenizer.from_pretrained(workspace[arch])
    cfg = tiny_cfg(workspace, workspace["root"] / "unused", target=workspace[arch], gamma=gamma)
    dcfg = drafter_config_for(model, tok, cfg)
    hcfg = cfg.head_config(dcfg.block_size, dcfg.rms_norm_eps)
    torch.manual_seed(0)
    head = None if hcfg is None else LiLiCorrHead(hcfg, dcfg.hidden_size)
    joint = JointModel(DFlashDrafter(dcfg), head, FrozenTarget(model, dcfg.target_layer_ids))
    batch = collate(load_conversations(workspace["data"], tok, 64, {})[:4], tok.pad_token_id)
    anchors, valid = sample_anchors(batch["loss_mask"], 6, torch.Generator().manual_seed(0))
    return joint, batch, anchors, valid, cfg.objective()


def run(joint, batch, anchors, valid, weights):
    return joint(batch["input_ids"], batch["attention_mask"], batch["loss_mask"], anchors, valid, weights)


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_joint_training_loss_falls_and_reranker_gradient_reaches_drafter(workspace, arch):
    joint, batch, anchors, valid, weights = build_joint(workspace, arch)
    assert joint.drafter.config.target_layer_ids == (1, 2, 3)  # build_target_layer_ids(6, 3)
    opt = torch.optim.AdamW(joint.parameters(), lr=1e-2)
    losses = []
    for _ in range(16):
        out = run(joint, batch, anchors, valid, weights)
        opt.zero_grad()
        out.terms.total.backward()
        opt.step()
        losses.append(float(out.terms.total.detach()))
    assert all(math.isfinite(v) for v in losses)
    assert losses[-1] < 0.8 * losses[0]
    m = out.metrics()
    assert {
        "loss/dflash",
        "loss/ce",
        "loss/dist",
        "coverage/mean_prefix_len",
        "top1_draft/slot1",
        "accept_len/draft_argmax",
        "accept_len/lilicorr_walk",
    } <= set(m)
    assert m["accept_len/draft_argmax"] >= 1.0

    # the reranker terms alone move the drafter (through candidate log-probs and slot hidden states)
    out = run(joint, batch, anchors, valid, weights)
    assert int(out.terms.prefix.sum()) > 0
    joint.zero_grad()
    (out.terms.ce + out.terms.dist).backward()
    for name in ("fc.weight", "layers.0.mlp.down_proj.weight", "layers.0.self_attn.q_proj.weight"):
        grad = dict(joint.drafter.named_parameters())[name].grad
        assert grad is not None and float(grad.abs().sum()) > 0, name
    assert joint.target.embedding.weight.grad is None  # frozen target
    assert not any(p.requires_grad for p in joint.target.model.parameters())


def test_batches_are_padded_to_a_length_multiple_that_changes_no_loss_or_gradient(workspace):
    """collate rounds T up to LENGTH_MULTIPLE (few shapes: cuDNN attention plans are built per shape); the masked
    padding leaves every loss term and gradient as it is without it."""
    from sglang_lilicorr.train.data import LENGTH_MULTIPLE

    joint, batch, anchors, valid, weights = build_joint(workspace, "llama")
    longest = int(batch["attention_mask"].sum(1).max())
    assert batch["input_ids"].shape[1] == -(-longest // LENGTH_MULTIPLE) * LENGTH_MULTIPLE > longest
    tight = {k: v[:, :longest] for k, v in batch.items()}
    results = []
    for b in (batch, tight):
        joint.zero_grad()
        out = run(joint, b, anchors, valid, weights)
        out.terms.total.backward()
        results.append((out.terms, {n: p.grad.clone() for n, p in joint.named_parameters() if p.grad is not None}))
    (padded, g_padded), (unpadded, g_unpadded) = results
    for term in ("total", "dflash", "ce", "dist"):
        torch.testing.assert_close(getattr(padded, term), getattr(unpadded, term), rtol=1e-5, atol=1e-6)
    assert g_padded.keys() == g_unpadded.keys() and g_padded
    for name in g_padded:
        torch.testing.assert_close(g_padded[name], g_unpadded[name], rtol=1e-4, atol=1e-6, msg=name)


def test_gamma_zero_is_plain_dflash(workspace):
    joint, batch, anchors, valid, weights = build_joint(workspace, "llama", gamma=0.0)
    assert joint.head is None
    out = run(joint, batch, anchors, valid, weights)
    assert out.terms.ce is None and torch.equal(out.terms.total, out.terms.dflash) and out.accept_walk is None


def test_acceptance_length_counts_leading_matches():
    drafted = torch.tensor([[1, 2, 3], [1, 9, 3], [7, 2, 3], [1, 2, 3]])
    greedy = torch.tensor([[1, 2, 3], [1, 2, 3], [1, 2, 3], [1, 2, 3]])
    valid = torch.tensor([[True] * 3] * 3 + [[True, True, False]])
    assert acceptance_length(drafted, greedy, valid).tolist() == [4, 2, 1, 3]


def test_train_export_reload_and_sglang_accepts(workspace, tmp_path):
    pytest.importorskip("sglang")
    from sglang.srt.speculative.dflash_utils import parse_dflash_draft_config
    from sglang.srt.speculative.lilicorr_utils import parse_lilicorr_draft_config

    metrics = train(tiny_cfg(workspace, tmp_path / "run"))
    assert metrics["step"] == 4 and metrics["tokens_per_s"] > 0 and "eval/accept_len/lilicorr_walk" in metrics
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 2 and all(json.loads(line)["step"] for line in lines)

    draft = export_checkpoint(tmp_path / "run", tmp_path / "draft")
    drafter, head = load_draft(draft)
    assert head is not None and drafter.fc.weight.dtype == torch.bfloat16
    config = json.loads((draft / "config.json").read_text())
    assert config["architectures"] == ["LiLiCorrDraftModel"]
    parsed = parse_dflash_draft_config(draft_hf_config=config)
    assert parsed.block_size == 4 and parsed.target_layer_ids == [1, 2, 3] and parsed.mask_token == "<|mask|>"
    assert parse_lilicorr_draft_config(draft_hf_config=config).candidate_topk == 4

    train(tiny_cfg(workspace, tmp_path / "vanilla", gamma=0.0, max_steps=2))
    vanilla = export_checkpoint(tmp_path / "vanilla", tmp_path / "vanilla_draft")
    assert load_draft(vanilla)[1] is None
    config = json.loads((vanilla / "config.json").read_text())
    assert config["architectures"] == ["DFlashDraftModel"] and not any(
        k.startswith("lilicorr_") for k in config["dflash_config"]
    )
    parse_dflash_draft_config(draft_hf_config=config)


def test_resume_continues_and_refuses_incompatible(workspace, tmp_path, capsys):
    out = tmp_path / "run"
    train(tiny_cfg(workspace, out, max_steps=2))
    capsys.readouterr()
    metrics = train(tiny_cfg(workspace, out, max_steps=4))
    assert metrics["step"] == 4 and (out / "latest").read_text().strip() == "step-00000004"
    assert f"resumed from {out / 'checkpoints' / 'step-00000002'} at step 2" in capsys.readouterr().err
    with pytest.raises(IncompatibleCheckpointError, match="num_hidden_layers"):
        train(tiny_cfg(workspace, out, max_steps=6, draft_layers=2))
    with pytest.raises(IncompatibleCheckpointError, match="head differs"):
        train(tiny_cfg(workspace, out, max_steps=6, gamma=0.0))


def test_a_resume_keeps_the_global_batch_takes_new_rates_with_changes_and_counts_skips_on(workspace, tmp_path):
    """A resume must take as many sequences a step as the checkpoint's steps (else data trains twice or is skipped),
    even with --resume-with-changes; that flag's new --lr-* / --wd-* take over; the skipped steps count on."""
    from sglang_lilicorr.train.state import OPTIMIZER_FILE, STATE_FILE

    out = tmp_path / "run"
    train(tiny_cfg(workspace, out, max_steps=2, lr_drafter=1e-3, wd_drafter=0.0))
    with pytest.raises(IncompatibleCheckpointError, match="took 2 sequences .*this run's 4"):
        train(tiny_cfg(workspace, out, max_steps=4, grad_accum=2, resume_with_changes=True))
    state_path = out / "checkpoints" / "step-00000002" / STATE_FILE
    state = json.loads(state_path.read_text())
    state["progress"]["skipped"] = 3
    state_path.write_text(json.dumps(state))
    changed = dict(lr_drafter=1e-6, wd_drafter=0.25, resume_with_changes=True)
    metrics = train(tiny_cfg(workspace, out, max_steps=4, batch_size=1, grad_accum=2, **changed))  # 2 a step too
    assert metrics["step"] == 4 and metrics["skipped_steps"] == 3
    saved = torch.load(out / "checkpoints" / "step-00000004" / OPTIMIZER_FILE, weights_only=False)
    drafter = next(g for g in saved["optimizer"]["param_groups"] if g["name"] == "drafter")
    assert (drafter["initial_lr"], drafter["weight_decay"]) == (1e-6, 0.25) and drafter["lr"] <= 1e-6
    assert saved["scheduler"]["base_lrs"][0] == 1e-6


def test_init_from_an_export_starts_from_its_weights_and_refuses_another_geometry(workspace, tmp_path):
    """--init-from DRAFT: step 0 holds the draft's weights (bf16 export -> fp32 masters), the step count
    and optimizer start fresh; a draft of another geometry, or no draft folder, is refused by name."""
    from sglang_lilicorr.checkpoint import read_tensors
    from sglang_lilicorr.train.config import TrainConfigError
    from sglang_lilicorr.train.state import read_training_checkpoint

    train(tiny_cfg(workspace, tmp_path / "first", max_steps=3))
    draft = export_checkpoint(tmp_path / "first", tmp_path / "draft")
    exported = read_tensors(draft)
    metrics = train(
        tiny_cfg(
            workspace,
            tmp_path / "second",
            max_steps=1,
            init_from=str(draft),
            lr_drafter=1e-12,
            lr_head=1e-12,
            warmup_ratio=0.0,
        )
    )
    assert metrics["step"] == 1
    _, _, _, tensors = read_training_checkpoint(tmp_path / "second")
    assert tensors.keys() == exported.keys()
    for name, value in exported.items():  # one step at lr 1e-12 moves nothing a bf16 rounding shows
        assert torch.equal(tensors[name].to(torch.bfloat16), value), name
    yarn = train(
        tiny_cfg(workspace, tmp_path / "yarn", max_steps=1, init_from=str(draft), rope_scaling="yarn", rope_factor=2.0)
    )
    assert yarn["step"] == 1  # a YaRN run starts from a plain-RoPE draft: the rope shapes no tensor
    with pytest.raises(IncompatibleCheckpointError, match="num_hidden_layers.*init-from"):
        train(tiny_cfg(workspace, tmp_path / "third", max_steps=1, init_from=str(draft), draft_layers=2))
    with pytest.raises(IncompatibleCheckpointError, match="head differs.*init-from"):
        train(tiny_cfg(workspace, tmp_path / "third", max_steps=1, init_from=str(draft), gamma=0.0))
    with pytest.raises(TrainConfigError, match="--init-from .*exported draft folder"):
        tiny_cfg(workspace, tmp_path / "third", init_from=str(tmp_path / "first"))


def test_yarn_trains_exports_reloads_and_resumes_only_with_the_same_rope(workspace, tmp_path, capsys):
    """`lilicorr train --rope-scaling yarn` (2 steps) -> export -> the draft reloads with the same YaRN
    rope, written as SGLang reads it; a run with other rope settings does not resume from it."""
    import argparse

    from sglang_lilicorr.drafter import RopeScaling
    from sglang_lilicorr.commands.train import register

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="command", required=True))
    run_dir, draft = tmp_path / "run", tmp_path / "draft"
    args = parser.parse_args(
        train_argv(
            workspace["qwen3"],
            workspace["data"],
            run_dir,
            "--max-steps",
            "2",
            "--rope-scaling",
            "yarn",
            "--rope-factor",
            "4",
        )
    )
    assert args.func(args) == 0
    args = parser.parse_args(["export", str(run_dir), str(draft)])
    assert args.func(args) == 0
    drafter, head = load_draft(draft)
    with open(f"{workspace['qwen3']}/config.json") as f:
        target_positions = json.load(f)["max_position_embeddings"]
    assert drafter.config.rope_scaling == RopeScaling("yarn", 4.0, target_positions)  # default: the target's length
    config = json.loads((draft / "config.json").read_text())
    assert config["rope_parameters"] == {
        "rope_theta": drafter.config.rope_theta,
        "rope_type": "yarn",
        "factor": 4.0,
        "original_max_position_embeddings": target_positions,
    }
    capsys.readouterr()

    base = dict(target=workspace["qwen3"], max_steps=4, max_length=64)
    for rope in (
        dict(),
        dict(rope_scaling="yarn", rope_factor=2.0),
        dict(rope_scaling="yarn", rope_factor=4.0, rope_original_max_position=256),
    ):
        with pytest.raises(IncompatibleCheckpointError, match="rope_scaling"):
            train(tiny_cfg(workspace, run_dir, **base, **rope))
    with pytest.raises(IncompatibleCheckpointError, match="num_anchors"):  # the CLI run's other settings
        train(tiny_cfg(workspace, run_dir, **base, rope_scaling="yarn", rope_factor=4.0))
    assert (
        train(tiny_cfg(workspace, run_dir, **base, rope_scaling="yarn", rope_factor=4.0, resume_with_changes=True))[
            "step"
        ]
        == 4
    )


def test_cli_train_export_and_strict_reload_rejects_tampering(workspace, tmp_path):
    import argparse

    from safetensors.torch import load_file, save_file

    from sglang_lilicorr.commands.train import register

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="command", required=True))
    run_dir, draft = tmp_path / "run", tmp_path / "draft"
    args = parser.parse_args(
        [
            "train",
            "--target",
            workspace["llama"],
            "--data",
            workspace["data"],
            "--output-dir",
            str(run_dir),
            "--max-steps",
            "2",
            *TINY_HEAD_FLAGS,
            "--block-size",
            "4",
            "--candidate-topk",
            "4",
            "--gamma",
            "0.5",
            "--eval-examples",
            "2",
            "--use-margin",
            "--chat-template-kwargs",
            "{}",
        ]
    )
    assert args.gamma == 0.5 and args.use_margin is True and args.bf16 is False and args.max_steps == 2
    assert args.func(args) == 0
    assert "loss/margin" in json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[-1])
    args = parser.parse_args(["export", str(run_dir), str(draft), "--dtype", "float32"])
    assert args.func(args) == 0
    drafter, head = load_draft(draft)
    assert head is not None and drafter.fc.weight.dtype == torch.float32

    tensors = load_file(str(draft / "model.safetensors"))
    del tensors["layers.0.mlp.up_proj.weight"]
    save_file(tensors, str(draft / "model.safetensors"))
    with pytest.raises(CheckpointError, match="up_proj"):
        load_draft(draft)


def test_bad_inputs_are_named(workspace, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(workspace["llama"])
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"messages": [{"role": "user", "content": "hi"}]}\n{"messages": [{"role": "robot"}]}\n')
    with pytest.raises(DataError, match=r"messages\[0\].*bad.jsonl:2"):
        load_conversations(bad, tok, 64, {})
    bad.write_text("not json\n")
    with pytest.raises(DataError, match="not valid JSON.*bad.jsonl:1"):
        load_conversations(bad, tok, 64, {})
    empty = tmp_path / "empty.jsonl"
    empty.write_text('{"messages": [{"role": "user", "content": "no reply"}]}\n')
    with pytest.raises(DataError, match="no usable training conversation"):
        load_conversations(empty, tok, 64, {})

    ids, mask = tokenize_conversation(
        tok, [{"role": "user", "content": "a"}, {"role": "assistant", "content": "the cat"}], {}, "x"
    )
    supervised = tok.decode([i for i, m in zip(ids, mask) if m])
    assert supervised == "the cat<|eos|>"

    model = AutoModelForCausalLM.from_pretrained(workspace["llama"])
    joint, *_ = build_joint(workspace, "llama")
    with pytest.raises(TargetMismatchError, match="hidden size"):
        JointModel(
            DFlashDrafter(joint.drafter.config.__class__(**{**vars(joint.drafter.config), "hidden_size": 48})),
            None,
            FrozenTarget(model, (1, 2, 3)),
        )
    with pytest.raises(TargetMismatchError, match="vocabulary"):
        JointModel(
            DFlashDrafter(joint.drafter.config.__class__(**{**vars(joint.drafter.config), "vocab_size": 400})),
            None,
            FrozenTarget(model, (1, 2, 3)),
        )
    with pytest.raises(ValueError, match="gamma > 0 needs a head"):
        j = JointModel(joint.drafter, None, joint.target)
        _, batch, anchors, valid, weights = build_joint(workspace, "llama")
        run(j, batch, anchors, valid, weights)
    with pytest.raises(UsageError, match="is not a training run or checkpoint"):  # an argument that cannot work: exit 2
        export_checkpoint(tmp_path, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_optimizer_groups_and_cosine_warmup(workspace):
    from sglang_lilicorr.train.trainer import build_optimizer, cosine_with_warmup

    joint, *_ = build_joint(workspace, "llama")
    cfg = TrainConfig(target="t", data="d", output_dir="o")
    opt = build_optimizer(joint.drafter, joint.head, cfg)
    groups = {g["name"]: g for g in opt.param_groups}
    assert (groups["drafter"]["lr"], groups["drafter"]["weight_decay"]) == (6e-4, 0.0)
    assert (groups["head"]["lr"], groups["head"]["weight_decay"]) == (1.5e-4, 0.01)
    assert len(groups["head"]["params"]) == len(list(joint.head.parameters()))
    sched = cosine_with_warmup(opt, total_steps=100, warmup_ratio=0.04)
    lrs = []
    for _ in range(100):
        lrs.append(opt.param_groups[0]["lr"] / 6e-4)
        opt.step()
        sched.step()
    assert lrs[0] == pytest.approx(0.25) and lrs[3] == pytest.approx(1.0)  # 4 warm-up steps
    assert all(a >= b for a, b in zip(lrs[3:], lrs[4:])) and lrs[-1] < 0.01


def test_bf16_autocast_keeps_fp32_masters(workspace):
    joint, batch, anchors, valid, weights = build_joint(workspace, "qwen3")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = run(joint, batch, anchors, valid, weights)
    out.terms.total.backward()
    assert math.isfinite(float(out.terms.total.detach()))
    assert all(p.dtype == torch.float32 and p.grad is not None for p in joint.drafter.parameters())


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_context_features_are_hf_hidden_states_after_each_layer(workspace, arch):
    """SGLang captures the input of layer i + 1 for target_layer_id i: HF hidden_states[i + 1]."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(workspace[arch])
    target = FrozenTarget(model, (1, 3, 2))
    ids = torch.randint(0, target.vocab_size, (2, 9))
    mask = torch.ones_like(ids)
    features, final = target.run(ids, mask)
    ref = model(ids, attention_mask=mask, output_hidden_states=True)
    torch.testing.assert_close(features, torch.cat([ref.hidden_states[i + 1] for i in (1, 3, 2)], dim=-1))
    torch.testing.assert_close(target.logits(final), ref.logits)
    lse, greedy = target.slot_targets(final.reshape(-1, final.shape[-1]), chunk=5)
    torch.testing.assert_close(lse, ref.logits.reshape(-1, ref.logits.shape[-1]).logsumexp(-1))
    assert torch.equal(greedy, ref.logits.reshape(-1, ref.logits.shape[-1]).argmax(-1))
    cand = torch.randint(0, target.vocab_size, (18, 4))
    want = ref.logits.reshape(-1, ref.logits.shape[-1]).log_softmax(-1).gather(1, cand)
    torch.testing.assert_close(target.candidate_log_probs(final.reshape(-1, final.shape[-1]), lse, cand), want)
    with pytest.raises(TargetMismatchError, match="capturable"):
        FrozenTarget(model, (5,))


# --- a run that fails fast and keeps its last good state (issue: nothing lost, nothing silent) ----


@pytest.mark.parametrize(
    "flag,value,match",
    [
        ("lr_drafter", float("nan"), "--lr-drafter nan"),
        ("lr_head", 1e6, "--lr-head 1000000.0"),
        ("batch_size", 0, "--batch-size 0"),
        ("grad_accum", 0, "--grad-accum 0"),
        ("warmup_ratio", 1.5, "--warmup-ratio"),
        ("max_length", 4, "--max-length 4"),
        ("beta", -1.0, "beta"),
        ("rope_scaling", "ntk", "--rope-scaling 'ntk': expected one of default, yarn"),
        ("rope_factor", 4.0, "--rope-factor scales the rope only with --rope-scaling yarn"),
        (
            "rope_original_max_position",
            4096,
            "--rope-original-max-position scales the rope only with --rope-scaling yarn",
        ),
        ("rope_original_max_position", -1, "--rope-original-max-position -1"),
    ],
)
def test_invalid_hyperparameters_are_refused_when_the_config_is_built(flag, value, match):
    from sglang_lilicorr.train.config import TrainConfigError

    with pytest.raises(TrainConfigError, match=match):
        TrainConfig(target="t", data="d", output_dir="o", **{flag: value})


@pytest.mark.parametrize("factor", [1.0, 0.5, float("inf")])
def test_yarn_needs_a_factor_above_one(factor):
    from sglang_lilicorr.train.config import TrainConfigError

    with pytest.raises(TrainConfigError, match=f"--rope-factor {factor}: --rope-scaling yarn needs a factor > 1"):
        TrainConfig(target="t", data="d", output_dir="o", rope_scaling="yarn", rope_factor=factor)


def test_cli_refuses_bad_values_before_loading_anything(workspace, tmp_path, capsys):
    from sglang_lilicorr.cli import main

    base = ["train", "--target", str(tmp_path / "nowhere"), "--data", "d", "--output-dir", str(tmp_path / "o")]
    assert main(base + ["--lr-drafter", "nan"]) == 2
    assert "error: argument --lr-drafter: nan is not a finite number" in capsys.readouterr().err
    assert main(base + ["--lr-drafter", "2"]) == 2
    assert "error: --lr-drafter 2.0 is not a finite learning rate in (0, 1]" in capsys.readouterr().err
    assert main(base) == 2
    assert "is not an existing folder" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_non_finite_steps_are_skipped_then_stop_the_run_without_a_bad_checkpoint(workspace, tmp_path, monkeypatch):
    from safetensors.torch import load_file

    from sglang_lilicorr.train.trainer import TrainingDiverged

    out = tmp_path / "run"
    train(tiny_cfg(workspace, out, max_steps=2))  # a good checkpoint at step 2
    original = JointModel.forward

    def poisoned(self, *args, **kwargs):
        result = original(self, *args, **kwargs)
        result.terms.total = result.terms.total * float("nan")
        return result

    monkeypatch.setattr(JointModel, "forward", poisoned)
    with pytest.raises(TrainingDiverged, match="3 steps with a non-finite loss"):
        train(tiny_cfg(workspace, out, max_steps=8, max_bad_steps=3))
    checkpoints = sorted((out / "checkpoints").iterdir())  # skipped steps leave the weights as they were
    assert checkpoints and all(
        bool(t.isfinite().all()) for c in checkpoints for t in load_file(str(c / "trainable.safetensors")).values()
    )


def test_resume_cleans_orphans_falls_back_past_a_corrupt_checkpoint_and_logs_each_step_once(
    workspace, tmp_path, capsys
):
    out = tmp_path / "run"
    train(tiny_cfg(workspace, out, max_steps=4))  # checkpoints at 2 and 4, both kept
    (out / "checkpoints" / "step-00000004" / "trainable.safetensors").write_bytes(b"\x00" * 10)  # torn by a crash
    orphan = out / "checkpoints" / ".step-00000006.x1y2"
    orphan.mkdir()
    (orphan / "half.bin").write_bytes(b"1")
    metrics = train(tiny_cfg(workspace, out, max_steps=6))
    err = capsys.readouterr().err
    assert (
        "truncated, corrupt" in err
        and "step-00000004/trainable.safetensors)" in err
        and "Falling back to the checkpoint before it" in err
    )
    assert metrics["step"] == 6 and not orphan.exists()
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == [2, 4, 6]


def write_held_out_turns(workspace, path):
    """Two held-out conversations with the target's ids (as `lilicorr regenerate` writes them): the eval replays
    them."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(workspace["llama"])
    with open(path, "w") as f:
        for i, reply in enumerate(["one two three four five six", "the cat sat on a mat and"]):
            messages = [{"role": "user", "content": f"held {i}"}, {"role": "assistant", "content": reply}]
            prompt = tok.apply_chat_template(messages[:1], tokenize=True, return_dict=False, add_generation_prompt=True)
            output = tok.encode(reply, add_special_tokens=False) + [tok.eos_token_id]
            f.write(
                json.dumps(
                    {"id": f"h{i}", "messages": messages, "turns": [{"prompt_ids": prompt, "output_ids": output}]}
                )
                + "\n"
            )
    return path


def test_eval_replays_held_out_turns_snapshots_and_times_the_phases(workspace, tmp_path):
    held = write_held_out_turns(workspace, tmp_path / "held.jsonl")
    out = tmp_path / "run"
    metrics = train(
        tiny_cfg(
            workspace, out, eval_data=str(held), max_steps=4, eval_every=2, log_every=3, grad_accum=2, batch_size=1
        )
    )
    assert metrics["eval/tau_t0/argmax"] >= 1.0 and metrics["eval/tau_t0/lilicorr"] >= 1.0
    assert {f"time/{phase}_ms" for phase in ("target", "drafter", "head", "backward", "optimizer", "wall")} <= set(
        metrics
    )
    assert sorted(p.name for p in (out / "snapshots").iterdir()) == [
        "step-00000002.safetensors",
        "step-00000004.safetensors",
    ]
    logged = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in logged] == [2, 3, 4] and ["eval/tau_t0/argmax" in r for r in logged] == [
        True,
        False,
        True,
    ]


def test_max_minutes_ends_the_run_evaluated_and_checkpointed(workspace, tmp_path):
    out = tmp_path / "run"
    metrics = train(tiny_cfg(workspace, out, max_steps=1000, max_minutes=1e-4, save_every=500, log_every=500))
    assert metrics["step"] == metrics["total_steps"] < 1000 and "eval/loss/total" in metrics
    assert (out / "latest").read_text().strip() == f"step-{metrics['step']:08d}"


def test_conversations_are_cached_and_a_pool_tokenizes_the_same(workspace, tmp_path, monkeypatch):
    from transformers import AutoTokenizer

    from sglang_lilicorr.train import data

    tok = AutoTokenizer.from_pretrained(workspace["llama"])
    path = write_conversations(tmp_path / "c.jsonl", 12)
    serial = load_conversations(path, tok, 64, {})
    assert (tmp_path / "c.jsonl.tokens.pt").is_file()
    monkeypatch.setattr(data, "_encode", lambda item: (_ for _ in ()).throw(AssertionError("tokenized again")))
    cached = load_conversations(path, tok, 64, {})  # from the cache: nothing tokenized
    assert all(
        torch.equal(a.input_ids, b.input_ids) and torch.equal(a.loss_mask, b.loss_mask) for a, b in zip(serial, cached)
    )
    monkeypatch.undo()
    (tmp_path / "c.jsonl.tokens.pt").unlink()
    monkeypatch.setattr(data, "POOL_MIN_ROWS", 4)
    monkeypatch.setattr(data.os, "cpu_count", lambda: 3)
    pooled = load_conversations(path, tok, 64, {})
    assert len(pooled) == len(serial) and all(torch.equal(a.input_ids, b.input_ids) for a, b in zip(serial, pooled))
    assert len(load_conversations(path, tok, 32, {})[0].input_ids) <= 32  # another max_length is another cache key


def test_training_data_that_overlaps_the_evaluation_prompts_is_refused_by_line(workspace, tmp_path):
    evaluation = tmp_path / "eval.jsonl"
    evaluation.write_text(json.dumps({"id": "e", "set": "x", "text": "Count 3"}) + "\n")  # equal once normalised
    with pytest.raises(DataError, match=r"a user turn equals an evaluation prompt.*train.jsonl:4"):
        train(tiny_cfg(workspace, tmp_path / "run", exclude=str(evaluation)))
    assert not (tmp_path / "run").exists()  # refused before anything loads or is written


@pytest.mark.parametrize("head", ["domino", "dspark"])
def test_baseline_heads_train_from_a_dflash_draft_export_and_resume_only_as_themselves(
    workspace, tmp_path, head, capsys
):
    """--head domino / dspark: trained jointly from a plain DFlash export (fresh head), the loss terms logged, the
    free proposal's acceptance measured and replayed; exported as stock SGLang serves it; a resume with another head
    is refused."""
    from sglang_lilicorr.train.heads import load_corrector_draft

    train(tiny_cfg(workspace, tmp_path / "dflash", head="none", max_steps=2))
    init = export_checkpoint(tmp_path / "dflash", tmp_path / "dflash_draft")
    held = write_held_out_turns(workspace, tmp_path / "held.jsonl")
    cfg = tiny_cfg(
        workspace,
        tmp_path / "run",
        head=head,
        corrector_width=16,
        init_from=str(init),
        max_steps=2,
        markov_head_type="rnn",
        eval_data=str(held),
    )
    metrics = train(cfg)
    assert math.isfinite(metrics["loss/ce"]) and metrics[f"accept_len/{head}"] >= 1.0
    assert metrics[f"eval/tau_t0/{head}"] >= 1.0 and metrics["eval/tau_t0/argmax"] >= 1.0
    assert ("loss/confidence" in metrics) == (head == "dspark") and "loss/dist" not in metrics
    draft = export_checkpoint(tmp_path / "run", tmp_path / "draft")
    drafter, module = load_corrector_draft(draft)
    assert module.config.kind == head and drafter.config.block_size == 4
    torch.testing.assert_close(drafter.fc.weight.float(), load_draft(init)[0].fc.weight.float(), rtol=0.1, atol=0.1)
    with pytest.raises(IncompatibleCheckpointError, match="the head differs"):
        train(tiny_cfg(workspace, tmp_path / "run", max_steps=3))
    export_checkpoint(tmp_path / "run", tmp_path / "draft")  # an earlier export of its kind is replaced


def test_head_flags_are_checked(workspace, tmp_path):
    with pytest.raises(UsageError, match="--head 'medusa'"):
        tiny_cfg(workspace, tmp_path / "x", head="medusa")
    with pytest.raises(UsageError, match="--gamma 0.0 .*--head domino"):
        tiny_cfg(workspace, tmp_path / "x", head="domino", gamma=0.0)
    assert tiny_cfg(workspace, tmp_path / "x", head="none").head_config(4, 1e-6, 32) is None
