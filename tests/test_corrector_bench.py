"""benchmarks/micro/corrector_bench.py on the CPU (--smoke: toy shapes, eager): every row timed through SGLang's Domino
and DSpark functions and our two walks, the derived heads, the modules built as SGLang's loader builds them, DSpark's
two bs = 1 routes, the commit it records (and benchmarks/device/scale_gpu.sh passing it), and its argument errors."""

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from benchmarks.micro import corrector_bench, head_bench

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.sglang
def test_smoke_times_every_row(tmp_path, capsys):
    pytest.importorskip("sglang")
    out = tmp_path / "cb.json"
    assert corrector_bench.main(["--smoke", "--bs", "1", "2", "--out", str(out), "--commit", "abc1234"]) == 0
    doc = json.loads(out.read_text())
    one, two = doc["rows"]
    names = ("lm_head", "domino_select", "dspark_markov", "dspark_confidence", "lilicorr_greedy", "lilicorr_viterbi")
    assert doc["errors"] == {} and all(row[n] > 0 for n in names for row in (one, two))
    assert one["dspark_markov_gemm"] > 0 and "dspark_markov_gemm" not in two  # the fused route exists at bs 1 only
    assert two["domino_head"] == pytest.approx(two["domino_select"] - two["lm_head"])
    assert two["viterbi_over_greedy"] == pytest.approx(two["lilicorr_viterbi"] / two["lilicorr_greedy"])
    assert doc["meta"]["git_commit"] == "abc1234"
    # the CPU never packs a GRU; the log names the per-call compaction once, torch's own warning is silenced
    assert doc["meta"]["domino_gru_weights_in_one_storage"] is False
    assert capsys.readouterr().out.count("cuDNN copies them into one chunk") == 1


def test_the_commit_defaults_to_git_then_the_environment(tmp_path, monkeypatch):
    monkeypatch.setattr(corrector_bench, "run", lambda geo, bs, rep_ms, commit: {"meta": {"c": commit}, "errors": {}})
    out = tmp_path / "cb.json"
    corrector_bench.main(["--smoke", "--out", str(out)])
    assert json.loads(out.read_text())["meta"]["c"] is None  # run() then asks head_bench.git_commit()

    def no_git(*a, **k):
        raise OSError("no git here")

    monkeypatch.setattr(head_bench.subprocess, "run", no_git)  # the GPU machine: a copy of the checkout, no .git
    monkeypatch.setenv("GIT_COMMIT", "feed123")
    assert head_bench.git_commit() == "feed123"
    monkeypatch.delenv("GIT_COMMIT")
    assert head_bench.git_commit() is None


@pytest.mark.parametrize("commit", ["abc1234", None])
def test_scale_gpu_passes_git_commit_to_corrector_bench(tmp_path, commit):
    """benchmarks/device/scale_gpu.sh heads, with a stand-in install, nvidia-smi and python3 that records its
    arguments."""
    repo, bin_ = tmp_path / "repo", tmp_path / "bin"
    (repo / "benchmarks" / "device").mkdir(parents=True)
    for name in ("scale_gpu.sh", "lab.sh"):
        shutil.copy(ROOT / "benchmarks" / "device" / name, repo / "benchmarks" / "device")
    (repo / ".dev" / "bin").mkdir(parents=True)
    (repo / ".dev" / "bin" / "install.sh").write_text("echo installed\n")
    bin_.mkdir()
    args = tmp_path / "args.txt"
    for name, body in (("nvidia-smi", "echo Stub GPU"), ("python3", f'printf "%s\\n" "$@" > {args}')):
        (bin_ / name).write_text(f"#!/bin/bash\n{body}\n")
        (bin_ / name).chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "GIT_COMMIT"}
    env.update(PATH=f"{bin_}:{env['PATH']}", OUT=str(tmp_path / "out"), SCALE_WORK=str(tmp_path / "work"))
    if commit:
        env["GIT_COMMIT"] = commit
    done = subprocess.run(
        ["bash", str(repo / "benchmarks" / "device" / "scale_gpu.sh"), "heads"], env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    argv = args.read_text().split()
    assert argv[:3] == ["-m", "benchmarks", "corrector-bench"]
    if commit:
        assert argv[-2:] == ["--commit", commit] and "GIT_COMMIT is unset" not in done.stdout
    else:
        assert "--commit" not in argv and "GIT_COMMIT is unset" in done.stdout


def test_modules_are_built_as_sglangs_loader_builds_them():
    """served_construction: the dtype as the default and the device as the context (model_loader/loader.py), then the
    previous default back. A GRU's weights in separate storages are what cuDNN compacts at every call."""
    before = torch.get_default_dtype()
    with corrector_bench.served_construction("cpu", torch.bfloat16):
        gru = torch.nn.GRU(8, 8, bias=False, batch_first=True)
        assert torch.get_default_dtype() == torch.bfloat16
    assert torch.get_default_dtype() == before and gru.weight_ih_l0.dtype == torch.bfloat16
    assert corrector_bench.gru_weights_in_one_storage(gru) is False
    flat = torch.empty(sum(w.numel() for w in gru._flat_weights), dtype=torch.bfloat16)
    offset = 0
    with torch.no_grad():  # what torch._cudnn_rnn_flatten_weight does: every weight a view into one buffer
        for w in gru._flat_weights:
            w.set_(flat.untyped_storage(), offset, w.shape, w.stride())
            offset += w.numel()
    assert corrector_bench.gru_weights_in_one_storage(gru) is True
    # the premise of keeping the compaction: flatten_parameters (at construction on the GPU, at .to(), or called by
    # hand) packs only dtypes in this set, so SGLang's bf16 prefix_gru stays in two tensors when it serves
    assert torch.bfloat16 not in torch.backends.cudnn.CUDNN_TENSOR_DTYPES


@pytest.mark.sglang
def test_dspark_bs1_rows_take_sglangs_fused_route_and_the_gemm_route(monkeypatch):
    """At bs 1 SGLang's _draft_step runs MarkovGreedyStep (fused GEMV + add + argmax); dspark_markov_gemm turns that
    off and takes the bs > 1 route. Both draft the same block."""
    pytest.importorskip("sglang")
    from sglang.srt.speculative.dspark_components import dspark_draft

    fused = []
    execute = dspark_draft.MarkovGreedyStep.execute
    monkeypatch.setattr(
        dspark_draft.MarkovGreedyStep, "execute", lambda **k: fused.append(1) or execute(**k), raising=True
    )
    geo, dtype = head_bench.SMOKE, torch.float32
    lm_head_w = torch.randn(geo.V, geo.HM) * 0.02
    embed = torch.nn.Embedding(geo.V, geo.HM)
    with torch.inference_mode():
        parts = (
            lm_head_w,
            embed,
            corrector_bench.domino_modules(geo, "cpu", dtype),
            corrector_bench.dspark_modules(geo, "cpu", dtype),
            {},
        )
        fns = corrector_bench.row_fns(geo, 1, parts, "cpu", dtype)
        fused.clear()  # row_fns drafts once for the confidence head's picks
        served = fns["dspark_markov"]()
        assert len(fused) == geo.S
        gemm = fns["dspark_markov_gemm"]()
        assert len(fused) == geo.S and torch.equal(served, gemm)
        assert "dspark_markov_gemm" not in corrector_bench.row_fns(geo, 2, parts, "cpu", dtype)


@pytest.mark.parametrize("argv, message", [(["--bs", "0"], "--bs 0 is not a batch size"), ([], "no CUDA device")])
def test_bad_arguments_are_named(tmp_path, capsys, argv, message):
    with pytest.raises(SystemExit) as e:
        corrector_bench.main(
            [*argv, "--smoke" if argv else "--rep-ms", *([] if argv else ["10"]), "--out", str(tmp_path / "x")]
        )
    assert e.value.code == 2 and message in capsys.readouterr().err
