"""The testbed's paper recipe on the CPU, without training: the train step's plan (global batch 64 by accumulation,
--epochs over the data, an evaluation and checkpoint every --eval-tokens, both head widths), a later call that resumes
a run whose process ended and leaves a finished one, and the learning curves (held-out tau against training tokens)
that `tables` draws from fabricated metrics."""

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import benchmarks.testbed.run as testbed  # noqa: E402
from benchmarks.testbed import report, train, variants  # noqa: E402

SWEEP = ROOT / "benchmarks" / "results" / "testbed" / "h200x4_3f0f2a6" / "batch.json"


class Ended:
    pid = 2**22 + 12345  # no such process: the launched run counts as ended


def conversation(i: int) -> dict:
    return {
        "id": f"c{i}",
        "messages": [
            {"role": "user", "content": "the cat sat on the mat " * (1 + i % 3)},
            {"role": "assistant", "content": "a dog ran far and the cat sat " * (2 + i % 4)},
        ],
    }


def test_the_paper_recipe_plans_both_widths_and_resumes_what_ended(tmp_path, monkeypatch):
    from test_train import make_target

    target = make_target(tmp_path / "target")
    work = tmp_path / "work"
    (work / "data").mkdir(parents=True)
    (work / "sweep").mkdir()
    (work / "sweep" / "batch.json").write_text(SWEEP.read_text())  # the sweep's pick: 2 layers, batch 32
    for name, n in (("train.jsonl", 40), ("heldout.jsonl", 4)):
        (work / "data" / name).write_text("".join(json.dumps(conversation(i)) + "\n" for i in range(n)))
    launched = []
    monkeypatch.setattr(train, "start", lambda cmd, log, ids, append=False: launched.append((cmd, append)) or Ended)
    base = ["--work", str(work), "--target", str(target), "--out", str(tmp_path / "OUT"), "--paper-recipe", "train"]
    recipe = [*variants.WIDTHS, "--global-batch", "8", "--batch-size", "2", "--epochs", "3", "--eval-tokens", "2000"]
    assert testbed.main([*base, *recipe]) == 0
    plan = json.loads((work / "train_config.json").read_text())
    options = plan["options"]
    assert options["grad_accum"] == 4 and plan["global_batch"] == 8 and options["batch_size"] == 2
    assert options["max_steps"] == 15 and plan["epochs"] == 3.0 and plan["train_sequences"] == 40  # 3 x 40 / 8
    assert options["max_length"] == 3072 and options["num_anchors"] == 64
    assert options["eval_every"] == round(2000 / plan["tokens_per_step"]) == options["save_every"]
    flags = {cmd[cmd.index("--output-dir") + 1].rsplit("/", 1)[1]: cmd for cmd, _ in launched}
    width = {v: cmd[cmd.index("--head-hidden-size") + 1] for v, cmd in flags.items()}
    assert width == {"lilicorr": "256", "lilicorr_w1024": "1024"}
    assert flags["lilicorr_w1024"][flags["lilicorr_w1024"].index("--factor-dim") + 1] == "1024"
    # a later call: a run cut before its last step starts again (`lilicorr train` resumes it, its log goes on);
    # a finished one is left alone; the frozen plan is kept whatever the call says
    for name, step in (("lilicorr", 6), ("lilicorr_w1024", 15)):
        (work / "runs" / name / "metrics.jsonl").write_text(json.dumps({"step": step, "total_steps": step}) + "\n")
    launched.clear()
    assert testbed.main([*base, *variants.WIDTHS, "--steps", "99"]) == 0
    assert [(cmd[cmd.index("--output-dir") + 1].rsplit("/", 1)[1], append) for cmd, append in launched] == [
        ("lilicorr", True)
    ]
    assert json.loads((work / "train_config.json").read_text()) == plan


def metrics(steps, walk, argmax):
    return "".join(
        json.dumps({"step": s, "total_steps": steps[-1], "eval/tau_t0/lilicorr": w, "eval/tau_t0/argmax": a}) + "\n"
        for s, w, a in zip(steps, walk, argmax)
    )


def test_tables_draws_held_out_tau_against_training_tokens(tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    (results / "train_config.json").write_text(json.dumps({"options": {"max_steps": 30}, "tokens_per_step": 100000}))
    (results / "metrics_lilicorr.jsonl").write_text(metrics([10, 20, 30], [2.0, 2.3, 2.4], [1.8, 2.0, 2.1]))
    (results / "metrics_lilicorr_w1024.jsonl").write_text(metrics([10, 20, 30], [2.1, 2.5, 2.7], [1.8, 2.0, 2.1]))
    rows = [json.loads(line) for line in metrics([10, 30], [None, None], [1.7, 2.0]).splitlines()]
    (results / "metrics_dflash.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert testbed.main(["tables", "--results", str(results)]) == 0
    curves = json.loads((results / "results.json").read_text())["learning_curves"]
    assert curves["tokens_per_step"] == 100000
    points = curves["points"]
    assert [(p["tokens"], p["walk"]) for p in points["lilicorr_w1024"]] == [(1e6, 2.1), (2e6, 2.5), (3e6, 2.7)]
    assert [(p["tokens"], p["walk"], p["argmax"]) for p in points["dflash"]] == [(1e6, None, 1.7), (3e6, None, 2.0)]
    table = (results / "tables.md").read_text()
    assert "| step | tokens (M) | dflash | lilicorr | lilicorr_w1024 |" in table
    assert "| 20 | 2.00 | -- | 2.300 | 2.500 |" in table and "| 30 | 3.00 | 2.000 | 2.400 | 2.700 |" in table
    if report.optional_pyplot() is not None:
        assert (results / "tau_by_tokens.png").stat().st_size > 0


def test_the_head_width_table():
    cell = lambda system, tau: {"set": "gsm8k", "system": system, "temperature": 0, "tau": tau}
    taus = report.tau_summary(
        [cell("lilicorr", 2.2), cell("lilicorr_w1024", 2.5), cell("lilicorr_w1024_argmax", 2.0), cell("dflash", 2.0)]
    )
    lines = report.tau_tables(taus)
    assert "### Head width (T = 0, same data and steps)" in lines
    assert f"| {variants.VARIANT_LABELS['lilicorr_w1024']} | 2.500 |" in lines
