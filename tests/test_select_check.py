"""benchmarks/device/select_check.sh on the CPU, with stand-ins for the GPU's python3 modules and nvidia-smi: the
digests against the stored reference, and AB_TREE's alternating head_bench of this package beside another commit's."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# python3 stand-in: select_digest prints the reference's lines, head_bench writes rows whose served ms say which
# package came first on PYTHONPATH (the AB tree's: 0.100 ms a bs; this one's: 0.105), anything else is real Python.
PYTHON3 = """#!/bin/bash
if [ "$1" = -m ] && [ "$2 $3" = "benchmarks select-digest" ]; then
  echo "served bs 1 eager 0123456789abcdef"; exit 0
fi
if [ "$1" = -m ] && [ "$2 $3" = "benchmarks head-bench" ]; then
  while [ $# -gt 0 ]; do [ "$1" = --out ] && out=$2; shift; done
  ms=0.105; [ -n "${AB_TREE_SEEN:-}" ] && [[ "$PYTHONPATH" == "$AB_TREE_SEEN"* ]] && ms=0.100
  echo "{\\"rows\\": [{\\"bs\\": 1, \\"post_logits_served\\": $ms, \\"post_logits_builtin\\": 0.31}]}" > "$out"; exit 0
fi
exec REAL_PYTHON "$@"
"""


def setup(tmp_path: Path) -> tuple[Path, dict]:
    repo, bin_ = tmp_path / "repo", tmp_path / "bin"
    (repo / "benchmarks" / "device").mkdir(parents=True)
    for name in ("select_check.sh", "lab.sh"):
        shutil.copy(ROOT / "benchmarks" / "device" / name, repo / "benchmarks" / "device")
    ref = repo / "benchmarks" / "results" / "select-check" / "h200_d642fc5"
    ref.mkdir(parents=True)
    for geo in ("paper", "testbed"):
        (ref / f"digest_{geo}.txt").write_text("served bs 1 eager 0123456789abcdef\n")
    bin_.mkdir()
    for name, body in (("nvidia-smi", "#!/bin/bash\necho Stub GPU\n"), ("python3", PYTHON3)):
        (bin_ / name).write_text(body.replace("REAL_PYTHON", sys.executable))
        (bin_ / name).chmod(0o755)
    env = dict(os.environ, PATH=f"{bin_}:{os.environ['PATH']}", DEVICE_SITE=str(tmp_path / "site"))
    return repo, env


def check(repo: Path, env: dict, out: Path, **extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(repo / "benchmarks" / "device" / "select_check.sh"), str(out)],
        env={**env, **extra},
        capture_output=True,
        text=True,
        timeout=120,
        cwd=repo,
    )


def test_ab_tree_times_both_packages_alternately_on_one_card(tmp_path):
    repo, env = setup(tmp_path)
    done = check(repo, env, tmp_path / "plain")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "digest paper: MATCH" in done.stdout and "paper bs 1 served 0.1050 ms, built-in 0.3100 ms" in done.stdout
    assert not (tmp_path / "plain" / "ab.json").exists()

    base = repo / ".dev" / "ab" / "b340dcd"
    (base / "sglang_lilicorr").mkdir(parents=True)
    done = check(repo, env, tmp_path / "ab", AB_TREE=".dev/ab/b340dcd", AB_ROUNDS="2", AB_TREE_SEEN=str(base))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "ab paper bs 1: this 0.1050 ms, base 0.1000 ms, ratio 1.050 (built-in 0.3100 / 0.3100 ms)" in done.stdout
    ab = json.loads((tmp_path / "ab" / "ab.json").read_text())
    assert ab["rounds"] == 2 and round(ab["bs"]["1"]["served_ratio"], 6) == 1.05
    assert sorted(p.name for p in (tmp_path / "ab").glob("ab_*.json")) == [
        "ab_base_1.json",
        "ab_base_2.json",
        "ab_this_1.json",
        "ab_this_2.json",
    ]

    for tree, message in ((".dev/ab/none", "AB_TREE: no such folder"), (".dev/ab", "holds no sglang_lilicorr/")):
        done = check(repo, env, tmp_path / "bad", AB_TREE=tree)
        assert done.returncode == 2 and message in done.stdout
