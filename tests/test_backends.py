"""The flashinfer run (benchmarks/device/backends.sh), on the CPU with stand-ins: the backends summary
(benchmarks/served/backends_summary.py) from a run's files and the committed Triton results, its one-line errors for
missing and mismatched inputs; benchmarks/device/gpu_check.sh giving every server the backends ATTN_BACKEND /
SAMPLING_BACKEND name (and refusing flashinfer without the package); benchmarks/device/backends.sh's steps wired to
gpu_check.sh, testbed.sh and flashinfer.sh (stand-ins that record what they were asked), its results layout, its exits
and its carry check."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from benchmarks.served import backends_summary as bs

ROOT = Path(__file__).resolve().parents[1]
DEVICE = ROOT / "benchmarks" / "device"
FI = {"attention": "flashinfer", "sampling": "flashinfer"}
SERVER_ARGS_LINE = (
    "[2026-11-29 10:00:00] server_args={'model_path': '/tmp/smol/model', 'prefill_attention_backend': None, "
    "'attention_backend': '%s', 'sampling_backend': '%s', 'speculative_draft_attention_backend': 'triton'}\n"
)


def cell(base: float, lilicorr: float, block: float, rounds: int = 5) -> dict:
    return {
        "base": base,
        "dflash": base / 2,
        "builtin": base / 2,
        "lilicorr": lilicorr,
        "lilicorr_vs_base": [
            round(lilicorr / base, 4),
            round(lilicorr / base, 4) - 0.05,
            round(lilicorr / base, 4) + 0.05,
        ],
        "block_over_decode": {"dflash": 2.6, "builtin": 2.9, "lilicorr": block},
        "rounds": rounds,
    }


def make_run(run: Path, attention: str = "flashinfer", off: int = 0, responses: int = 88) -> Path:
    """What backends.sh's calls bring back, unpacked into one folder."""
    (run / "greedy").mkdir(parents=True)
    (run / "greedy" / "summary.txt").write_text(
        f"[t+0s] backends: --attention-backend {attention} --sampling-backend flashinfer "
        "(the draft's attention: triton)\n"
        "125 responses (88 greedy) -> /root/out/greedy/lilicorr.json\nCLIENT_CHECK PASS\n"
        f"/root/out/greedy/lilicorr.json: {responses} greedy responses, 3201 tokens, {off} with a token that is not "
        "the target's greedy choice beyond 2 bf16 ulp, 50 near-tie tokens within it\n"
        f"GREEDY_CHECK {'PASS' if not off else 'FAIL'}\n"
        "[t+300s] DRAFT_GRAPH_CHECK PASS: LiLiCorr proposal captured in the draft CUDA graph\n"
    )
    (run / "greedy" / "lilicorr.log").write_text(SERVER_ARGS_LINE % (attention, "flashinfer"))
    (run / "t1").mkdir()
    positions = {str(j): {"n": 8000, "chi2": 20.0, "dof": 19, "p": p} for j, p in ((1, 0.2), (2, 0.05), (16, 0.6))}
    verification = "[x] LILICORR verification: T = 0 greedy; T > 0 exact rejection sampling (SGLang's DFlash sampling)"
    (run / "t1" / "sampling_summary.json").write_text(
        json.dumps({"lilicorr": {"positions": positions, "verification": verification, "tau_t1": {}}})
    )
    (run / "t1" / "lilicorr.log").write_text(SERVER_ARGS_LINE % (attention, "flashinfer"))
    speed = run / "speed" / "graphs32_flashinfer"
    speed.mkdir(parents=True)
    summary = {c: cell(600.0 * int(c), 450.0 * int(c), 2.0) for c in ("1", "4", "8", "16", "32")}
    (speed / "speed_summary.json").write_text(
        json.dumps(
            {
                "setting": "graphs32",
                "folder": speed.name,
                "backends": {**FI, "attention": attention},
                "summary": summary,
            }
        )
    )
    return run


def summarize(run: Path, out: Path, *extra: str) -> int:
    return bs.main(
        ["--run", str(run), "--card", "H200 (nvidia-h200)", "--commit", "abc1234", "--out", str(out), *extra]
    )


def test_the_summary_holds_both_combinations_each_with_its_cards_and_commits(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(ROOT)  # the committed Triton results are the defaults, read from the checkout's root
    run, out = make_run(tmp_path / "run"), tmp_path / "backends"
    out.mkdir()
    (out / "summary.json").write_text(json.dumps({"fa3/triton": {"kept": True}}))
    assert summarize(run, out) == 0
    doc = json.loads((out / "summary.json").read_text())
    assert list(doc) == ["fa3/triton", "flashinfer/triton", "triton/triton"]  # another combination's entry is kept
    assert (out / "summary.png").stat().st_size > 1000  # both combinations' speedup and block against c
    fi, tri = doc["flashinfer/triton"], doc["triton/triton"]
    assert (fi["target"], fi["draft"], fi["sampling"], fi["greedy_ok"]) == ("flashinfer", "triton", "flashinfer", True)
    assert fi["greedy"] == {
        "responses": 88,
        "tokens": 3201,
        "off": 0,
        "near_ties": 50,
        "tol_ulps": 2.0,
        "draft_graph": True,
    }
    assert fi["t1_min_p"] == 0.05 and fi["t1_p"] == {"1": 0.2, "2": 0.05, "16": 0.6}
    assert list(fi["tok_s"]) == ["1", "4", "8", "16", "32"] and fi["tok_s"]["1"]["lilicorr"] == 450.0
    assert set(fi["tok_s"]["4"]) == set(bs.SYSTEMS) and fi["block_over_decode"]["1"] == 2.0
    assert (fi["card"], fi["commit"]) == ("H200 (nvidia-h200)", "abc1234") and fi["rounds"]["32"] == 5
    # Triton: the committed results, each part's card and commit named
    committed = json.loads((ROOT / bs.TRITON_SPEED).read_text())
    assert tri["greedy_ok"] is True and tri["greedy"]["responses"] == 88 and tri["greedy"]["off"] == 0
    assert tri["t1_min_p"] == pytest.approx(0.124443, abs=1e-5) and tri["sampling"] == "pytorch"
    assert tri["tok_s"]["1"]["lilicorr"] == committed["1"]["lilicorr"]
    assert tri["block_over_decode"]["1"] == committed["1"]["block_over_decode"]["lilicorr"]
    assert tri["measured"]["greedy"] == "H100 80GB HBM3, 0754956" and tri["measured"]["t1"] == "H100 80GB HBM3, ee73f57"
    assert tri["measured"]["tok_s"]["1"] == committed["measured"]["1"]
    assert tri["card"] == "H100 80GB HBM3, H200 (nvidia-h200)" and tri["commit"].startswith("0754956, ee73f57, ")
    text = (out / "summary.md").read_text()
    assert "| flashinfer / triton | flashinfer | pass: 88 responses, 0 off (3201 tokens)" in text
    assert "the c = 1 target (at least Triton's) met" in text and "README row:" in text
    assert text in capsys.readouterr().out


def test_the_same_machines_triton_rounds_replace_the_committed_cells_they_measured(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    run = make_run(tmp_path / "run")
    (run / "speed" / "graphs32").mkdir()
    (run / "speed" / "graphs32" / "speed_summary.json").write_text(
        json.dumps({"setting": "graphs32", "summary": {"1": cell(600.0, 500.0, 2.1)}})  # from before `backends`
    )
    assert summarize(run, tmp_path / "out") == 0
    tri = json.loads((tmp_path / "out" / "summary.json").read_text())["triton/triton"]
    assert tri["tok_s"]["1"]["lilicorr"] == 500.0 and tri["measured"]["tok_s"]["1"] == "H200 (nvidia-h200), abc1234"
    assert tri["measured"]["tok_s"]["4"] != "H200 (nvidia-h200), abc1234"  # c = 4-32 still the committed ones
    assert "speed_same_machine" in tri["sources"]
    text = (tmp_path / "out" / "summary.md").read_text()
    assert "0.750 [0.700, 0.800] on flashinfer" in text and "NOT met" in text  # 0.75 against 500 / 600


def test_a_failed_greedy_check_is_recorded_not_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    for case, kwargs in (("off", {"off": 1}), ("few", {"responses": 60})):
        assert summarize(make_run(tmp_path / case, **kwargs), tmp_path / f"out_{case}") == 0
        entry = json.loads((tmp_path / f"out_{case}" / "summary.json").read_text())["flashinfer/triton"]
        assert entry["greedy_ok"] is False


def test_a_run_without_speed_waits_for_one_with_it_each_part_keeping_where_it_was_measured(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(ROOT)
    first, out = make_run(tmp_path / "first"), tmp_path / "out"
    shutil.rmtree(first / "speed")
    assert summarize(first, out) == 0
    fi = json.loads((out / "summary.json").read_text())["flashinfer/triton"]
    assert fi["greedy_ok"] is True and fi["t1_min_p"] == 0.05 and fi["tok_s"] == {}
    assert fi["sources"]["speed"] == "not yet measured" and fi["measured"]["tok_s"] == {}
    assert "| flashinfer / triton | flashinfer | pass: 88 responses" in (out / "summary.md").read_text()

    later = make_run(tmp_path / "later")  # only its speed rounds: calls 1, 2, model and speed of a later session
    shutil.rmtree(later / "greedy"), shutil.rmtree(later / "t1")
    assert bs.main(["--run", str(later), "--card", "H100 80GB HBM3", "--commit", "def5678", "--out", str(out)]) == 0
    fi = json.loads((out / "summary.json").read_text())["flashinfer/triton"]
    assert fi["greedy"]["responses"] == 88 and fi["t1_p"] == {"1": 0.2, "2": 0.05, "16": 0.6}
    assert fi["measured"]["greedy"] == fi["measured"]["t1"] == "H200 (nvidia-h200), abc1234"
    assert fi["measured"]["tok_s"]["1"] == "H100 80GB HBM3, def5678" and fi["tok_s"]["1"]["lilicorr"] == 450.0
    assert (fi["card"], fi["commit"]) == ("H200 (nvidia-h200), H100 80GB HBM3", "abc1234, def5678")
    assert fi["sources"]["greedy"] == str(first / "greedy" / "summary.txt")
    assert fi["sources"]["speed"] == str(later / "speed" / "graphs32_flashinfer" / "speed_summary.json")
    # and once more with nothing new but the speed: the speed cells it keeps are the ones it had
    shutil.rmtree(later / "speed")
    make_run(tmp_path / "again")
    shutil.rmtree(tmp_path / "again" / "speed")
    assert summarize(tmp_path / "again", out) == 0
    again = json.loads((out / "summary.json").read_text())["flashinfer/triton"]
    assert again["tok_s"] == fi["tok_s"] and again["lilicorr_vs_base"] == fi["lilicorr_vs_base"]
    assert again["block_over_decode"] == fi["block_over_decode"] and again["rounds"] == fi["rounds"]
    assert again["measured"]["tok_s"]["1"] == "H100 80GB HBM3, def5678"
    # a run with none of the three parts is a mistake, even where the summary could fill them all
    (tmp_path / "empty").mkdir()
    assert summarize(tmp_path / "empty", out) == 2
    assert "no greedy/summary.txt, t1/sampling_summary.json, speed/" in capsys.readouterr().err


@pytest.mark.parametrize(
    "case, message",
    [
        (
            "no greedy",
            "error: --run .*: no greedy/summary.txt \\(the greedy step's\\), and no flashinfer/triton entry in "
            ".* holds it: unpack every backends.sh call",
        ),
        (
            "nothing",
            "error: --run .*: no greedy/summary.txt, t1/sampling_summary.json, speed/graphs32_flashinfer/speed_summary"
            ".json \\(the greedy, t1, speed step's\\)",
        ),
        ("triton greedy", "error: .*greedy/summary.txt was served with attention triton \\(not flashinfer\\): pass"),
        ("triton speed", "error: .*speed_summary.json was served with attention triton \\(not flashinfer\\)"),
        ("no check line", "error: --run .*summary.txt: no check line of lilicorr.json"),
        ("no p", "error: --run .*sampling_summary.json: no p-value of lilicorr: pass the sampling_summary.json"),
        ("committed speed on flashinfer", "error: .*speed.json was served with attention flashinfer \\(not triton\\)"),
        ("target triton", "error: --target triton: the triton/triton entry comes from the committed Triton results"),
        ("triton folder", "error: --triton-t1 .*: its folder is not named <card>_<commit>\\[_what\\]"),
    ],
)
def test_missing_and_mismatched_inputs_are_one_line_errors(tmp_path, monkeypatch, capsys, case, message):
    monkeypatch.chdir(ROOT)
    run, extra = make_run(tmp_path / "run"), []
    if case == "no greedy":
        (run / "greedy" / "summary.txt").unlink()
    elif case == "nothing":
        for part in ("greedy", "t1", "speed"):
            shutil.rmtree(run / part)
    elif case == "triton greedy":  # the log beside names the Triton server that made it
        (run / "greedy" / "lilicorr.log").write_text(SERVER_ARGS_LINE % ("triton", "flashinfer"))
    elif case == "triton speed":
        path = run / "speed" / "graphs32_flashinfer" / "speed_summary.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), "backends": {"attention": "triton"}}))
    elif case == "no check line":
        (run / "greedy" / "summary.txt").write_text("GREEDY_CHECK PASS\n")
    elif case == "no p":
        (run / "t1" / "sampling_summary.json").write_text(json.dumps({"base": {"positions": {}}}))
    elif case == "committed speed on flashinfer":
        doc = json.loads((ROOT / bs.TRITON_SPEED).read_text())
        (tmp_path / "speed.json").write_text(json.dumps({**doc, "backends": FI}))
        extra = ["--triton-speed", str(tmp_path / "speed.json")]
    elif case == "target triton":
        extra = ["--target", "triton"]
    elif case == "triton folder":
        shutil.copy(ROOT / bs.TRITON_T1, tmp_path / "summary.json")
        extra = ["--triton-t1", str(tmp_path / "summary.json")]
    assert summarize(run, tmp_path / "out", *extra) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and re.search(message, err), err
    assert not (tmp_path / "out" / "summary.json").exists()


def test_backends_are_read_from_server_logs_and_flags():
    logged = SERVER_ARGS_LINE % ("flashinfer", "pytorch")
    assert bs.backends_in(logged) == {"attention": "flashinfer", "sampling": "pytorch", "draft": "triton"}
    flags = "--attention-backend=fa3 --sampling-backend flashinfer --speculative-draft-attention-backend triton"
    assert bs.backends_in(flags) == {"attention": "fa3", "sampling": "flashinfer", "draft": "triton"}
    assert bs.backends_in("Initialized DFLASH draft runner. attention_backend=triton") == {}
    assert bs.backends_in("{'attention_backend': None, 'sampling_backend': 'pytorch'}") == {"sampling": "pytorch"}
    assert bs.folder_measured(Path("x/h200x2_ed01e28_serve/summary.json"), "--f") == "h200x2, ed01e28"


# --- the shell side: gpu_check.sh's servers, backends.sh's steps ---------------------------------------------------

FAKE_PYTHON = """#!/bin/bash
# a stand-in python3: `-m sglang.launch_server` records its arguments and the flashinfer flag, then answers /health;
# anything else (the client, the checks) succeeds at once
if [[ "$*" == *sglang.launch_server* ]]; then
  echo "$* FLAG=${SGLANG_IS_FLASHINFER_AVAILABLE-unset}" >> "$LAUNCHES"
  port=$(echo "$@" | sed 's/.*--port \\([0-9]*\\).*/\\1/')
  exec %s -c "
import http.server
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers()
    def log_message(self, *a):
        pass
http.server.HTTPServer(('127.0.0.1', $port), H).serve_forever()"
fi
exit 0
"""


@pytest.fixture
def fake_machine(tmp_path):
    """A site folder with the kit's install, the converted target, the drafts, and a python3 stand-in on PATH."""
    site, work = tmp_path / "site", tmp_path / "smol"
    site.mkdir()
    (site / ".device_manifest").write_text("kit\n")
    for d in ("model", "lilicorr_draft", "dflash_draft"):
        (work / d).mkdir(parents=True)
    (work / "model" / "config.json").write_text("{}")
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    (bin_ / "python3").write_text(FAKE_PYTHON % sys.executable)
    (bin_ / "python3").chmod(0o755)
    env = dict(
        os.environ,
        PATH=f"{bin_}{os.pathsep}{os.environ['PATH']}",
        LAUNCHES=str(tmp_path / "launches.txt"),
        DEVICE_SITE=str(site),
        SMOL_WORK=str(work),
        TIMEOUT="60",
        SAMPLING_TAU_SEEDS="",
    )
    env.pop("SGLANG_IS_FLASHINFER_AVAILABLE", None)
    return tmp_path, site, work, env


def gpu_check(env: dict, out: Path, steps: str, **extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(DEVICE / "gpu_check.sh"), steps],
        env={**env, "OUT": str(out), **extra},
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_gpu_check_gives_every_server_the_chosen_backends(fake_machine):
    tmp_path, site, work, env = fake_machine
    launches = tmp_path / "launches.txt"
    (site / "flashinfer").mkdir()
    (site / "flashinfer" / "__init__.py").write_text(
        ""
    )  # the package itself, as benchmarks/device/flashinfer.sh leaves it
    fi = {"ATTN_BACKEND": "flashinfer", "SAMPLING_BACKEND": "flashinfer", "SAMPLING_SYSTEMS": "base lilicorr"}
    gpu_check(env, tmp_path / "fi", "lilicorr,dflash,sampling", **fi)
    started = launches.read_text().splitlines()
    assert len(started) == 4  # lilicorr, dflash, then the sampling step's base and lilicorr
    assert all("--attention-backend flashinfer --sampling-backend flashinfer" in s for s in started)
    assert all(s.endswith("FLAG=unset") and "--attention-backend triton" not in s for s in started)
    assert sum("--speculative-draft-attention-backend triton" in s for s in started) == 3
    summary = (tmp_path / "fi" / "summary.txt").read_text()
    assert "backends: --attention-backend flashinfer --sampling-backend flashinfer" in summary
    assert (work / "sampling_flashinfer_flashinfer").is_dir() and not (work / "sampling").exists()
    # the defaults: today's Triton and PyTorch servers, flashinfer not picked for the layers
    launches.unlink()
    gpu_check(env, tmp_path / "kit", "lilicorr", SAMPLING_SYSTEMS="base")
    (started,) = launches.read_text().splitlines()
    assert "--attention-backend triton --sampling-backend pytorch" in started and started.endswith("FLAG=false")
    # flashinfer named but only the headers-only package installed: no server starts
    launches.unlink()
    (site / "flashinfer" / "HEADERS_ONLY").write_text("")
    done = gpu_check(env, tmp_path / "headers", "lilicorr", ATTN_BACKEND="flashinfer")
    assert done.returncode != 0 and not launches.exists()
    assert (
        "needs flashinfer, and" in done.stdout
        and "headers-only package: run benchmarks/device/flashinfer.sh" in done.stdout
    )


STAND_IN = """#!/bin/bash
echo "$(basename "$0") $* | ATTN=${ATTN_BACKEND-} SAMPLING=${SAMPLING_BACKEND-} SYSTEMS=${SAMPLING_SYSTEMS-} \
TAU=${SAMPLING_TAU_SEEDS-unset} DRAFT=${LILICORR_DRAFT-} \
FLAG=${SGLANG_IS_FLASHINFER_AVAILABLE-unset} OUT=$OUT" >> "$CALLS"
case "$(basename "$0")" in
  testbed.sh)
    name=graphs32; [[ "$*" == *"--attention-backend flashinfer"* ]] && name=graphs32_flashinfer
    while [ $# -gt 0 ]; do [ "$1" = --out ] && out=$2; shift; done
    mkdir -p "$out/b" && echo '{"summary": {}}' > "$out/b/speed_summary.json"
    tar -czf "$out/speed_$name.tar.gz" -C "$out/b" . ;;
  gpu_check.sh)
    mkdir -p "$OUT" && echo "gpu_check $*" >> "$OUT/summary.txt"
    if [ -n "${SGL_JIT_BUILDS-}" ]; then  # a server that builds one of SGLang's JIT modules
      mkdir -p "$HOME/.cache/sglang/jit/sm90/$SGL_JIT_BUILDS/build-1/deps-2" "$HOME/.cache/sglang/jit/.staging-x"
      echo so > "$HOME/.cache/sglang/jit/sm90/$SGL_JIT_BUILDS/build-1/deps-2/$SGL_JIT_BUILDS.so"
      echo half > "$HOME/.cache/sglang/jit/.staging-x/half.so"
    fi
    [[ "$*" == *sampling* ]] && mkdir -p "$SMOL_WORK/sampling_flashinfer_flashinfer" \
      && echo log > "$SMOL_WORK/sampling_flashinfer_flashinfer/lilicorr.log" ;;
  flashinfer.sh) mkdir -p "$OUT" && echo warm > "$OUT/flashinfer_warmup.txt" && echo cache > "$OUT/jit_cache.tar.gz"
    echo "FI_BUILD_SECONDS=$FI_BUILD_SECONDS" >> "$CALLS"; exit "${FI_EXIT:-0}" ;;
esac
exit 0
"""


@pytest.fixture
def backends_root(tmp_path):
    """A copy of the checkout's backends.sh beside stand-ins of the scripts it runs, and the machine's earlier work."""
    root = tmp_path / "root"
    (root / "benchmarks" / "device").mkdir(parents=True)
    for name in ("backends.sh", "sglang_jit.sh"):
        shutil.copy(DEVICE / name, root / "benchmarks" / "device")
    for name in ("gpu_check.sh", "testbed.sh", "flashinfer.sh"):
        (root / "benchmarks" / "device" / name).write_text(STAND_IN)
    (root / ".dev" / "bin").mkdir(parents=True)
    (root / ".dev" / "bin" / "smol.sh").write_text(STAND_IN)
    for v in ("lilicorr", "dflash"):
        (root / "checkpoints" / f"smollm2-{v}").mkdir(parents=True)
        (root / "checkpoints" / f"smollm2-{v}" / "config.json").write_text("{}")
        (root / ".dev" / "ckpt").mkdir(exist_ok=True)
        (root / ".dev" / "ckpt" / f"{v}.safetensors").write_text("w")
    site, smol = tmp_path / "site", tmp_path / "smol"
    (smol / "model").mkdir(parents=True)
    (smol / "model" / "config.json").write_text("{}")
    site.mkdir()
    (site / ".device_manifest").write_text("kit\n")
    env = dict(
        os.environ,
        CALLS=str(tmp_path / "calls.txt"),
        DEVICE_SITE=str(site),
        SMOL_WORK=str(smol),
        BACKENDS_WORK=str(tmp_path / "bw"),
        TESTBED_WORK=str(tmp_path / "tb"),
        HOME=str(tmp_path / "home"),
        OUT=str(tmp_path / "ret"),
    )
    return root, env


def backends(root: Path, env: dict, steps: str, **extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(root / "benchmarks" / "device" / "backends.sh"), steps],
        env={**env, **extra},
        capture_output=True,
        text=True,
        timeout=120,
    )


def results(env: dict) -> set[str]:
    with tarfile.open(Path(env["OUT"]) / "results.tar.gz") as t:
        return {n.removeprefix("./") for n in t.getnames()}


def test_backends_calls_run_their_steps_with_the_flashinfer_backends(backends_root):
    root, env = backends_root
    calls = Path(env["CALLS"])
    # call 2: the shipped drafts into the testbed's WORK, flashinfer.sh, the JIT cache returned beside the results
    done = backends(root, env, "flashinfer")
    assert done.returncode == 0, done.stdout + done.stderr
    assert (Path(env["TESTBED_WORK"]) / "drafts" / "dflash" / "model.safetensors").is_file()
    assert (Path(env["OUT"]) / "jit_cache.tar.gz").is_file() and "flashinfer/flashinfer_warmup.txt" in results(env)
    # the build stops before the call's deadline (45 s to pack); a build stopped there (exit 4) returns its cache
    built = int(calls.read_text().split("FI_BUILD_SECONDS=")[1].split()[0])
    assert 500 <= built <= 525  # CALL_SECONDS 570 less 45, less the seconds the drafts' copy took
    done = backends(root, env, "flashinfer", FI_EXIT="4", CALL_SECONDS="60")
    assert done.returncode == 4 and "run 'bash benchmarks/device/backends.sh flashinfer' again" in done.stdout
    assert (Path(env["OUT"]) / "jit_cache.tar.gz").is_file() and "FI_BUILD_SECONDS=30" in calls.read_text()
    # call 3: the model with the shipped draft, the greedy check and T = 1 on flashinfer, LILICORR alone, no tau
    calls.unlink()
    done = backends(root, env, "t1,greedy,model", CALL_SECONDS="600")  # in their order, whatever the order given
    assert done.returncode == 0, done.stdout + done.stderr
    lines = calls.read_text().splitlines()
    assert [line.split(" |")[0] for line in lines] == [
        "gpu_check.sh model",
        "gpu_check.sh lilicorr",
        "gpu_check.sh check",
        "gpu_check.sh sampling",
    ]
    assert all("ATTN=flashinfer SAMPLING=flashinfer" in line for line in lines)
    assert lines[0].split("DRAFT=")[1].startswith(env["TESTBED_WORK"] + "/drafts/lilicorr")
    assert "SYSTEMS=lilicorr TAU= " in lines[3]
    got = results(env)
    assert {"greedy/summary.txt", "t1/summary.txt", "t1/lilicorr.log"} <= got
    assert any(n.startswith("calls/") and n.endswith("_t1+greedy+model.log") for n in got)
    # calls 4 and 5: the speed step on flashinfer, the four systems, 5 rounds, its bundle unpacked by folder
    calls.unlink()
    done = backends(root, env, "speed")
    assert done.returncode == 0, done.stdout + done.stderr
    (line,) = calls.read_text().splitlines()
    assert line.startswith(
        f"testbed.sh --work {env['TESTBED_WORK']} --out {env['BACKENDS_WORK']}/testbed_out "
        "--attention-backend flashinfer --sampling-backend flashinfer "
        "speed --systems base dflash builtin lilicorr --rounds 5 --profile-steps 0 |"
    )
    assert "speed/graphs32_flashinfer/speed_summary.json" in results(env)
    # the optional Triton rounds on the same machine: the kit's servers, flashinfer not picked
    calls.unlink()
    assert backends(root, env, "triton-speed").returncode == 0
    (line,) = calls.read_text().splitlines()
    assert "--attention-backend" not in line and "--concurrency 1 --rounds 5" in line and "FLAG=false" in line
    assert "speed/graphs32/speed_summary.json" in results(env)


def test_backends_exits_on_a_fresh_machine_a_short_deadline_and_an_unknown_step(backends_root):
    root, env = backends_root
    assert backends(root, env, "t1", CALL_SECONDS="100").returncode == 4  # t1 needs 240 s: the next call
    assert (
        "run 'bash benchmarks/device/backends.sh t1' in the next call"
        in backends(root, env, "t1", CALL_SECONDS="1").stdout
    )
    os.remove(Path(env["DEVICE_SITE"]) / ".device_manifest")
    done = backends(root, env, "greedy")
    assert done.returncode == 3 and "a fresh machine" in done.stdout and "results.tar.gz" in done.stdout
    done = backends(root, env, "speed,typo")
    assert done.returncode == 2 and "unknown step typo" in done.stderr


def test_backends_carry_checks_each_call_against_64_mib(backends_root):
    root, env = backends_root
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    (root / ".gitignore").write_text("/.dev/\n")
    for path, size in (
        (".dev/whl/w.whl", 13_000_000),
        (".dev/pkgs/p.tar.xz", 8_100_000),
        (".dev/smolA/part_a", 38_600_000),
    ):
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        with open(root / path, "wb") as f:
            f.truncate(size)
    (root / ".dev" / "manifest.txt").write_text("m\n")
    for path in (".dev/flashinfer/k.tar.xz", ".dev/smolB/part_b"):
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text("x")
    done = backends(root, env, "carry")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "call 1: " in done.stdout and ", ok: .dev/whl=13000000" in done.stdout
    assert "call 6: " in done.stdout and ".dev/sglang_jit=none yet (optional)" in done.stdout
    with open(root / ".dev/smolA/part_a", "wb") as f:  # a part that no longer fits beside the kit
        f.truncate(50_000_000)
    done = backends(root, env, "carry")
    assert done.returncode == 1 and "call 1: " in done.stdout and "OVER" in done.stdout
    assert "move the shipped drafts' weights to .dev/ckpt" in done.stderr


def test_sglangs_jit_builds_come_back_and_a_carried_cache_is_unpacked_once_per_machine(backends_root):
    root, env = backends_root
    ret, cache = Path(env["OUT"]), Path(env["HOME"]) / ".cache" / "sglang" / "jit"
    done = backends(root, env, "greedy", SGL_JIT_BUILDS="dflash_sampling")  # the first server builds a module
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SGLang JIT module sm90/dflash_sampling/build-1/deps-2/dflash_sampling.so (" in done.stdout
    assert f"-> {ret}/sglang_jit.tar.gz; carry it as .dev/sglang_jit/sglang_jit.tar.gz" in done.stdout
    with tarfile.open(ret / "sglang_jit.tar.gz") as t:
        names = {n.removeprefix("./") for n in t.getnames()}
    assert "sm90/dflash_sampling/build-1/deps-2/dflash_sampling.so" in names
    assert not any(".staging-" in n for n in names)  # a build in progress stays behind
    # the same machine, nothing new built: nothing comes back
    (ret / "sglang_jit.tar.gz").unlink()
    assert backends(root, env, "greedy").returncode == 0 and not (ret / "sglang_jit.tar.gz").exists()
    # a fresh machine with the cache carried: unpacked before the first step, and not returned while unchanged
    (root / ".dev" / "sglang_jit").mkdir(parents=True)
    with tarfile.open(root / ".dev" / "sglang_jit" / "sglang_jit.tar.gz", "w:gz") as t:
        t.add(cache, arcname=".")
    shutil.rmtree(cache)
    shutil.rmtree(env["BACKENDS_WORK"])
    done = backends(root, env, "greedy")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SGLang's JIT cache carried: 1 module build(s) unpacked into" in done.stdout
    assert (cache / "sm90/dflash_sampling/build-1/deps-2/dflash_sampling.so").is_file()
    assert not (ret / "sglang_jit.tar.gz").exists()
    assert "carried" not in backends(root, env, "greedy").stdout  # once per machine
