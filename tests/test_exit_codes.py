"""The exit-code and message rule over every command, as a new user meets it (and the lab's steps that take files and
servers): exit 2 for an argument that cannot work, 1 for bad content or a failed run; one line
`error: <what> (<where>): <fix>`; never "this is a bug"; and nothing left behind in the workspace by any of them."""

import pytest

from benchmarks import main as lab_main
from sglang_lilicorr.cli import main
from stub_server import NO_SERVER, bench_run_argv
from test_train import make_target, train_argv, write_conversations

R = None  # the workspace folder (set by the fixture; the cases are built from it)
LAB = "python -m benchmarks"  # a case's first word: the lab's entry point, not `lilicorr`


def T(*extra, data=None, target=None, out=None):
    """`lilicorr train` of a tiny one-step run on the workspace's target and data."""
    return train_argv(
        target or f"{R}/target", data or f"{R}/data.jsonl", out or f"{R}/runX", "--max-steps", "1", *extra
    )


def regenerate(*args, target="target"):
    return ["regenerate", "--target", f"{R}/{target}", *args, "--engine", "transformers"]


def bench_run(results, *extra, url=NO_SERVER, dataset=None):
    return bench_run_argv(dataset or f"{R}/p.jsonl", f"{R}/{results}", *extra, url=url)


def replay(out, outputs="data.jsonl", draft="okdraft", target="target"):
    return [
        "replay",
        "--target",
        f"{R}/{target}",
        "--draft",
        f"a={R}/{draft}",
        "--outputs",
        f"{R}/{outputs}",
        "--out",
        f"{R}/{out}",
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
        "regen prompts missing": (regenerate("--prompts", f"{R}/none.jsonl", "--output", f"{R}/o.jsonl"), 2),
        "regen prompts notjson": (regenerate("--prompts", f"{R}/notjson.jsonl", "--output", f"{R}/o.jsonl"), 1),
        "regen prompts empty": (regenerate("--prompts", f"{R}/empty.jsonl", "--output", f"{R}/o.jsonl"), 1),
        "regen exclude missing": (
            regenerate("--prompts", f"{R}/p.jsonl", "--exclude", f"{R}/none.jsonl", "--output", f"{R}/o.jsonl"),
            2,
        ),
        "regen output dir": (regenerate("--prompts", f"{R}/p.jsonl", "--output", f"{R}/nocfg"), 2),
        "regen recipe no exclude": (regenerate("--recipe", "--output-dir", f"{R}/dd"), 2),
        "regen recipe exclude missing": (
            regenerate("--recipe", "--output-dir", f"{R}/dd", "--exclude", f"{R}/none.jsonl"),
            2,
        ),
        "regen recipe out file": (regenerate("--recipe", "--output-dir", f"{R}/afile", "--exclude", f"{R}/p.jsonl"), 2),
        "bench dataset unknown": (bench_run("r.jsonl", dataset="nosuch"), 2),
        "bench results dir": (bench_run("nocfg"), 2),
        "bench url bad": (bench_run("r2.jsonl", "--no-progress", url="notaurl"), 2),
        "bench server down": (bench_run("r3.jsonl", "--no-progress"), 1),
        "bench limit 0": (bench_run("r4.jsonl", "--limit", "0"), 2),
        "bench limit -1": (bench_run("r4.jsonl", "--limit", "-1"), 2),
        "bench warmup -1": (bench_run("r4.jsonl", "--warmup", "-1", "--no-progress"), 2),
        "bench timeout 0": (bench_run("r4.jsonl", "--request-timeout", "0", "--no-progress"), 2),
        "bench temp nan": (bench_run("r4.jsonl", "--temperature", "nan", "--no-progress"), 2),
        "bench category bad": (bench_run("r4.jsonl", "--category", "zzz", "--no-progress"), 2),
        "report missing": (["bench", "report", f"{R}/none.jsonl", "--out", f"{R}/rep"], 2),
        "report notjson": (["bench", "report", f"{R}/notjson.jsonl", "--out", f"{R}/rep"], 1),
        "report out file": (["bench", "report", f"{R}/data.jsonl", "--out", f"{R}/afile"], 2),
        "compare missing": (["bench", "compare", f"{R}/none.jsonl", f"{R}/none.jsonl"], 2),
        "lab stages missing": ([LAB, "stages", f"{R}/none.json"], 2),
        "lab stages notjson": ([LAB, "stages", f"{R}/notjson.jsonl", "--out", f"{R}/st"], 1),
        "lab faults clients 0": (
            [LAB, "faults", "--url", "http://127.0.0.1:9", "--clients", "0", "--out", f"{R}/fa"],
            2,
        ),
        "lab faults down": ([LAB, "faults", "--url", "http://127.0.0.1:9", "--duration", "1", "--out", f"{R}/fa2"], 1),
        "checkdraft missing": (["check-draft", f"{R}/none", "--target", f"{R}/target"], 2),
        "checkdraft a run": (["check-draft", f"{R}/okrun", "--target", f"{R}/target"], 2),
        "checkdraft target missing": (["check-draft", f"{R}/okdraft", "--target", f"{R}/none"], 2),
        "replay outputs missing": (replay("rp", outputs="none.jsonl"), 2),
        "replay outputs notjson": (replay("rp2", outputs="notjson.jsonl"), 1),
        "replay draft missing": (replay("rp3", draft="none"), 2),
        "replay target missing": (replay("rp4", target="none"), 2),
        "replay no turns": (replay("rp5"), 1),
        "replay bad turns": (replay("rp6", outputs="badrows.jsonl"), 1),
        "replay damaged draft": (replay("rp7", outputs="badrows.jsonl", draft="baddraft"), 1),
        "train target bad config": (T(target=f"{R}/badcfg"), 2),
        "train target no weights": (T(target=f"{R}/noweights"), 2),
        "train rows of wrong types": (T(data=f"{R}/weird.jsonl"), 1),
        "train init-from damaged draft": (T("--init-from", f"{R}/baddraft"), 1),
        "regen target bad config": (
            regenerate("--prompts", f"{R}/p.jsonl", "--output", f"{R}/o9.jsonl", target="badcfg"),
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


def tree(root) -> dict:
    """Every file and folder under root: path -> (size, mtime) of a file, None of a folder."""
    from pathlib import Path

    return {
        str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) if p.is_file() else None
        for p in sorted(Path(root).rglob("*"))
    }


def test_every_bad_input_answers_by_the_rule(workspace, capsys):
    wrong = []
    for name, (argv, want) in workspace.items():
        capsys.readouterr()
        before = tree(R)
        try:
            code = lab_main(argv[1:]) if argv[0] == LAB else main(argv)
        except SystemExit as e:
            code = e.code
        err = capsys.readouterr().err
        lines = [line for line in err.splitlines() if line.startswith("error: ")]
        line = lines[-1] if lines else "(no error line)"
        head, _, fix = line.partition("): ")
        if code != want or not (fix and " (" in head) or "this is a bug" in err or "Traceback" in err:
            wrong.append(f"{name}: exit {code} (want {want}): {line[:200]}")
        after = tree(R)
        if after != before:
            changed = sorted(p for p in set(before) | set(after) if before.get(p, "-") != after.get(p, "-"))
            wrong.append(f"{name}: left {changed[:5]} behind")
    assert not wrong, "\n".join(wrong)
