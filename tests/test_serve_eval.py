"""testbed/serve_eval.sh's control flow on CPU: stub servers (tests/stub_server.py) stand in for SGLang,
one of them dies at startup, the speculative ones write a stage-timing file; the prompt-file loader that
reads testbed/eval_prompts.jsonl."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from sglang_lilicorr.benchmarks import datasets, prompt_file

ROOT = Path(__file__).resolve().parents[1]

# Serves the stub (speculative unless SYSTEM=base) on $PORT, with GET /health; SYSTEM=lilicorr (or $STUB_DIES)
# dies at startup.
# Prints the SGLang flags it stands in for; where LILICORR_STAGE_TIMING says, writes a stage-timing file in
# serving/stage_timer.py's format (decode steps and micro-benchmarks at the LILICORR_STAGE_TIMING_BS sizes).
LAUNCHER = """
import json, os, sys, time
from http.server import ThreadingHTTPServer
sys.path.insert(0, {tests!r})
from stub_server import StubServer
print("server args:", os.environ["SERVER_ARGS"], flush=True)
if os.environ["SYSTEM"] == os.environ.get("STUB_DIES", "lilicorr"):
    sys.exit("stub: cannot load the draft")
if os.environ.get("LILICORR_STAGE_TIMING"):
    graph = "--disable-cuda-graph" not in os.environ["SERVER_ARGS"]
    kind = "graph" if graph else "eager"
    ms = lambda v: {{"count": 50, "mean": v, "median": v}}
    sizes = os.environ["LILICORR_STAGE_TIMING_BS"].split(",")
    doc = {{"system": {{"gpu": "stub"}}, "decode_steps": 50,
           "stages": [{{"bs": int(b), "graph": graph, "n_blocks": 50, "step_interval_ms": ms(10.0),
                       "gpu_ms": {{"target_verify": ms(7.0), "draft_forward": ms(2.0)}}}} for b in sizes],
           "proposal": {{"batch_sizes": {{b: {{kind: {{"lm_head": 0.5, "spec_head": 0.1}}}} for b in sizes}}, "errors": []}}}}
    with open(os.path.join(os.environ["LILICORR_STAGE_TIMING"], f"stages-{{os.getpid()}}.json"), "w") as f:
        json.dump(doc, f)
time.sleep(1)
stub = StubServer(speculative=os.environ["SYSTEM"] != "base", accept=3, min_latency_s=0.002)
class Handler(stub._handler()):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.send_header("Content-Length", "0")
        self.end_headers()
ThreadingHTTPServer(("127.0.0.1", int(os.environ["PORT"])), Handler).serve_forever()
"""


def _free_port_block(n: int) -> int:
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port + n < 65536 and all(_free(port + i) for i in range(n)):
            return port
    pytest.skip("no block of free ports")


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def test_serve_eval_reports_the_surviving_systems_beside_the_reference(tmp_path):
    launcher = tmp_path / "launcher.py"
    launcher.write_text(LAUNCHER.format(tests=str(ROOT / "tests")))
    out, work = tmp_path / "out", tmp_path / "work"
    env = {**os.environ, "OUT": str(out), "SERVE_EVAL_WORK": str(work), "PYTHON": sys.executable,
           "SERVE_EVAL_LAUNCH": f"{sys.executable} {launcher}", "PORT0": str(_free_port_block(4)),
           "SYSTEMS": "lilicorr dflash dflash_eager base", "TEMPS": "0 1", "SEEDS": "0 1", "WARMUP": "1",
           "STAGE_TIMING": "1", "BUDGET": "200", "RESERVE": "40", "PER_SET": "2"}
    proc = subprocess.run(["bash", str(ROOT / "testbed" / "serve_eval.sh")], env=env, capture_output=True, text=True, timeout=300)
    log = (out / "serve_eval.txt").read_text()
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "lilicorr: server exited during startup" in log and "stub: cannot load the draft" in log
    assert "failed: lilicorr;" in log

    assert "--disable-cuda-graph" in (work / "dflash_eager.log").read_text()
    assert "--speculative-algorithm DFLASH" in (work / "dflash.log").read_text()
    assert "--disable-cuda-graph" not in (work / "dflash.log").read_text()

    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    for system in ("dflash", "dflash_eager", "base"):  # 2 reference prompts per set x 5 sets, at c = 1 and 8
        mine = [r for r in records if r["system"] == system]
        assert sorted({r["concurrency"] for r in mine}) == [1, 8]
        assert sorted({(r["temperature"], r["seed"]) for r in mine}) == [(0, 0), (1, 0), (1, 1)] and len(mine) == 3 * 20
    assert {r["category"] for r in records} == {"gsm8k", "humaneval", "aime2025", "gpqa", "writingbench"}

    cells = json.loads((out / "summary.json").read_text())["cells"]
    spec = [c for c in cells if c["system"] in ("dflash", "dflash_eager")]
    assert spec and all(1 < c["tau"] <= 3 and c["speedup"] > 0 and c["block_ms"] > 0 and c["block_ratio"] for c in spec)
    assert all(c["tau"] is None for c in cells if c["system"] == "base")
    assert "ratio vs dflash" in (out / "report.md").read_text()

    table = (out / "tau_server_vs_reference.md").read_text()
    gsm8k = next(line for line in table.splitlines() if line.startswith("| gsm8k |"))
    assert gsm8k.count("1.220") == 2  # the reference decoder's dflash tau on GSM8K (tables.json), beside both dflash servers'

    # stage timing: each speculative server's files are kept raw and handed to `bench stages`
    assert sorted(p.name for p in (out / "stages" / "raw").iterdir()) == ["dflash", "dflash_eager"]
    assert len(list((out / "stages" / "raw" / "dflash_eager").glob("stages-*.json"))) == 1
    assert f"lilicorr bench stages --timings dflash={work}/stages/dflash --bs 8 --out {out}/stages/c8" in log
    assert f"lilicorr bench stages --timings dflash_eager={work}/stages/dflash_eager --bs 1 --eager --out {out}/stages/c1_eager" in log
    assert sorted(p.name for p in (out / "stages").iterdir()) == ["c1", "c1_eager", "c8", "c8_eager", "raw"]
    assert "| Target verify | 7.00 |" in (out / "stages" / "c8" / "stages.md").read_text()
    assert len(list(out.iterdir())) <= 8 + 3 + 1  # a second temperature adds <= 3 plots; stages/


def test_serve_pairs_alternates_the_order_and_pools(tmp_path):
    """testbed/serve_pairs.sh: pairs FIRST.. alternate "dflash lilicorr" / "lilicorr dflash", each a
    serve_eval.sh run in $OUT/run<i> with its stage table printed; bench report pools the runs."""
    launcher = tmp_path / "launcher.py"
    launcher.write_text(LAUNCHER.format(tests=str(ROOT / "tests")))
    out = tmp_path / "out"
    env = {**os.environ, "OUT": str(out), "SERVE_EVAL_WORK": str(tmp_path / "work"), "PYTHON": sys.executable,
           "SERVE_EVAL_LAUNCH": f"{sys.executable} {launcher}", "PORT0": str(_free_port_block(4)), "STUB_DIES": "none",
           "PAIRS": "2", "FIRST": "2", "CONCURRENCY": "4", "WARMUP": "1", "STAGE_TIMING": "1", "BUDGET": "150",
           "RESERVE": "40", "PER_SET": "1"}
    proc = subprocess.run(["bash", str(ROOT / "testbed" / "serve_pairs.sh")], env=env, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "== pair 2: lilicorr dflash" in proc.stdout and "== pair 3: dflash lilicorr" in proc.stdout
    assert proc.stdout.count("| Target verify |") == 2  # each pair's stage table, printed
    logs = [(out / f"run{i}" / "serve_eval.txt").read_text() for i in (2, 3)]
    assert logs[0].index("== lilicorr") < logs[0].index("== dflash") and logs[1].index("== dflash") < logs[1].index("== lilicorr")
    pooled = tmp_path / "pooled"
    subprocess.run([sys.executable, "-m", "sglang_lilicorr.benchmarks.cli", "bench", "report", str(out / "run2" / "results.jsonl"),
                    str(out / "run3" / "results.jsonl"), "--block-ref", "dflash", "--out", str(pooled)], check=True, capture_output=True)
    cells = json.loads((pooled / "summary.json").read_text())["cells"]
    assert {c["system"] for c in cells} == {"dflash", "lilicorr"} and all(c.get("runs") == 2 for c in cells if c["group"] == "all")


def test_prompt_file_reads_the_testbed_prompts_and_groups_by_set():
    name, prompts = datasets.load_prompts(str(ROOT / "testbed" / "eval_prompts.jsonl"), categories=["gpqa", "gsm8k"])
    assert name == "eval_prompts" and len(prompts) == 48
    assert {p.category for p in prompts} == {"gpqa", "gsm8k"} and all(len(p.turns) == 1 for p in prompts)


@pytest.mark.parametrize("row, message", [
    ({"text": "hi"}, "non-empty `id`"),
    ({"id": "a", "messages": [{"role": "system", "content": "x"}]}, "`text` .* or `messages`"),
    ({"question_id": "q1", "turns": ["hi"]}, "SPEED-Bench record"),
])
def test_prompt_file_errors_name_the_problem(tmp_path, row, message):
    path = tmp_path / "mine.jsonl"
    path.write_text(json.dumps(row) + "\n")
    with pytest.raises(prompt_file.PromptFileError, match=message):
        prompt_file.load(path)


def test_prompt_file_messages_and_duplicates(tmp_path):
    path = tmp_path / "mine.jsonl"
    rows = [{"id": "a", "messages": [{"role": "user", "content": "one"}, {"role": "user", "content": "two"}]}, {"id": "b", "text": "x"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    prompts = prompt_file.load(path)
    assert prompts[0].turns == ("one", "two") and {p.category for p in prompts} == {"mine"}
    path.write_text("".join(json.dumps(r) + "\n" for r in rows + rows[:1]))
    with pytest.raises(prompt_file.PromptFileError, match="duplicate id 'a'"):
        prompt_file.load(path)
