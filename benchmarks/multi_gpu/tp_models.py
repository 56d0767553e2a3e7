"""Models for the tensor-parallel and multi-GPU training checks, written offline on the GPU machine (seeded: every
run of it writes the same files, and TP = 1, 2, 4 servers load the one folder it wrote):

  python -m benchmarks tp-models OUT [--seed 0] [--vocab 32000] [--hidden 1024] [--layers 8] [--heads 16]
                            [--kv-heads 8] [--intermediate 2816] [--conversations 4000]

  OUT/target/              a random Llama target (bf16) whose attention heads, KV heads and MLP divide by 1, 2, 4 and
                           8, with a byte-level BPE tokenizer trained on Python's standard library and a chat template
                           (SmolLM2-135M, with 9 heads, cannot run at TP = 2)
  OUT/lilicorr_draft/      a random LiLiCorr draft for it: the drafter and head `lilicorr train` would build (defaults
                           of TrainConfig), in SGLang's LiLiCorrDraftModel format
  OUT/dflash_draft/        the same drafter without its head (serve it with --speculative-algorithm DFLASH)
  OUT/conversations.jsonl  chat conversations for `lilicorr train`: a request for a piece of a standard-library
                           module, answered with that piece

No draft token of a random draft is expected to be accepted: the serving check compares proposals and outputs across
TP degrees and checks every greedy token, it does not measure a speed-up.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
from pathlib import Path

import torch

OPTIONS = dict(seed=0, vocab=32000, hidden=1024, layers=8, heads=16, kv_heads=8, intermediate=2816, conversations=4000)
SPECIALS = ["<|endoftext|>", "<|mask|>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m.role }}|>\n{{ m.content }}<|endoftext|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def stdlib_files(limit: int | None = None) -> list[str]:
    files = sorted(glob.glob(os.path.join(os.path.dirname(os.__file__), "*.py")))
    return files[:limit] if limit else files


def write_tokenizer(out: Path, vocab: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=SPECIALS,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train(stdlib_files(), trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token=SPECIALS[0], pad_token=SPECIALS[0], mask_token=SPECIALS[1]
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)
    return fast


def write_target(out: Path, a: argparse.Namespace):
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = write_tokenizer(out, a.vocab)
    eos = tokenizer.convert_tokens_to_ids(SPECIALS[0])
    config = LlamaConfig(
        vocab_size=a.vocab,
        hidden_size=a.hidden,
        intermediate_size=a.intermediate,
        num_hidden_layers=a.layers,
        num_attention_heads=a.heads,
        num_key_value_heads=a.kv_heads,
        max_position_embeddings=4096,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        bos_token_id=eos,
        eos_token_id=eos,
        pad_token_id=eos,
    )
    torch.manual_seed(a.seed)
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(out)
    return model, tokenizer


def write_drafts(out: Path, model, tokenizer, seed: int) -> None:
    from benchmarks.served.random_head import vanilla_copy
    from sglang_lilicorr.checkpoint import save_checkpoint
    from sglang_lilicorr.train.heads import serving_tensors
    from sglang_lilicorr.drafter import DFlashDrafter
    from sglang_lilicorr.head import LiLiCorrHead
    from sglang_lilicorr.train.config import TrainConfig
    from sglang_lilicorr.train.export import draft_config
    from sglang_lilicorr.train.trainer import drafter_config_for

    cfg = TrainConfig(target=str(out / "target"), data="", output_dir="", mask_token=SPECIALS[1])
    drafter_cfg = drafter_config_for(model, tokenizer, cfg)
    head_cfg = cfg.head_config(drafter_cfg.block_size, drafter_cfg.rms_norm_eps)
    torch.manual_seed(seed)
    drafter, head = DFlashDrafter(drafter_cfg), LiLiCorrHead(head_cfg, drafter_cfg.hidden_size)
    tensors = {**drafter.state_dict(), **serving_tensors(head)}
    save_checkpoint(
        out / "lilicorr_draft",
        draft_config(drafter_cfg, head_cfg, "bfloat16"),
        {k: v.to(torch.bfloat16) for k, v in tensors.items()},
    )
    vanilla_copy(out / "lilicorr_draft", out / "dflash_draft")


def write_conversations(path: Path, n: int, chunk_chars: int = 3000) -> int:
    """Up to n conversations, one per chunk of the standard library's modules, in file order."""
    rows = []
    for file in stdlib_files():
        text = Path(file).read_text(errors="replace")
        for k in range(0, len(text), chunk_chars):
            rows.append(
                {
                    "id": len(rows),
                    "messages": [
                        {
                            "role": "user",
                            "content": f"Show part {k // chunk_chars + 1} of the module {Path(file).name}.",
                        },
                        {"role": "assistant", "content": text[k : k + chunk_chars]},
                    ],
                }
            )
            if len(rows) == n:
                break
        if len(rows) == n:
            break
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return len(rows)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out")
    for name, default in OPTIONS.items():
        p.add_argument("--" + name.replace("_", "-"), type=int, default=default)
    a = p.parse_args(argv)
    out = Path(a.out)
    model, tokenizer = write_target(out / "target", a)
    write_drafts(out, model, tokenizer, a.seed)
    n = write_conversations(out / "conversations.jsonl", a.conversations)
    print(
        f"target ({sum(t.numel() for t in model.parameters()) / 1e6:.1f} M parameters, vocab {a.vocab}, "
        f"{a.heads} heads, {a.kv_heads} KV heads), lilicorr_draft, dflash_draft, {n} conversations -> {out}"
    )
