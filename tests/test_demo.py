"""`lilicorr demo`: argument wiring, the missing-checkpoint message, the block rendering, and one
decode + report on the tiny models of test_reference (the real SmolLM2 run, with LILICORR_SLOW=1)."""

import argparse
import io
import os

import pytest

from sglang_lilicorr.commands import demo
from sglang_lilicorr.cli import main
from sglang_lilicorr.reference import BlockRecord, speculative_decoder
from test_reference import PROMPT, VOCAB, tiny_drafter, tiny_head, tiny_target


def parse(argv):
    parser = argparse.ArgumentParser()
    demo.register(parser.add_subparsers(dest="command"))
    return parser.parse_args(["demo", *argv])


class TinyTokenizer:
    """Token i <-> the word 'w{i}'; the chat template prepends PROMPT."""

    eos_token_id = 2

    def apply_chat_template(self, messages, add_generation_prompt, tokenize):
        assert add_generation_prompt and not tokenize
        return " ".join(f"w{t}" for t in PROMPT + [len(messages[0]["content"]) % VOCAB])

    def __call__(self, text, add_special_tokens):
        return {"input_ids": [int(w[1:]) for w in text.split()]}

    def convert_tokens_to_ids(self, token):
        return None  # no <|im_end|> in this vocabulary

    def decode(self, ids, skip_special_tokens=False):
        return "".join(f" w{t}" for t in ids)


def test_register_adds_the_demo_subcommand():
    args = parse(["--draft", "/x", "--max-new-tokens", "5", "--walk", "viterbi"])
    assert args.func is demo.run_demo and str(args.draft) == "/x" and args.max_new_tokens == 5
    assert parse([]).draft == demo.DEFAULT_DRAFT and parse([]).walk == "greedy"


def test_missing_checkpoint_says_so_before_any_download(tmp_path, monkeypatch, capsys):
    import sglang_lilicorr.commands.smollm2 as smollm2

    monkeypatch.setattr(smollm2, "ensure_smollm2", lambda *a, **k: pytest.fail("must not fetch the target"))
    assert main(["demo", "--draft", str(tmp_path / "nowhere")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: no draft checkpoint") and err.count("\n") == 1
    assert "--draft" in err and "lilicorr export" in err
    monkeypatch.setattr(demo, "DEFAULT_DRAFT", tmp_path / "shipped")
    assert main(["demo", "--draft", str(tmp_path / "shipped")]) == 2
    assert "shipped SmolLM2 LiLiCorr draft is not in this checkout" in capsys.readouterr().err


def test_render_block_marks_the_accepted_tokens():
    block = BlockRecord(
        12, {"argmax": [5, 6, 7], "lilicorr": [5, 8, 9]}, {"argmax": 1, "lilicorr": 3}, "lilicorr", [5, 8, 9, 4]
    )
    lines = demo.render_block(0, block, lambda ids: f"t{ids[0]}")
    assert "@   12" in lines[0] and "+4 tokens" in lines[0]
    assert "accepted  1/3  't5' | 't6' 't7'" in lines[1] and "accepted  3/3  't5' 't8' 't9' | " in lines[2]


def test_decode_and_report_on_tiny_models():
    model = tiny_target()
    decoder = speculative_decoder(model, tiny_drafter(), tiny_head())
    seen = []
    reports = demo.decode_prompts(decoder, model, TinyTokenizer(), ["hi", "hello"], 10, seen.append)
    assert sum(seen) == sum(len(r.result.output_ids) for r in reports)
    out = io.StringIO()
    assert demo.print_report(reports, TinyTokenizer().decode, quiet=False, out=out)
    text = out.getvalue()
    assert "tau[argmax] = " in text and "tau[lilicorr] = " in text
    assert "greedy check: PASS" in text and "greedy choice: yes" in text
    blocks = [b for r in reports for b in r.result.blocks]
    expected = sum(b.accepted["lilicorr"] + 1 for b in blocks) / len(blocks)
    assert demo.pooled_tau(reports, "lilicorr") == pytest.approx(expected)


@pytest.mark.skipif(
    os.environ.get("LILICORR_SLOW") != "1",
    reason="runs the real SmolLM2 (the demo's 93 MB download, then ~10 s): LILICORR_SLOW=1 includes it",
)
def test_demo_on_smollm2_with_a_random_draft(tmp_path):
    from sglang_lilicorr.checkpoint import save_checkpoint, with_head
    from sglang_lilicorr.train.heads import serving_tensors
    from sglang_lilicorr.config import LiLiCorrConfig
    from sglang_lilicorr.drafter import DFlashDrafter, DrafterConfig, default_target_layer_ids
    from sglang_lilicorr.head import LiLiCorrHead

    cfg = DrafterConfig(
        hidden_size=576,
        vocab_size=49152,
        num_target_layers=30,
        target_layer_ids=tuple(default_target_layer_ids(30, 5)),
        mask_token_id=16,
        mask_token="<empty_output>",
        num_attention_heads=9,
        num_key_value_heads=3,
        intermediate_size=1536,
    )
    head_cfg = LiLiCorrConfig(hidden_size=256, factor_dim=256, num_layers=1)
    tensors = {k: v.bfloat16() for k, v in DFlashDrafter(cfg).state_dict().items()}
    tensors.update({k: v.bfloat16() for k, v in serving_tensors(LiLiCorrHead(head_cfg, 576)).items()})
    save_checkpoint(tmp_path / "draft", with_head(cfg.to_hf_config(), head_cfg), tensors)
    assert (
        demo.run_demo(parse(["--draft", str(tmp_path / "draft"), "--max-new-tokens", "6", "--prompt", "Hi", "--quiet"]))
        == 0
    )
