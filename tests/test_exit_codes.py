"""The exit-code and message rule over every command, as a new user meets it (issue 40): exit 2 for an argument
that cannot work, 1 for bad content or a failed run; one line `error: <what> (<where>): <fix>`; never "this is a bug"."""

import pytest

from sglang_lilicorr.cli import main
from test_train import make_target, write_conversations

R = None  # the workspace folder (set by the fixture; the cases are built from it)
F = [
    "--no-bf16",
    "--block-size",
    "4",
    "--candidate-topk",
    "4",
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
    "--batch-size",
    "2",
    "--max-length",
    "64",
    "--eval-examples",
    "2",
    "--chat-template-kwargs",
    "{}",
    "--max-steps",
    "1",
]


def T(*extra, data=None, target=None, out=None):
    return [
        "train",
        "--target",
        target or f"{R}/target",
        "--data",
        data or f"{R}/data.jsonl",
        "--output-dir",
        out or f"{R}/runX",
        *F,
        *extra,
    ]


def cases() -> dict:
    return {
        "train target missing": (T(target=f"{R}/none"), 2),
        "train target file": (T(target=f"{R}/afile"), 2),
        "train target nocfg": (T(target=f"{R}/nocfg"), 2),
        "train data missing": (T(data=f"{R}/none.jsonl"), 2),
        "train data dir": (T(data=f"{R}/nocfg"), 2),
        "train data empty": (T(data=f"{R}/empty.jsonl"), 1),
        "train data notjson": (T(data=f"{R}/notjson.jsonl"), 1),
        "train data bin": (T(data=f"{R}/bin.jsonl"), 1),
        "train data nomsg": (T(data=f"{R}/nomsg.jsonl"), 1),
        "train eval-data missing": (T("--eval-data", f"{R}/none.jsonl"), 2),
        "train eval-data overlap": (T("--eval-data", f"{R}/data.jsonl"), 1),
        "train exclude missing": (T("--exclude", f"{R}/none.jsonl"), 2),
        "train init-from missing": (T("--init-from", f"{R}/none"), 2),
        "train init-from run": (T("--init-from", f"{R}/okrun"), 2),
        "train mask-token bad": (T("--mask-token", "<nope>"), 2),
        "train out file": (T(out=f"{R}/afile"), 2),
        "train max-length 3": (T("--max-length", "3"), 2),
        "train yarn factor": (T("--rope-scaling", "yarn"), 2),
        "train other geometry": (T("--draft-layers", "2", out=f"{R}/okrun"), 2),
        "export src missing": (["export", f"{R}/none", f"{R}/d1"], 2),
        "export src not run": (["export", f"{R}/nocfg", f"{R}/d2"], 2),
        "export src a draft": (["export", f"{R}/okdraft", f"{R}/d3"], 2),
        "export src file": (["export", f"{R}/afile", f"{R}/d4"], 2),
        "export out file": (["export", f"{R}/okrun", f"{R}/afile"], 2),
        "regen prompts missing": (
            [
                "regenerate",
                "--target",
                f"{R}/target",
                "--prompts",
                f"{R}/none.jsonl",
                "--output",
                f"{R}/o.jsonl",
                "--engine",
                "transformers",
            ],
            2,
        ),
        "regen prompts notjson": (
            [
                "regenerate",
                "--target",
                f"{R}/target",
                "--prompts",
                f"{R}/notjson.jsonl",
                "--output",
                f"{R}/o.jsonl",
                "--engine",
                "transformers",
            ],
            1,
        ),
        "regen prompts empty": (
            [
                "regenerate",
                "--target",
                f"{R}/target",
                "--prompts",
                f"{R}/empty.jsonl",
                "--output",
                f"{R}/o.jsonl",
                "--engine",
                "transformers",
            ],
            1,
        ),
        "regen exclude missing": (
            [
                "regenerate",
                "--target",
                f"{R}/target",
                "--prompts",
                f"{R}/p.jsonl",
                "--exclude",
                f"{R}/none.jsonl",
                "--output",
                f"{R}/o.jsonl",
                "--engine",
                "transformers",
            ],
            2,
        ),
        "regen output dir": (
            [
                "regenerate",
                "--target",
                f"{R}/target",
                "--prompts",
                f"{R}/p.jsonl",
                "--output",
                f"{R}/nocfg",
                "--engine",
                "transformers",
            ],
            2,
        ),
        "regen recipe no exclude": (
            [
                "regenerate",
                "--target",
                f"{R}/target",
                "--recipe",
                "--output-dir",
                f"{R}/dd",
                "--engine",
                "transformers",
            ],
            2,
        ),
        "regen recipe exclude missing": (
            [
                "regenerate",
                "--target",
                f"{R}/target",
                "--recipe",
                "--output-dir",
                f"{R}/dd",
                "--exclude",
                f"{R}/none.jsonl",
                "--engine",
                "transformers",
            ],
            2,
        ),
        "regen recipe out file": (
            [
                "regenerate",
                "--target",
                f"{R}/target",
                "--recipe",
                "--output-dir",
                f"{R}/afile",
                "--exclude",
                f"{R}/p.jsonl",
                "--engine",
                "transformers",
            ],
            2,
        ),
        "bench dataset unknown": (
            [
                "bench",
                "run",
                "--url",
                "http://127.0.0.1:9",
                "--system",
                "x",
                "--dataset",
                "nosuch",
                "--results",
                f"{R}/r.jsonl",
            ],
            2,
        ),
        "bench results dir": (
            [
                "bench",
                "run",
                "--url",
                "http://127.0.0.1:9",
                "--system",
                "x",
                "--dataset",
                f"{R}/p.jsonl",
                "--results",
                f"{R}/nocfg",
            ],
            2,
        ),
        "bench url bad": (
            [
                "bench",
                "run",
                "--url",
                "notaurl",
                "--system",
                "x",
                "--dataset",
                f"{R}/p.jsonl",
                "--results",
                f"{R}/r2.jsonl",
                "--no-progress",
            ],
            2,
        ),
        "bench server down": (
            [
                "bench",
                "run",
                "--url",
                "http://127.0.0.1:9",
                "--system",
                "x",
                "--dataset",
                f"{R}/p.jsonl",
                "--results",
                f"{R}/r3.jsonl",
                "--no-progress",
            ],
            1,
        ),
        "bench limit 0": (
            [
                "bench",
                "run",
                "--url",
                "http://127.0.0.1:9",
                "--system",
                "x",
                "--dataset",
                f"{R}/p.jsonl",
                "--results",
                f"{R}/r4.jsonl",
                "--limit",
                "0",
            ],
            2,
        ),
        "bench limit -1": (
            [
                "bench",
                "run",
                "--url",
                "http://127.0.0.1:9",
                "--system",
                "x",
                "--dataset",
                f"{R}/p.jsonl",
                "--results",
                f"{R}/r4.jsonl",
                "--limit",
                "-1",
            ],
            2,
        ),
        "bench warmup -1": (
            [
                "bench",
                "run",
                "--url",
                "http://127.0.0.1:9",
                "--system",
                "x",
                "--dataset",
                f"{R}/p.jsonl",
                "--results",
                f"{R}/r4.jsonl",
                "--warmup",
                "-1",
                "--no-progress",
            ],
            2,
        ),
        "bench timeout 0": (
            [
                "bench",
                "run",
                "--url",
                "http://127.0.0.1:9",
                "--system",
                "x",
                "--dataset",
                f"{R}/p.jsonl",
                "--results",
                f"{R}/r4.jsonl",
                "--request-timeout",
                "0",
                "--no-progress",
            ],
            2,
        ),
        "bench temp nan": (
            [
                "bench",
                "run",
                "--url",
                "http://127.0.0.1:9",
                "--system",
                "x",
                "--dataset",
                f"{R}/p.jsonl",
                "--results",
                f"{R}/r4.jsonl",
                "--temperature",
                "nan",
                "--no-progress",
            ],
            2,
        ),
        "bench category bad": (
            [
                "bench",
                "run",
                "--url",
                "http://127.0.0.1:9",
                "--system",
                "x",
                "--dataset",
                f"{R}/p.jsonl",
                "--results",
                f"{R}/r4.jsonl",
                "--category",
                "zzz",
                "--no-progress",
            ],
            2,
        ),
        "report missing": (["bench", "report", f"{R}/none.jsonl", "--out", f"{R}/rep"], 2),
        "report notjson": (["bench", "report", f"{R}/notjson.jsonl", "--out", f"{R}/rep"], 1),
        "report out file": (["bench", "report", f"{R}/data.jsonl", "--out", f"{R}/afile"], 2),
        "compare missing": (["bench", "compare", f"{R}/none.jsonl", f"{R}/none.jsonl"], 2),
        "stages missing": (["bench", "stages", f"{R}/none.json"], 2),
        "stages notjson": (["bench", "stages", f"{R}/notjson.jsonl", "--out", f"{R}/st"], 1),
        "faults clients 0": (
            ["bench", "faults", "--url", "http://127.0.0.1:9", "--clients", "0", "--out", f"{R}/fa"],
            2,
        ),
        "faults down": (["bench", "faults", "--url", "http://127.0.0.1:9", "--duration", "1", "--out", f"{R}/fa2"], 1),
        "checkdraft missing": (["check-draft", f"{R}/none", "--target", f"{R}/target"], 2),
        "checkdraft a run": (["check-draft", f"{R}/okrun", "--target", f"{R}/target"], 2),
        "checkdraft target missing": (["check-draft", f"{R}/okdraft", "--target", f"{R}/none"], 2),
        "replay outputs missing": (
            [
                "replay",
                "--target",
                f"{R}/target",
                "--draft",
                f"a={R}/okdraft",
                "--outputs",
                f"{R}/none.jsonl",
                "--out",
                f"{R}/rp",
            ],
            2,
        ),
        "replay outputs notjson": (
            [
                "replay",
                "--target",
                f"{R}/target",
                "--draft",
                f"a={R}/okdraft",
                "--outputs",
                f"{R}/notjson.jsonl",
                "--out",
                f"{R}/rp2",
            ],
            1,
        ),
        "replay draft missing": (
            [
                "replay",
                "--target",
                f"{R}/target",
                "--draft",
                f"a={R}/none",
                "--outputs",
                f"{R}/data.jsonl",
                "--out",
                f"{R}/rp3",
            ],
            2,
        ),
        "replay target missing": (
            [
                "replay",
                "--target",
                f"{R}/none",
                "--draft",
                f"a={R}/okdraft",
                "--outputs",
                f"{R}/data.jsonl",
                "--out",
                f"{R}/rp4",
            ],
            2,
        ),
        "replay no turns": (
            [
                "replay",
                "--target",
                f"{R}/target",
                "--draft",
                f"a={R}/okdraft",
                "--outputs",
                f"{R}/data.jsonl",
                "--out",
                f"{R}/rp5",
            ],
            1,
        ),
        "replay bad turns": (
            [
                "replay",
                "--target",
                f"{R}/target",
                "--draft",
                f"a={R}/okdraft",
                "--outputs",
                f"{R}/badrows.jsonl",
                "--out",
                f"{R}/rp6",
            ],
            1,
        ),
        "replay damaged draft": (
            [
                "replay",
                "--target",
                f"{R}/target",
                "--draft",
                f"a={R}/baddraft",
                "--outputs",
                f"{R}/badrows.jsonl",
                "--out",
                f"{R}/rp7",
            ],
            1,
        ),
        "train target bad config": (T(target=f"{R}/badcfg"), 2),
        "train target no weights": (T(target=f"{R}/noweights"), 2),
        "train rows of wrong types": (T(data=f"{R}/weird.jsonl"), 1),
        "train init-from damaged draft": (T("--init-from", f"{R}/baddraft"), 1),
        "regen target bad config": (
            [
                "regenerate",
                "--target",
                f"{R}/badcfg",
                "--prompts",
                f"{R}/p.jsonl",
                "--output",
                f"{R}/o9.jsonl",
                "--engine",
                "transformers",
            ],
            2,
        ),
        "demo draft missing": (["demo", "--draft", f"{R}/none"], 2),
    }


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    global R
    root = tmp_path_factory.mktemp("codes")
    R = str(root)
    make_target(root / "target")
    write_conversations(root / "data.jsonl", 8)
    (root / "empty.jsonl").write_text("")
    (root / "notjson.jsonl").write_text("hello\n")
    (root / "bin.jsonl").write_bytes(b"\x00\xff\xfe")
    (root / "nomsg.jsonl").write_text('{"id": 1}\n')
    (root / "p.jsonl").write_text('{"id": "a", "text": "hi"}\n')
    (root / "afile").write_text("x")
    (root / "nocfg").mkdir()
    (root / "badcfg").mkdir()
    (root / "badcfg" / "config.json").write_text("{garbage")
    (root / "noweights").mkdir()
    (root / "noweights" / "config.json").write_text((root / "target" / "config.json").read_text())
    (root / "badrows.jsonl").write_text(
        '{"id": "x", "messages": [{"role": "user", "content": "hi"}], "turns": [{"prompt_ids": "x"}]}\n'
    )
    (root / "weird.jsonl").write_text('{"messages": [{"role": "user", "content": 5}]}\n')
    assert main(T(out=f"{R}/okrun")) == 0 and main(["export", f"{R}/okrun", f"{R}/okdraft"]) == 0
    (root / "baddraft").mkdir()
    (root / "baddraft" / "config.json").write_text((root / "okdraft" / "config.json").read_text())
    (root / "baddraft" / "model.safetensors").write_bytes(b"\x00" * 50)
    return cases()


def test_every_bad_input_answers_by_the_rule(workspace, capsys):
    wrong = []
    for name, (argv, want) in workspace.items():
        capsys.readouterr()
        try:
            code = main(argv)
        except SystemExit as e:
            code = e.code
        err = capsys.readouterr().err
        lines = [line for line in err.splitlines() if line.startswith("error: ")]
        line = lines[-1] if lines else "(no error line)"
        head, _, fix = line.partition("): ")
        if code != want or not (fix and " (" in head) or "this is a bug" in err or "Traceback" in err:
            wrong.append(f"{name}: exit {code} (want {want}): {line[:200]}")
    assert not wrong, "\n".join(wrong)
