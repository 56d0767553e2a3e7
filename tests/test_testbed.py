"""The testbed pipeline (testbed/run.py) end to end at toy scale on the CPU: a tiny random Llama
target, a handful of prompts, a few training steps per variant, export, reference-decoder eval,
tables. Plus the pieces that guard the experiment: disjoint training data, frozen settings."""
import json
import sys
from pathlib import Path

import pytest

TESTBED = Path(__file__).resolve().parent.parent / "testbed"
sys.path.insert(0, str(TESTBED))

import run as testbed  # noqa: E402
from training_prompts import disjoint, user_turn_prefix  # noqa: E402

TOY = {"draft_intermediate_size": 64, "block_size": 4, "candidate_topk": 4, "head_hidden_size": 32, "head_layers": 1,
       "head_heads": 4, "factor_dim": 16, "max_steps": 2, "batch_size": 2, "num_anchors": 4, "max_length": 256,
       "save_every": 2, "log_every": 2, "eval_examples": 2, "mask_token": "<|mask|>"}
EVAL = [("gsm8k", "Question: how many cats sat on the mat?"), ("humaneval", "def add(a, b):\n    return a + b"),
        ("aime2025", "Find the sum of one two three."), ("gpqa", "Which dog ran far? (A) one (B) two"),
        ("writingbench", "Write a story about a cat and a dog.")]


def cli(work, target, evals, *args):
    return testbed.main(["--work", str(work), "--target", str(target), "--out", str(work / "OUT"), "--eval-prompts", str(evals), *args])


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    import torch
    from test_train import make_target

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matrices: one thread is many times faster on a shared CPU
    root = tmp_path_factory.mktemp("testbed")
    evals = root / "eval_prompts.jsonl"
    evals.write_text("".join(json.dumps({"id": f"{s}/0", "set": s, "text": t}) + "\n" for s, t in EVAL))
    yield root / "work", make_target(root / "target"), evals
    torch.set_num_threads(threads)


def test_pipeline_end_to_end(toy):
    work, target, evals = toy
    assert cli(work, target, evals, "data", "--self-prompts", "4", "--code-prompts", "4", "--prose-prompts", "2",
               "--prompt-tokens", "8", "--max-new-tokens", "8", "--gen-batch", "8", "--stdlib-files", "60",
               "--snippet-chars", "160") == 0
    summary = json.loads((work / "data" / "data_summary.json").read_text())
    assert summary["conversations"] >= 6 and summary["prompts"]["code"] == 4 and summary["prompts"]["prose"] == 2
    trained = (work / "data" / "train.jsonl").read_text()
    assert not any(json.dumps(t)[1:-1] in trained for _, t in EVAL)

    override = [f"--override={k}={json.dumps(v)}" for k, v in TOY.items()]
    assert cli(work, target, evals, "train", "all", "--no-bf16", *override) == 0
    status = json.loads((work / "train_summary.json").read_text())["variants"]
    assert set(status) == {"dflash", "lilicorr", "no_dist", "margin"} and all(v["step"] == 2 and v["done"] for v in status.values())
    assert all(len(list((work / "runs" / n / "checkpoints").iterdir())) == 1 for n in status)  # pruned to the latest
    assert cli(work, target, evals, "train", "all", "--no-bf16", *override) == 0  # resumed: nothing left to do
    with pytest.raises(SystemExit, match="variants must share them"):
        cli(work, target, evals, "train", "dflash", "--no-bf16", *override, "--override=max_steps=3")

    assert cli(work, target, evals, "export") == 0
    assert cli(work, target, evals, "--out", str(work / "OUT2"), "export") == 0  # nothing new: nothing copied again
    assert not (work / "OUT2").exists()
    assert json.loads((work / "drafts" / "dflash" / "config.json").read_text())["architectures"] == ["DFlashDraftModel"]
    assert json.loads((work / "drafts" / "lilicorr" / "config.json").read_text())["architectures"] == ["LiLiCorrDraftModel"]

    assert cli(work, target, evals, "eval", "--per-set", "1", "--max-new-tokens", "6", "--workers", "1", "--seeds", "0", "1") == 0
    rows = [json.loads(line) for line in (work / "eval" / "results-0.jsonl").read_text().splitlines()]
    # per prompt: 5 systems at T=0 + (dflash, lilicorr) x 2 seeds at T=1
    assert len(rows) == 5 * (5 + 2 * 2)
    assert all(1 <= r["tokens"] <= 6 and r["tokens"] / max(r["blocks"], 1) <= TOY["block_size"] for r in rows)
    greedy_lili = [r for r in rows if r["system"] == "lilicorr" and r["temperature"] == 0]
    assert all(set(r["draft_tokens"]) == {"argmax", "lilicorr"} for r in greedy_lili)
    assert cli(work, target, evals, "eval", "--per-set", "1", "--max-new-tokens", "6", "--workers", "1", "--seeds", "0", "1") == 0
    assert len((work / "eval" / "results-0.jsonl").read_text().splitlines()) == len(rows)  # resume: nothing rerun

    assert cli(work, target, evals, "tables") == 0
    md = (work / "report" / "tables.md").read_text()
    for heading in ("Main results", "Decode rule", "Loss ablation", "GSM8K", "WritingBench", "reference decoder"):
        assert heading in md
    cells = json.loads((work / "report" / "tables.json").read_text())["cells"]
    t1 = [c for c in cells if c["system"] == "dflash" and c["temperature"] == 1.0 and c["set"] == "gsm8k"]
    assert t1 and t1[0]["seeds"] == [0, 1] and t1[0]["std"] is not None
    out = sorted(p.name for p in (work / "OUT").iterdir())
    assert "testbed_results.tar.gz" in out and "draft_lilicorr.tar" in out and len(out) <= 8


def test_training_prompts_are_disjoint_from_evaluation():
    evaluation = ["Question: Janet has three ducks that lay sixteen eggs per day and she sells them."]
    kept, dropped = disjoint(
        ["Write a poem about the sea.", evaluation[0],
         "Tell me why Janet has three ducks that lay sixteen eggs per day and she is happy."], evaluation)
    assert kept == ["Write a poem about the sea."] and dropped == 2


def test_user_turn_prefix_and_bad_settings(toy, tmp_path):
    from transformers import AutoTokenizer

    work, target, evals = toy
    assert user_turn_prefix(AutoTokenizer.from_pretrained(target)) == "[user]"
    with pytest.raises(SystemExit, match="unknown key"):
        cli(tmp_path, target, evals, "train", "dflash", "--override=widht=3")
    with pytest.raises(SystemExit, match="unknown variant"):
        cli(tmp_path, target, evals, "train", "vanilla")
    with pytest.raises(SystemExit, match="no training data"):
        cli(tmp_path / "empty", target, evals, "train", "dflash")
    with pytest.raises(SystemExit, match="testbed/run.py prompts"):
        cli(tmp_path, target, tmp_path / "missing.jsonl", "data")
