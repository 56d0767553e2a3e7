"""The testbed pipeline (`python -m benchmarks testbed`) end to end at toy scale on the CPU: a tiny random Llama
target, the data recipe through the transformers engine, the sweep, background training, export,
evaluation outputs, replay, the paired speed step against stand-in servers, and the tables."""

import gzip
import hashlib
import json
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import benchmarks.testbed.run as testbed  # noqa: E402
from stub_server import free_port_block  # noqa: E402
from benchmarks.testbed import report, speed, sweep, train, variants  # noqa: E402

TOY = {
    "draft_intermediate_size": 64,
    "block_size": 4,
    "candidate_topk": 4,
    "head_hidden_size": 32,
    "head_layers": 1,
    "head_heads": 4,
    "factor_dim": 16,
    "max_length": 128,
    "num_anchors": 4,
    "log_every": 2,
    "mask_token": "<|mask|>",
}
EVAL = [
    {"id": "gsm8k/0", "set": "gsm8k", "text": "how many cats sat on the mat"},
    {"id": "writingbench/1", "set": "writingbench", "text": "write a story about a cat and a dog"},
    {
        "id": "mtbench/81",
        "set": "mtbench",
        "messages": [{"role": "user", "content": "the dog ran far"}, {"role": "user", "content": "now say it again"}],
    },
]

# Serves tests/stub_server.py on $PORT with GET /health.
LAUNCHER = """
import os, sys
sys.path.insert(0, {tests!r})
from stub_server import StubServer
spec = "--speculative-algorithm" in os.environ["SERVER_ARGS"]
stub = StubServer(speculative=spec, accept=3, min_latency_s=0.002, port=int(os.environ["PORT"]))
stub.serve_forever()
"""


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    from test_train import make_target

    root = tmp_path_factory.mktemp("testbed")
    evals = root / "eval_prompts.jsonl"
    evals.write_text("".join(json.dumps(r) + "\n" for r in EVAL))
    return root / "work", make_target(root / "target"), evals


def cli(toy, *args):
    work, target, evals = toy
    override = [f"--override={k}={json.dumps(v)}" for k, v in TOY.items()]
    return testbed.main(
        [
            "--work",
            str(work),
            "--target",
            str(target),
            "--out",
            str(work / "OUT"),
            "--eval-prompts",
            str(evals),
            *override,
            *args,
        ]
    )


def fork_steps(monkeypatch) -> None:
    """The steps' background processes (common.start's `lilicorr ...`, or torchrun's one rank of it) become children
    forked from this process (tests/forked.py) that run `lilicorr`'s main, with the folder, log, environment and session
    common.start gives them, one rank with the environment torchrun adds. test_pipeline_end_to_end starts its training
    runs (torchrun) as the programs they are."""
    import subprocess
    import types

    import forked

    from benchmarks.testbed import common
    from sglang_lilicorr import cli

    def popen(cmd, *, env, cwd, stdout, stderr, start_new_session):
        env = dict(env)
        if cmd[:3] == [sys.executable, "-m", "torch.distributed.run"]:
            assert cmd[3:6] == ["--nproc-per-node", "1", "--master-port"], cmd
            env.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1", MASTER_PORT=cmd[6])
            cmd = [sys.executable, *cmd[7:]]
        assert cmd[:3] == [sys.executable, "-m", "sglang_lilicorr.cli"] and stderr == subprocess.STDOUT, cmd
        return forked.start(
            lambda: cli.main(cmd[3:]),
            stdout=stdout.fileno(),
            stderr=stdout.fileno(),
            cwd=cwd,
            env=env,
            new_session=start_new_session,
            args=cmd,
        )

    monkeypatch.setattr(common, "subprocess", types.SimpleNamespace(**{**vars(subprocess), "Popen": popen}))


@pytest.fixture
def steps_forked(monkeypatch):
    fork_steps(monkeypatch)


@pytest.fixture
def ports_29500_taken():
    """The ports torchrun takes by default held by someone else: the testbed asks the OS for free ones."""
    import socket

    held = []
    for port in (29500, 29501):
        s = socket.socket()
        try:
            s.bind(("127.0.0.1", port))
            s.listen()
            held.append(s)
        except OSError:  # already taken: as good for this test
            s.close()
    yield
    for s in held:
        s.close()


def test_pipeline_end_to_end(toy, tmp_path, monkeypatch, ports_29500_taken, request):
    work, target, evals = toy
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert (
        cli(
            toy,
            "--engine",
            "transformers",
            "data",
            "--magpie",
            "40",
            "--package",
            "6",
            "--heldout",
            "3",
            "--max-new-tokens",
            "12",
        )
        == 0
    )
    manifest = json.loads((work / "data" / "manifest.json").read_text())
    assert manifest["counts"]["conversations"] >= 6 and (work / "data" / "train.jsonl.tokens.pt").is_file()

    monkeypatch.setattr(
        variants,
        "SWEEP_ROUNDS",
        {"depth": [dict(draft_layers=d, batch_size=2) for d in (1, 2)], "batch": [dict(batch_size=4)]},
    )
    monkeypatch.setattr(sweep, "SWEEP_ROUNDS", variants.SWEEP_ROUNDS)
    with monkeypatch.context() as m:
        fork_steps(m)  # the sweep's runs, and the replay's below; the train step's runs start as programs
        assert cli(toy, "sweep", "--minutes", "0.03") == 0
    depth = json.loads((work / "sweep" / "depth.json").read_text())
    assert len(depth["results"]) == 2 and all(r["returncode"] == 0 and r["tau"] >= 1 for r in depth["results"])
    assert set(json.loads((work / "sweep" / "batch.json").read_text())["choice"]) == {"draft_layers", "batch_size"}

    assert cli(toy, "train", "lilicorr", "dflash", "--minutes", "0.15", "--evals", "2") == 0
    assert cli(toy, "wait", "--minutes", "5") == 0
    plan = json.loads((work / "train_config.json").read_text())
    for name in ("lilicorr", "dflash"):  # ended cleanly: at max_steps, or at max_minutes on this shared CPU
        rows = [json.loads(line) for line in (work / "runs" / name / "metrics.jsonl").read_text().splitlines()]
        assert rows[-1]["step"] == rows[-1]["total_steps"] <= plan["options"]["max_steps"], (
            work / "runs" / name / "train.log"
        ).read_text()[-2000:]
        assert "eval/tau_t0/argmax" in rows[-1] and (work / "runs" / name / "snapshots").is_dir()
    assert cli(toy, "export") == 0
    assert json.loads((work / "drafts" / "dflash" / "config.json").read_text())["architectures"] == ["DFlashDraftModel"]

    assert cli(toy, "--engine", "transformers", "evalgen", "--max-new-tokens", "8") == 0
    outputs = sorted((work / "eval").glob("outputs_*.jsonl"))
    assert [p.name for p in outputs] == [
        "outputs_T0_s0.jsonl",
        "outputs_T1_s0.jsonl",
        "outputs_T1_s1.jsonl",
        "outputs_T1_s2.jsonl",
    ]
    fork_steps(monkeypatch)
    assert cli(toy, "replay", "--drafts", "lilicorr", "dflash") == 0
    cells = json.loads((work / "replay" / "tau.json").read_text())["cells"]
    systems = {c["system"] for c in cells}
    assert systems == {"lilicorr", "lilicorr_viterbi", "lilicorr_argmax", "dflash"}
    t1 = next(c for c in cells if c["system"] == "dflash" and c["set"] == "average" and c["temperature"] == 1.0)
    assert sorted(t1["tau_per_seed"]) == ["0", "1", "2"] or sorted(t1["tau_per_seed"]) == [0, 1, 2]

    launcher = tmp_path / "launcher.py"
    launcher.write_text(LAUNCHER.format(tests=str(ROOT / "tests")))
    launch = f"--server-launch={sys.executable} {launcher}"
    monkeypatch.setattr(speed, "PORT0", free_port_block(len(speed.SYSTEMS)))
    assert cli(toy, launch, "speed", "--concurrency", "1", "2", "--rounds", "2", "--max-tokens", "8") == 0
    runs = work / "speed" / "graphs32"
    rounds = [[json.loads(line) for line in p.read_text().splitlines()] for p in sorted(runs.glob("round*.jsonl"))]
    assert len(rounds) == 2 and all({r["system"] for r in rs} == set(speed.SYSTEMS) for rs in rounds)
    doc = json.loads((runs / "speed_summary.json").read_text())
    one = doc["summary"]["1"]
    assert one["rounds"] == 2 and set(one["tau"]) == set(speed.SYSTEMS) - {"base"}
    lo_mean_hi = one["lilicorr_vs_builtin"]
    assert lo_mean_hi[1] <= lo_mean_hi[0] <= lo_mean_hi[2] and one["lilicorr"] > 0
    assert set(doc["idle_cpu_s"]["c=1,2"]) == set(speed.SYSTEMS) and doc["graphs_to"] == 32
    assert "lilicorr / builtin" in (runs / "speed_table.md").read_text() and (runs / "speed.png").is_file()
    args = json.loads((runs / "speed_run.json").read_text())["server_args"]
    assert all("--sleep-on-idle" in a and "--cuda-graph-max-bs-decode 32" in a for a in args.values())
    assert "--speculative-algorithm DFLASH" in args["builtin"] and "drafts/lilicorr" in args["builtin"]
    assert "--speculative-algorithm DFLASH" in args["dflash_splitkv"] and "drafts/dflash" in args["dflash_splitkv"]
    assert (
        "--speculative-algorithm LILICORR" in args["lilicorr_extend"] and "drafts/lilicorr" in args["lilicorr_extend"]
    )
    env = json.loads((runs / "speed_run.json").read_text())["server_env"]
    assert {s: e.pop("TRITON_CACHE_DIR").split("/")[-2:] for s, e in env.items()} == {
        s: ["triton_cache", s] for s in speed.SYSTEMS
    }
    assert env == {
        **{s: {} for s in speed.SYSTEMS},
        "dflash_splitkv": {"LILICORR_VERIFY_ATTENTION": "split-kv"},
        "lilicorr_extend": {"LILICORR_VERIFY_ATTENTION": "extend"},
    }
    profiles = json.loads((runs / "profile" / "summary.json").read_text())
    assert list(profiles) == ["lilicorr", "builtin", "dflash", "base"] and profiles["dflash"]["steps"] == 12
    request.getfixturevalue("bench_in_process")  # the resumed calls' reports: in this process from here on
    # a second call of the setting adds its concurrencies to the summary (a setting may take several device calls)
    assert (
        cli(toy, launch, "speed", "--concurrency", "3", "--rounds", "2", "--max-tokens", "8", "--profile-steps", "0")
        == 0
    )
    doc = json.loads((runs / "speed_summary.json").read_text())
    assert sorted(doc["summary"], key=int) == ["1", "2", "3"] and sorted(doc["idle_cpu_s"]) == ["c=1,2", "c=3"]
    assert "Python frames: lilicorr - builtin" in (runs / "profile" / "profile.md").read_text()
    # a call that plays the same concurrencies again (a resumed setting) keeps the first call's start-up record
    assert (
        cli(toy, launch, "speed", "--concurrency", "3", "--rounds", "2", "--max-tokens", "8", "--profile-steps", "0")
        == 0
    )
    doc = json.loads((runs / "speed_summary.json").read_text())
    assert sorted(doc["capture_s"]) == sorted(doc["idle_cpu_s"]) == ["c=1,2", "c=3", "c=3 #2"]

    assert cli(toy, "tables") == 0
    results = json.loads((work / "results.json").read_text())
    assert {"lilicorr", "dflash"} <= set(results["sets"]["gsm8k"]) and "tau_t1_std" in results["sets"]["average"][
        "lilicorr"
    ]
    assert set(results["tok_s"]["1"]) == set(speed.SYSTEMS) and (work / "speed.png").is_file()
    assert "Decode rule" in (work / "tables.md").read_text() and (work / "curves.png").is_file()
    assert len(list((work / "OUT").iterdir())) <= 12


def speed_testbed(tmp_path, monkeypatch, launcher_text: str):
    """A WORK with both drafts exported (the stand-in servers read none: the step only checks they were) and the
    testbed's arguments before the step: stand-in servers from `launcher_text` on a free port block."""
    work, evals = tmp_path / "work", tmp_path / "eval_prompts.jsonl"
    evals.write_text("".join(json.dumps(r) + "\n" for r in EVAL))
    for draft in ("dflash", "lilicorr"):
        (work / "drafts" / draft).mkdir(parents=True)
        (work / "drafts" / draft / "config.json").write_text("{}")
    launcher = tmp_path / "launcher.py"
    launcher.write_text(launcher_text.format(tests=str(ROOT / "tests")))
    monkeypatch.setattr(speed, "PORT0", free_port_block(len(speed.SYSTEMS)))
    return work, [
        f"--work={work}",
        f"--target={tmp_path / 'target'}",
        f"--out={work / 'OUT'}",
        f"--eval-prompts={evals}",
        f"--server-launch={sys.executable} {launcher}",
    ]


def test_speed_plays_only_the_chosen_systems(tmp_path, monkeypatch, bench_in_process):
    """--systems base dflash builtin lilicorr (any order): four servers, four systems in the rounds and the summary; a
    set without the four summarized systems is refused, and so is a resumed setting's other set."""
    work, testbed_args = speed_testbed(tmp_path, monkeypatch, LAUNCHER)
    common = [*testbed_args, "speed", "--rounds=2", "--max-tokens=8", "--profile-steps=0"]
    four = ["base", "dflash", "builtin", "lilicorr"]
    assert testbed.main([*common, "--concurrency=1", "--systems", "lilicorr", "base", "builtin", "dflash"]) == 0
    runs = work / "speed" / "graphs32"
    assert sorted(p.name for p in (runs / "logs").glob("server-*.log")) == sorted(f"server-{s}.log" for s in four)
    record = json.loads((runs / "speed_run.json").read_text())
    assert record["systems"] == four and list(record["server_args"]) == four
    rounds = [[json.loads(line) for line in p.read_text().splitlines()] for p in sorted(runs.glob("round*.jsonl"))]
    assert len(rounds) == 2 and all({r["system"] for r in rs} == set(four) for rs in rounds)
    doc = json.loads((runs / "speed_summary.json").read_text())
    one = doc["summary"]["1"]
    assert one["rounds"] == 2 and set(one["tok_s_per_round"]) == set(four) and "lilicorr_vs_builtin" in one
    assert list(doc["idle_cpu_s"]["c=1"]) == four and set(doc["capture_s"]["c=1"]) <= set(four)
    assert all(m["cold_cache"] for m in doc["capture_s"]["c=1"].values())
    assert doc["late_compiles"]["c=1"] == {s: {} for s in four}
    assert (
        "Triton compiles after serving started (SGLang's warning), this call's servers: base 0"
        in (runs / "speed_table.md").read_text()
    )
    # the setting resumes with the same set (another concurrency), in any order; a server whose Triton cache holds
    # kernels starts warm, and its record says so
    (work / "speed" / "triton_cache" / "lilicorr").mkdir(parents=True, exist_ok=True)
    (work / "speed" / "triton_cache" / "lilicorr" / "kernel.cubin").write_text("x")
    assert testbed.main([*common, "--concurrency=2", "--systems", *reversed(four)]) == 0
    doc = json.loads((runs / "speed_summary.json").read_text())
    assert sorted(doc["summary"], key=int) == ["1", "2"]
    assert {s: m["cold_cache"] for s, m in doc["capture_s"]["c=2"].items()} == {s: s != "lilicorr" for s in four}
    # a set without a summarized system, and another set than the setting's rounds, are refused before any server
    with pytest.raises(SystemExit, match="lacks lilicorr.*--systems base dflash builtin lilicorr$"):
        testbed.main([*common, "--concurrency=1", "--systems", "base", "dflash", "builtin"])
    with pytest.raises(SystemExit, match="holds rounds of --systems base dflash builtin lilicorr .*another --work$"):
        testbed.main([*common, "--concurrency=1"])
    assert len(list((runs / "logs").glob("server-*.log"))) == 4
    # a setting whose rounds an earlier call played before --systems existed played all six
    (tmp_path / "old" / "runs").mkdir(parents=True)
    (tmp_path / "old" / "runs" / "c1_r1_base.jsonl").write_text("")
    (tmp_path / "old" / "speed_run.json").write_text(json.dumps({"setting": "graphs32"}))
    assert speed.earlier_systems(tmp_path / "old") == list(speed.SYSTEMS)
    assert speed.earlier_systems(tmp_path / "new") is None


def test_speed_serves_the_viterbi_walk_only_where_named(tmp_path, monkeypatch, bench_in_process):
    """--systems ... lilicorr_viterbi: LILICORR on the same draft with LILICORR_WALK=viterbi, paired with the
    greedy walk in the same rounds; the default set stays the six."""
    work, testbed_args = speed_testbed(tmp_path, monkeypatch, LAUNCHER)
    five = ["base", "dflash", "builtin", "lilicorr", "lilicorr_viterbi"]
    step = ["speed", "--rounds=2", "--max-tokens=8", "--profile-steps=0", "--concurrency=1"]
    assert (
        testbed.main([*testbed_args, *step, "--systems", "lilicorr_viterbi", "base", "dflash", "builtin", "lilicorr"])
        == 0
    )
    runs = work / "speed" / "graphs32"
    record = json.loads((runs / "speed_run.json").read_text())
    assert record["systems"] == five
    args = record["server_args"]["lilicorr_viterbi"]
    assert "--speculative-algorithm LILICORR" in args and "drafts/lilicorr " in args + " "
    env = {s: {k: v for k, v in e.items() if k != "TRITON_CACHE_DIR"} for s, e in record["server_env"].items()}
    assert env == {**{s: {} for s in five[:4]}, "lilicorr_viterbi": {"LILICORR_WALK": "viterbi"}}
    one = json.loads((runs / "speed_summary.json").read_text())["summary"]["1"]
    assert "lilicorr_vs_lilicorr_viterbi" in one and "lilicorr_viterbi" in one["tau"]
    assert "LILICORR Viterbi walk tok/s" in (runs / "speed_table.md").read_text()
    assert "lilicorr_viterbi" not in speed.chosen_systems(None)


def test_speed_rounds_leave_the_tau_check_its_time(tmp_path, monkeypatch, bench_in_process):
    """--tau-check: the rounds stop TAU_CHECK_S a speculative server earlier than without it, and the tau check
    (T = 0, every evaluation prompt through each speculative server) keeps the time the profile and the report need."""
    from benchmarks.served import paired
    from benchmarks.testbed import common

    work, testbed_args = speed_testbed(tmp_path, monkeypatch, LAUNCHER)
    reserves, tau_calls = [], []
    play_rounds, served_tau = paired.play_rounds, common.served_tau

    def recording_rounds(urls, prompts, plan, *args, **kwargs):
        reserves.append(plan.reserve_s)
        return play_rounds(urls, prompts, plan, *args, **kwargs)

    def recording_tau(urls, runs, **kwargs):
        tau_calls.append((runs, kwargs["reserve_s"], kwargs["concurrency"]))
        return served_tau(urls, runs, **kwargs)

    monkeypatch.setattr(paired, "play_rounds", recording_rounds)
    monkeypatch.setattr(common, "served_tau", recording_tau)
    monkeypatch.setenv("TESTBED_DEADLINE", str(time.time() + 3600))
    five = ["base", "dflash", "builtin", "lilicorr", "lilicorr_viterbi"]
    step = ["speed", "--rounds=1", "--max-tokens=8", "--profile-steps=0", "--concurrency=1", "--systems", *five]
    assert testbed.main([*testbed_args, *step, "--tau-check"]) == 0
    assert reserves == [60.0 + 4 * speed.TAU_CHECK_S] and tau_calls == [({0.0: (0,)}, 60.0, 8)]
    runs = work / "speed" / "graphs32"
    tau = [json.loads(line) for line in (runs / "tau_check.jsonl").read_text().splitlines() if line.strip()]
    assert {r["system"] for r in tau} == set(five) - {"base"}
    assert testbed.main([*testbed_args, *step]) == 0  # the same setting resumed, no tau check: the usual reserve
    assert reserves[1:] == [60.0] and len(tau_calls) == 1


def test_served_tau_stops_at_the_deadline_and_lists_what_it_left(tmp_path, monkeypatch):
    """common.served_tau: no tau for base; each run ends reserve_s before the deadline (the bench client's timeout),
    a run it cut says so, and one it leaves no time for is not started but listed, so a later call resumes the file."""
    from benchmarks.served.paired import Deadline
    from benchmarks.testbed import common

    now, calls = [0.0], []

    def fake_bench(*argv, cwd, timeout=None):
        flag = argv.index
        calls.append(
            (
                argv[flag("--system") + 1],
                argv[flag("--temperature") + 1],
                argv[flag("--seeds") + 1 : flag("--max-tokens")],
                timeout,
                cwd,
            )
        )
        now[0] += 100.0
        return 124 if len(calls) == 2 else 0

    monkeypatch.setattr(common, "bench", fake_bench)
    urls = {"base": "http://b", "dflash": "http://d", "lilicorr": "http://l"}
    runs = {0.0: (0,), 1.0: (0, 1, 2)}
    where = {"eval_prompts": tmp_path / "eval.jsonl", "results": tmp_path / "tau.jsonl", "concurrency": 8}
    failed = common.served_tau(
        urls, runs, **where, max_tokens=16, deadline=Deadline(260.0, clock=lambda: now[0]), reserve_s=60.0
    )
    assert calls == [("dflash", "0", ("0",), 200.0, tmp_path), ("dflash", "1", ("0", "1", "2"), 100.0, tmp_path)]
    assert failed == [
        "dflash tau at T = 1: exit 124 (deadline)",
        "lilicorr tau at T = 0: not run, too near the deadline (call the step again)",
        "lilicorr tau at T = 1: not run, too near the deadline (call the step again)",
    ]
    calls.clear()
    assert common.served_tau(urls, runs, **where, max_tokens=16, deadline=None, reserve_s=60.0) == [
        "dflash tau at T = 1: exit 124 (deadline)"
    ]
    assert [(c[0], c[1], c[3]) for c in calls] == [(s, t, None) for s in ("dflash", "lilicorr") for t in ("0", "1")]


# LAUNCHER that first appends what it was started with ({port, args}) to $LAUNCHES, one JSON line per server.
RECORDING_LAUNCHER = """
import json, os, sys
sys.path.insert(0, {tests!r})
from stub_server import StubServer
with open(os.environ["LAUNCHES"], "a") as f:
    f.write(json.dumps({{"port": int(os.environ["PORT"]), "args": os.environ["SERVER_ARGS"]}}) + "\\n")
spec = "--speculative-algorithm" in os.environ["SERVER_ARGS"]
StubServer(speculative=spec, accept=3, min_latency_s=0.002, port=int(os.environ["PORT"])).serve_forever()
"""


def test_speed_on_flashinfer_reaches_every_server_and_keeps_its_rounds_apart(tmp_path, monkeypatch, bench_in_process):
    """--attention-backend flashinfer --sampling-backend flashinfer: every server of the speed step gets
    both over --server-args', the rounds go to WORK/speed/graphs32_flashinfer, a Triton call of the same setting to
    WORK/speed/graphs32, neither summary holds the other's rounds, and a call whose --server-args differ from those a
    setting's rounds were served with is refused before any server starts."""
    from benchmarks.testbed.common import SERVER_ARGS, backends_of, with_backends

    launches = tmp_path / "launches.jsonl"
    monkeypatch.setenv("LAUNCHES", str(launches))
    work, common = speed_testbed(tmp_path, monkeypatch, RECORDING_LAUNCHER)
    four = ["base", "dflash", "builtin", "lilicorr"]
    step = ["speed", "--rounds=1", "--max-tokens=8", "--profile-steps=0", "--concurrency=1", "--systems", *four]
    flashinfer = ["--attention-backend", "flashinfer", "--sampling-backend=flashinfer"]
    assert testbed.main([*common, *flashinfer, *step]) == 0
    started = [json.loads(line) for line in launches.read_text().splitlines()]
    assert len(started) == 4
    for launch in started:
        args = launch["args"].split()
        assert args.count("--attention-backend") == 1 and args[args.index("--attention-backend") + 1] == "flashinfer"
        assert args.count("--sampling-backend") == 1 and args[args.index("--sampling-backend") + 1] == "flashinfer"
        assert "--grammar-backend none" in launch["args"] and "--cuda-graph-max-bs-decode 32" in launch["args"]
    assert sum("--speculative-draft-attention-backend triton" in launch["args"] for launch in started) == 3
    fi = work / "speed" / "graphs32_flashinfer"
    doc = json.loads((fi / "speed_summary.json").read_text())
    assert doc["folder"] == "graphs32_flashinfer" and doc["setting"] == "graphs32"
    assert doc["backends"] == {"attention": "flashinfer", "sampling": "flashinfer"}
    assert json.loads((fi / "speed_run.json").read_text())["base_server_args"] == doc["server_args"]
    assert (work / "OUT" / "speed_graphs32_flashinfer.tar.gz").is_file() and not (work / "speed" / "graphs32").exists()
    # the kit's Triton rounds of the same setting: their own folder, their own summary
    launches.unlink()
    assert testbed.main([*common, *step]) == 0
    triton = json.loads((work / "speed" / "graphs32" / "speed_summary.json").read_text())
    assert triton["backends"] == {"attention": "triton", "sampling": "pytorch"} and triton["folder"] == "graphs32"
    assert all("--attention-backend triton" in json.loads(x)["args"] for x in launches.read_text().splitlines())
    for folder in (fi, work / "speed" / "graphs32"):
        rounds = [json.loads(line) for p in folder.glob("round*.jsonl") for line in p.read_text().splitlines()]
        summary = json.loads((folder / "speed_summary.json").read_text())["summary"]
        assert len(rounds) == 4 * len(speed.speed_prompts(EVAL)) and summary["1"]["rounds"] == 1
    # resuming the flashinfer setting with other server args (another pool) is refused, nothing started
    launches.unlink()
    with pytest.raises(SystemExit, match="holds rounds served with --server-args .* another --work$"):
        testbed.main([*common, "--server-args", SERVER_ARGS.replace("0.85", "0.8"), *flashinfer, *step])
    assert not launches.exists()
    # the flags' helpers: --flag=value and --flag value, the last one given; the kit's where none is named
    assert backends_of("--attention-backend=fa3 --x 1") == {"attention": "fa3", "sampling": "pytorch"}
    assert backends_of(with_backends("--attention-backend=triton --y", "flashinfer")) == {
        "attention": "flashinfer",
        "sampling": "pytorch",
    }
    assert speed.setting_folder("graphs16", "--attention-backend fa3") == "graphs16_fa3"
    assert speed.setting_folder("graphs16", "--grammar-backend none") == "graphs16"


def test_speed_order_rotates_and_prompts_are_long_form():
    from benchmarks.served.paired import rotation

    systems = ["base", "dflash", "builtin", "lilicorr", "dflash_splitkv", "lilicorr_extend"]
    assert list(speed.SYSTEMS) == systems
    assert [rotation(speed.SYSTEMS, r) for r in (1, 6)] == [systems[1:] + systems[:1], systems]
    rows = [{"id": f"writingbench/{i}", "set": "writingbench", "text": f"w{i}"} for i in range(24)]
    rows += [
        {"id": f"mtbench/{i}", "set": "mtbench", "messages": [{"role": "user", "content": f"m{i}"}] * 2}
        for i in range(81, 161)
    ]
    chosen = speed.speed_prompts(rows)
    assert len(chosen) == speed.SPEED_PROMPTS and chosen[-1]["id"] == "mtbench/88/1"
    assert [speed.prompts_for(c) for c in (1, 4, 8, 32)] == [16, 16, 32, 32]


def test_sweep_choice_keeps_to_shippable_depths_and_prefers_cheap_ties():
    runs = [
        dict(draft_layers=1, batch_size=32, tau=2.00),
        dict(draft_layers=2, batch_size=32, tau=2.005),
        dict(draft_layers=3, batch_size=32, tau=2.6),
        dict(draft_layers=2, batch_size=64, tau=None),
    ]
    assert variants.choose(runs, "depth") == runs[0]  # depth 3 would not ship; depth 2 is within 0.5 %
    assert variants.drafts_bytes(2) <= variants.SHIP_LIMIT < variants.drafts_bytes(3)


def test_bad_settings_are_named(toy, tmp_path):
    _, target, evals = toy
    fresh = (tmp_path / "work", target, evals)
    (tmp_path / "work" / "data").mkdir(parents=True)
    (tmp_path / "work" / "data" / "train.jsonl").write_text("")
    with pytest.raises(SystemExit, match="unknown key"):
        cli(fresh, "--override=widht=3", "sweep")
    with pytest.raises(SystemExit, match="unknown variant"):
        cli(fresh, "train", "vanilla")
    with pytest.raises(SystemExit, match="no training data"):
        testbed.main(["--work", str(tmp_path / "empty"), "--target", str(target), "sweep"])
    with pytest.raises(SystemExit, match="no sweep result"):
        cli(fresh, "train", "lilicorr")
    with pytest.raises(SystemExit, match="python -m benchmarks testbed prompts"):
        testbed.eval_sets.read(tmp_path / "missing.jsonl")


def test_train_with_init_starts_each_variant_from_its_draft(toy, tmp_path, monkeypatch):
    """`train ... --init DIR`: the plan records DIR/<variant> and each run gets --init-from it."""
    _, target, evals = toy
    work = tmp_path / "work"
    (work / "data").mkdir(parents=True)
    (work / "data" / "train.jsonl").write_text("")
    pick = {"draft_layers": 2, "batch_size": 4, "step_ms": 100.0, "eval_s": 1.0}
    (work / "sweep").mkdir()
    (work / "sweep" / "batch.json").write_text(
        json.dumps({"choice": {"draft_layers": 2, "batch_size": 4}, "results": [pick]})
    )
    started = []

    class Proc:
        pid = 2**22 + 1  # no such process: `train` again would start it anew

    devices = []
    monkeypatch.setattr(
        train, "start", lambda cmd, log, gpus=None, append=False: started.append(cmd) or devices.append(gpus) or Proc()
    )
    monkeypatch.setattr(train, "gpus", lambda: 1)  # one GPU, two variants: they share it
    assert (
        cli((work, target, evals), "train", "lilicorr", "dflash", "--minutes", "1", "--init", str(tmp_path / "drafts"))
        == 0
    )
    plan = json.loads((work / "train_config.json").read_text())
    assert plan["init"] == {n: str(tmp_path / "drafts" / n) for n in ("lilicorr", "dflash")}
    for cmd, name in zip(started, ("lilicorr", "dflash")):
        assert cmd[cmd.index("--init-from") + 1] == str(tmp_path / "drafts" / name)
    assert devices == [[0], [0]]
    alone = int(train.RATE_MARGIN * (60 - 8 * 1.0) * 1000 / 100.0)  # the steps one run alone would take in a minute
    assert plan["options"]["max_steps"] == int(train.RATE_MARGIN * 0.5 * (60 - 8 * 1.0) * 1000 / 100.0) < alone


def test_tables_continue_the_curves_of_warm_started_runs(tmp_path):
    """`tables --after EARLIER...`: each run's steps follow the last one's; the evaluation-set tau of every run is
    drawn against the steps so far; a folder without metrics is named."""

    def run_folder(name, steps, tau):
        d = tmp_path / name
        d.mkdir()
        for v in ("lilicorr", "dflash"):
            rows = [{"step": s, "eval/tau_t0/argmax": 1.5, "eval/top1_draft/slot1": 0.5} for s in steps]
            (d / f"metrics_{v}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        cells = [
            {"set": s, "system": v, "temperature": 0, "tau": tau}
            for v in ("lilicorr", "dflash")
            for s in ("gsm8k", "average")
        ]
        (d / "tau.json").write_text(json.dumps({"cells": cells}))
        return d

    first, second = run_folder("first", [10, 20], 1.8), run_folder("second", [5, 15], 2.0)
    joined, starts = report.lineage([{"lilicorr": [{"step": 10}, {"step": 20}]}], {"lilicorr": [{"step": 5}]})
    assert [r["step"] for r in joined["lilicorr"]] == [10, 20, 25] and starts == [20]
    assert testbed.main(["tables", "--results", str(first)]) == 0  # the earlier run's results.json
    assert testbed.main(["tables", "--results", str(second), "--after", str(first)]) == 0
    assert (second / "curves.png").is_file() and (second / "tau_by_run.png").is_file()
    with pytest.raises(SystemExit, match="no metrics_<variant>.jsonl"):
        testbed.main(["tables", "--results", str(second), "--after", str(tmp_path / "missing")])
    for v in ("lilicorr", "dflash"):  # a result folder keeps its logs gzipped: read the same
        log = first / f"metrics_{v}.jsonl"
        (first / f"metrics_{v}.jsonl.gz").write_bytes(gzip.compress(log.read_bytes()))
        log.unlink()
    assert report.load(first, "metrics_lilicorr.jsonl") == [
        {"step": s, "eval/tau_t0/argmax": 1.5, "eval/top1_draft/slot1": 0.5} for s in (10, 20)
    ]
    assert testbed.main(["tables", "--results", str(second), "--after", str(first)]) == 0


def test_speed_call_keys_number_a_repeated_call():
    assert speed.call_key([1, 4], {}) == "c=1,4"
    assert speed.call_key([1], {"c=1,4": {}}) == "c=1"
    assert speed.call_key([1], {"c=1": {}, "c=1,4": {}}) == "c=1 #2"
    assert speed.call_key([1], {"c=1": {}, "c=1 #2": {}}) == "c=1 #3"


def test_equal_budget_four_heads_from_one_draft_replayed_served_and_summarized(
    toy, tmp_path, monkeypatch, steps_forked, bench_in_process
):
    """The equal-budget comparison at toy scale: a DFlash draft (the shipped one's stand-in), then dflash, lilicorr,
    domino and dspark continued from it (`train --init-draft`) for the same steps at one global batch; each exported as
    its server reads it, replayed (a corrector's own block named as the system), served side by side by the algorithm
    that serves it (`compare`, stand-in servers), and the summary's equal-budget keys merged."""
    from test_train import write_conversations, write_held_out_turns

    from benchmarks.served import baselines_summary
    from sglang_lilicorr.errors import UsageError
    from benchmarks.testbed import compare

    _, target, evals = toy
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    first, work = tmp_path / "first", tmp_path / "work"
    for w in (first, work):
        (w / "data").mkdir(parents=True)
        write_conversations(w / "data" / "train.jsonl", 12, seed=len(w.name))
        write_held_out_turns({"llama": target}, w / "data" / "heldout.jsonl")
        (w / "sweep").mkdir()
        pick = {"draft_layers": 1, "batch_size": 2, "step_ms": 100.0, "eval_s": 1.0}
        (w / "sweep" / "batch.json").write_text(
            json.dumps({"choice": {"draft_layers": 1, "batch_size": 2}, "results": [pick]})
        )
    assert cli((first, target, evals), "train", "dflash", "--steps", "2", "--evals", "1") == 0
    assert cli((first, target, evals), "wait", "--minutes", "5") == 0
    assert cli((first, target, evals), "export") == 0
    shipped = first / "drafts" / "dflash"

    four = ["train", *variants.EQUAL_BUDGET, "--steps", "3", "--evals", "1", "--init-draft", str(shipped)]
    with pytest.raises(SystemExit, match="not a positive multiple of the batch size 2"):
        cli((work, target, evals), *four, "--global-batch", "3")
    with pytest.raises(SystemExit, match="--init and --init-draft both given"):
        cli((work, target, evals), *four, "--init", str(first / "drafts"))
    assert cli((work, target, evals), *four, "--global-batch", "4") == 0
    plan = json.loads((work / "train_config.json").read_text())
    assert plan["global_batch"] == 4 and plan["options"]["grad_accum"] == 2 and plan["options"]["max_steps"] == 3
    assert plan["init"] == {n: str(shipped) for n in variants.EQUAL_BUDGET}
    assert cli((work, target, evals), "wait", "--minutes", "8") == 0
    for name in variants.EQUAL_BUDGET:
        rows = [json.loads(line) for line in (work / "runs" / name / "metrics.jsonl").read_text().splitlines()]
        assert rows[-1]["step"] == 3, (work / "runs" / name / "train.log").read_text()[-2000:]
    assert cli((work, target, evals), "export") == 0
    architectures = {n: json.loads((work / "drafts" / n / "config.json").read_text()) for n in variants.EQUAL_BUDGET}
    assert architectures["dspark"]["architectures"] == ["DSparkDraftModel"]
    assert architectures["domino"]["dflash_config"]["projector_type"] == "domino"

    assert cli((work, target, evals), "--engine", "transformers", "evalgen", "--max-new-tokens", "8") == 0
    assert cli((work, target, evals), "replay", "--drafts", *variants.EQUAL_BUDGET) == 0
    replay = json.loads((work / "replay" / "tau.json").read_text())
    assert {c["system"] for c in replay["cells"]} == {
        *variants.EQUAL_BUDGET,
        "lilicorr_argmax",
        "lilicorr_viterbi",
        "domino_argmax",
        "dspark_argmax",
    }

    launcher = tmp_path / "launcher.py"
    launcher.write_text(LAUNCHER.format(tests=str(ROOT / "tests")))
    monkeypatch.setattr(compare, "PORT0", free_port_block(len(compare.SYSTEMS)))
    args = ("compare", "--concurrency", "1", "--rounds", "2", "--max-tokens", "8", "--tau-concurrency", "2")
    assert cli((work, target, evals), f"--server-launch={sys.executable} {launcher}", *args) == 0
    served = work / "compare" / "rounds_tau"
    run = json.loads((served / "compare_run.json").read_text())
    assert "--speculative-algorithm DSPARK" in run["server_args"]["dspark"]
    assert (
        "--speculative-algorithm DFLASH" in run["server_args"]["domino"]
        and "drafts/domino" in run["server_args"]["domino"]
    )
    assert "--speculative-algorithm LILICORR" in run["server_args"]["lilicorr"] and not run["failed"]
    rounds = json.loads((served / "report" / "summary.json").read_text())
    assert {c["system"] for c in rounds["cells"]} == set(compare.SYSTEMS)
    assert all("paired" in c for c in rounds["cells"] if c["system"] in ("lilicorr", "domino", "dspark"))
    report_md = (served / "tau_served" / "report.md").read_text()
    assert "T=1" in report_md and all(s in report_md for s in variants.EQUAL_BUDGET)

    summary = tmp_path / "baselines" / "summary.json"
    summary.parent.mkdir()
    summary.write_text(json.dumps({"cost_8b": {"dflash": {"1": 9.0}}, "viterbi": {"per_block_ms_8b": 10.0}}))
    files = ["--replay", str(work / "replay" / "tau.json"), "--rounds", str(served / "report" / "summary.json")]
    assert baselines_summary.main([*files, "--budget", str(served / "budget.json"), "--summary", str(summary)]) == 0
    doc = json.loads(summary.read_text())
    assert doc["cost_8b"] == {"dflash": {"1": 9.0}} and doc["viterbi"]["per_block_ms_8b"] == 10.0  # kept
    assert set(doc["tau"]["average"]) == set(variants.EQUAL_BUDGET) and set(doc["tau"]["gsm8k"]["domino"]) == {
        "t0",
        "t1",
    }
    assert set(doc["tok_s"]) == {"1"} and set(doc["tok_s"]["1"]) == set(variants.EQUAL_BUDGET)
    assert doc["viterbi"]["tau_t0"] >= 1.0
    budget = json.loads((served / "budget.json").read_text())
    data = hashlib.sha256((work / "data" / "train.jsonl").read_bytes()).hexdigest()  # the data the four trained on
    assert {budget[n]["data_sha256"] for n in variants.EQUAL_BUDGET} == {data} and doc["plan"]["data"] == data
    assert doc["plan"]["steps"] == 3 and (summary.parent / "summary.md").is_file()
    budget["domino"]["step"] = 2
    with pytest.raises(UsageError, match="the drafts' step differ"):
        baselines_summary.check_budget(budget)
    budget["domino"]["step"] = 3
    with pytest.raises(UsageError, match=r"no tau of \['dspark'\]"):
        baselines_summary.tau_keys({"cells": [c for c in replay["cells"] if c["system"] != "dspark"]})


STARTUP_LAUNCHER = """
import os, sys
sys.path.insert(0, {tests!r})
from stub_server import StubServer
ours = "LILICORR" in os.environ["SERVER_ARGS"]
print("[x] Capture draft verify CUDA graph end. bs=[1, 2], elapsed=%.2f s, mem usage=0.1 GB." % (4.0 if ours else 2.0))
print("[x] Engine startup timings (s): load_weight=0.5, scheduler_e2e=%.2f, cuda_graph={{}}" % (6.0 if ours else 4.0))
if ours:
    print("[x] select, ...: 34 Triton kernels compiled concurrently (or read ...) on 8 threads in 1.5 s.")
print("cache", os.environ["TRITON_CACHE_DIR"], flush=True)
os.makedirs(os.environ["TRITON_CACHE_DIR"], exist_ok=True)
StubServer(speculative=True, accept=3, port=int(os.environ["PORT"])).serve_forever()
"""


def test_startup_starts_each_server_alone_cold_and_resumes(tmp_path, monkeypatch):
    from benchmarks.testbed import startup

    work = tmp_path / "work"
    for v in ("dflash", "lilicorr"):
        (work / "drafts" / v).mkdir(parents=True)
        (work / "drafts" / v / "config.json").write_text("{}")
    launcher = tmp_path / "launcher.py"
    launcher.write_text(STARTUP_LAUNCHER.format(tests=str(ROOT / "tests")))
    monkeypatch.setattr(startup, "PORT0", free_port_block(1))
    base = ["--work", str(work), "--target", str(tmp_path), "--out", str(tmp_path / "OUT")]
    launch = f"--server-launch={sys.executable} {launcher}"
    assert testbed.main([*base, launch, "startup", "--rounds", "2"]) == 0
    starts = [json.loads(line) for line in (work / "startup" / "starts.jsonl").read_text().splitlines()]
    # one server at a time, rotated order, each start's own log and an empty Triton cache, removed after
    assert [(s["system"], s["round"]) for s in starts] == [
        ("builtin", 1),
        ("lilicorr", 1),
        ("lilicorr", 2),
        ("builtin", 2),
    ]
    log = (work / "startup" / "logs" / "server-lilicorr_r2.log").read_text()
    assert "LILICORR" not in log and "triton_cache/lilicorr_r2" in log
    assert not any((work / "startup" / "triton_cache").iterdir())
    assert all(s["ready_s"] > 0 and s["total"] == (4.0 if s["system"] == "lilicorr" else 2.0) for s in starts)
    doc = json.loads((work / "startup" / "startup.json").read_text())
    assert doc["median"]["lilicorr"]["scheduler_e2e"] == 6.0 and doc["starts"] == {"builtin": 2, "lilicorr": 2}
    assert doc["over_builtin"]["lilicorr"]["scheduler_e2e"] == 1.5 and doc["over_builtin"]["lilicorr"]["total"] == 2.0
    assert doc["median"]["lilicorr"]["precompile"] == 1.5 and "precompile" not in doc["median"]["builtin"]
    assert "| lilicorr | 2 | 6.0 | 4.0 | 1.5 | 0.5 |" in (work / "startup" / "startup.md").read_text()
    assert "| builtin | 2 | 4.0 | 2.0 | - | 0.5 |" in (work / "startup" / "startup.md").read_text()
    assert (tmp_path / "OUT" / "startup.json").is_file()
    # a later call resumes: only the starts not yet made; one the deadline leaves no time for is left, exit 4
    monkeypatch.setenv("TESTBED_DEADLINE", "0")
    assert testbed.main([*base, launch, "startup", "--rounds", "3"]) == 4
    monkeypatch.delenv("TESTBED_DEADLINE")
    assert testbed.main([*base, launch, "startup", "--rounds", "3"]) == 0
    starts = [json.loads(line) for line in (work / "startup" / "starts.jsonl").read_text().splitlines()]
    assert [(s["system"], s["round"]) for s in starts[4:]] == [("builtin", 3), ("lilicorr", 3)]
    with pytest.raises(SystemExit):
        testbed.main([*base, launch, "startup", "--systems", "nonesuch"])
