"""The Qwen3-8B-scale cost benchmark (benchmarks/served/scale.py, scale_report.py) on the CPU: the inputs it
builds (at toy width), its server arguments, its phases against stand-in servers that write stage-timer
files, the deadline guard, and summary.json / cost.md / cost.png from the bundles."""

import contextlib
import dataclasses
import io
import json
import shutil
import sys
import tarfile
from pathlib import Path

import pytest

pytest.importorskip("aiohttp")

from stub_server import free_port_block

from sglang_lilicorr import cli as lilicorr_cli
from benchmarks.served import baselines_summary, scale, scale_report
from sglang_lilicorr.errors import UsageError

TESTS = Path(__file__).resolve().parent
TOY = {
    **scale.QWEN3_8B,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "vocab_size": 300,
    "max_position_embeddings": 4096,
}
TOY_HEAD = {"candidate_topk": 4, "hidden_size": 32, "num_layers": 1, "num_heads": 4, "factor_dim": 16}

# Serves tests/stub_server.py on $PORT and, like a server with the plugin's stage timer, writes a
# stages-<pid>.json into $LILICORR_STAGE_TIMING: per-block stages (speculative) or plain decode steps.
BLOCK_MS = {"lilicorr": 10.0, "dflash": 9.95, "builtin": 10.4, "domino": 10.6, "dspark": 10.2}
HEAD_MS = {"lilicorr": 0.12, "dflash": 0.02, "builtin": 0.35, "domino": 0.5, "dspark": 0.2}
LAUNCHER = """
import json, os, sys
sys.path.insert(0, {tests!r})
from stub_server import StubServer
args = os.environ["SERVER_ARGS"]
spec, eager = "--speculative-algorithm" in args, "--cuda-graph-backend-decode disabled" in args
folder = os.environ.get("LILICORR_STAGE_TIMING")  # unset: a phase without the stage timer
words = args.split()
draft = os.path.basename(words[words.index("--speculative-draft-model-path") + 1]) if spec else "base"
system = "lilicorr" if "LILICORR" in words else ("builtin" if draft == "lilicorr" else draft)
ms = lambda v: {{"count": 90, "mean": v, "median": v}}
block = {block_ms}.get(system, 7.0) * (2.5 if eager else 1.0)
head = {head_ms}.get(system, 0.0) * (3.0 if eager else 1.0)
sizes = [int(b) for b in os.environ.get("LILICORR_STAGE_TIMING_BS", "1").split(",")]
gpu = {{"step": ms(block - 0.5)}}
if spec:
    gpu.update(target_verify=ms(0.7 * block), draft_forward=ms(0.15 * block if eager else 0.15 * block + 0.5 + head))
    if eager:
        gpu["draft_sample"] = ms(0.5 + head)
rows = [{{"bs": b, "graph": not eager, "n_blocks": 90, "step_interval_ms": ms(block + b / 100), "gpu_ms": gpu,
          "host_ms": gpu}} for b in sizes]
variant = "eager" if eager else "graph"
doc = {{"system": {{"gpu": "Stub H100",
                   "forced_commit_len": float(os.environ["SGLANG_SIMULATE_ACC_LEN"]) if spec else None}},
       "decode_steps": 90 * len(sizes), "stages": rows,
       "prefill": {{"requests": ms(4.0), "gpu_ms": ms(30.0 + (5.0 if system == "lilicorr" else 0.0)),
                   "host_ms": ms(2.0)}},
       "proposal": {{"batch_sizes": {{str(b): {{variant: {{"lm_head": 0.5, "spec_head": head, "proposal": 0.5 + head}}}}
                                     for b in sizes}}, "errors": []}}
                    if spec else None,
       "memory": {{"target_gib": 15.26, "draft_gib": 2.03 if spec else None,
                  "head_gib": 0.07 if system != "dflash" and spec else None,
                  "kv_pool_gib": 3.75, "max_total_num_tokens": 24576,
                  "pre_load_free_gib": 78.5 if system in ("lilicorr", "base") else 50.0,
                  "free_after_graphs_gib": 54.0, "graphs_gib": 1.2 if not eager else 0.0}}}}
if folder:
    with open(os.path.join(folder, f"stages-{{os.getpid()}}.json"), "w") as f:
        json.dump(doc, f)
slower = {{"1": 8, "2": 4, "4": 2, "8": 1.5}}.get(os.environ.get("LILICORR_VERIFY_WIDTH"), 1)  # a pinned width
stub = StubServer(speculative=spec, accept=7, step_s=0.0002 * (3 if system == "builtin" else slower),
                  min_latency_s=0.001, port=int(os.environ["PORT"]))
stub.serve_forever()
"""


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    work = tmp_path_factory.mktemp("scale")
    scale.build(work, target=TOY, layers=2, mask_token_id=299, head=TOY_HEAD, log=lambda line: None)
    return work


def test_build_writes_servable_drafts_of_the_targets_shape(built, capsys):
    from sglang_lilicorr.drafter import load_draft

    target = json.loads((built / "target" / "config.json").read_text())
    assert target["architectures"] == ["Qwen3ForCausalLM"] and target["num_hidden_layers"] == 36
    dflash = json.loads((built / "drafts" / "dflash" / "config.json").read_text())
    assert dflash["architectures"] == ["DFlashDraftModel"] and dflash["num_hidden_layers"] == 2
    assert dflash["dflash_config"]["target_layer_ids"] == [1, 9, 17, 25, 33] and dflash["block_size"] == 16
    drafter, head = load_draft(built / "drafts" / "lilicorr")
    plain, none = load_draft(built / "drafts" / "dflash")
    assert none is None and head.config.candidate_topk == 4 and drafter.config == plain.config
    assert all((drafter.state_dict()[k] == v).all() for k, v in plain.state_dict().items())  # the same drafter
    from sglang_lilicorr.baselines import DominoHead, DSparkHead
    from sglang_lilicorr.train.heads import load_corrector_draft

    for system, kind in (("domino", DominoHead), ("dspark", DSparkHead)):  # the same drafter, a width-matched head
        corrected, corrector = load_corrector_draft(built / "drafts" / system)
        assert isinstance(corrector, kind) and corrected.config == plain.config
        assert all((corrected.state_dict()[k] == v).all() for k, v in plain.state_dict().items())
    assert corrector.config.markov_rank == TOY["hidden_size"] and corrector.config.markov_head_type == "vanilla"
    domino = json.loads((built / "drafts" / "domino" / "config.json").read_text())["dflash_config"]
    assert domino["projector_type"] == "domino" and domino["gru_hidden_dim"] == domino["emb_dim"] == TOY["hidden_size"]
    assert (
        lilicorr_cli.main(["check-draft", str(built / "drafts" / "lilicorr"), "--target", str(built / "target")]) == 0
    )
    assert "ok: serve with" in capsys.readouterr().out
    stamp = (built / "build.json").read_text()
    lines = []
    scale.build(built, target=TOY, layers=2, mask_token_id=299, head=TOY_HEAD, log=lines.append)
    assert lines == [f"[build] {built}: built already"] and (built / "build.json").read_text() == stamp


def test_the_paper_geometry():
    from sglang.srt.speculative.dflash_utils import build_target_layer_ids

    config = scale.drafter_config(scale.QWEN3_8B, layers=scale.DRAFT_LAYERS, mask_token_id=scale.QWEN3_MASK_TOKEN_ID)
    assert list(config.target_layer_ids) == build_target_layer_ids(36, 5)
    assert (
        config.hidden_size,
        config.num_attention_heads,
        config.num_key_value_heads,
        config.head_dim,
        config.intermediate_size,
        config.vocab_size,
        config.block_size,
    ) == (4096, 32, 8, 128, 12288, 151936, 16)
    import torch

    from sglang_lilicorr.config import LiLiCorrConfig
    from sglang_lilicorr.head import LiLiCorrHead

    with torch.device("meta"):
        head = LiLiCorrHead(LiLiCorrConfig(block_size=16, **scale.PAPER_HEAD), model_hidden_size=4096)
    assert round(sum(p.numel() for p in head.parameters()) / 1e6, 2) == 36.76  # the paper's Table hparams, 8B
    assert head.config.ffn_width(4096) == 2048


def test_server_arguments_of_each_system(tmp_path):
    lil = scale.server_args("lilicorr", tmp_path, eager=False)
    assert (
        lil[lil.index("--speculative-algorithm") + 1] == "LILICORR" and lil[lil.index("--load-format") + 1] == "dummy"
    )
    assert "--skip-tokenizer-init" in lil and lil[lil.index("--speculative-draft-load-format") + 1] == "safetensors"
    blt, dfl = scale.server_args("builtin", tmp_path, eager=True), scale.server_args("dflash", tmp_path, eager=False)
    assert blt[blt.index("--speculative-algorithm") + 1] == "DFLASH" and blt[
        blt.index("--speculative-draft-model-path") + 1
    ].endswith("lilicorr")
    assert (
        dfl[dfl.index("--speculative-draft-model-path") + 1].endswith("dflash")
        and "disabled" not in dfl[dfl.index("--cuda-graph-backend-prefill") + 2 :]
    )
    assert blt[blt.index("--cuda-graph-backend-decode") + 1] == "disabled"
    assert "--speculative-algorithm" not in scale.server_args("base", tmp_path, eager=False)
    dom, dsp = scale.server_args("domino", tmp_path, eager=False), scale.server_args("dspark", tmp_path, eager=False)
    assert dom[dom.index("--speculative-algorithm") + 1] == "DFLASH" and dom[
        dom.index("--speculative-draft-model-path") + 1
    ].endswith("domino")
    assert dom[dom.index("--speculative-domino-candidate-pool-size") + 1] == "2048"
    assert dsp[dsp.index("--speculative-algorithm") + 1] == "DSPARK" and dsp[
        dsp.index("--speculative-draft-model-path") + 1
    ].endswith("dspark")
    env = scale.server_env("dspark", tmp_path)
    assert env["SGLANG_RAGGED_VERIFY_MODE"] == "static" and env["SGLANG_SIMULATE_ACC_LEN"] == "7"
    assert "SGLANG_RAGGED_VERIFY_MODE" not in scale.server_env("domino", tmp_path)
    for name, phase in scale.PHASES.items():  # every phase that measures a speculative system has its reference
        assert (
            "dflash" in phase.systems
            or phase.systems in (("base",), ("lilicorr", "builtin"))
            or (
                name.startswith("widths") and phase.systems[0] == "lilicorr"  # the adaptive width against pinned ones
            )
        ), name
    pinned = scale.server_env("lilicorr_w4", tmp_path, forced_commit=2)
    assert pinned["LILICORR_VERIFY_WIDTH"] == "4" and pinned["SGLANG_SIMULATE_ACC_LEN"] == "2"
    assert "LILICORR_VERIFY_WIDTH" not in scale.server_env("lilicorr", tmp_path)
    assert scale.server_env("lilicorr", tmp_path)[
        "SGLANG_SIMULATE_ACC_LEN"
    ] == "7" and "SGLANG_SIMULATE_ACC_LEN" not in scale.server_env("base", tmp_path)
    texts = [r["text"] for r in scale.prompts(3)]
    assert len(set(texts)) == 3 and all(len(t.encode()) == scale.PROMPT_TOKENS for t in texts)


def test_sglang_parses_the_server_arguments(tmp_path, built):
    from sglang.srt.server_args import prepare_server_args

    from sglang_lilicorr.serving.plugin import register

    register()  # the LILICORR name, as in every SGLang process
    for system in ("base", *scale.SYSTEMS):
        args = prepare_server_args(
            ["--model-path", str(built / "target"), *scale.server_args(system, built, eager=system == "dflash")]
        )
        assert args.load_format == "dummy" and args.skip_tokenizer_init and args.max_total_tokens == 24576
        if system == "domino":
            assert args.speculative_domino_candidate_pool_size == 2048


@pytest.fixture(scope="module", autouse=True)
def fast_phases():
    """In this module every phase plays at most two rounds of fewer prompts (the same paired protocol, a fraction of
    the requests), and the stage-timer flush waits for no idle dump (the stand-ins dump at once)."""
    from benchmarks.instrumentation import stage_timer

    mp = pytest.MonkeyPatch()
    fast = {1: 2, 4: 4, 16: 16, 32: 32}
    mp.setattr(
        scale,
        "PHASES",
        {n: dataclasses.replace(p, prompts=fast, rounds=min(p.rounds, 2)) for n, p in scale.PHASES.items()},
    )
    mp.setattr(stage_timer, "IDLE_DUMP_S", 0.0)
    yield
    mp.undo()


@pytest.fixture(scope="module")
def bundles(built, tmp_path_factory):
    """The five phases against stand-ins; returns the $OUT folder."""
    out = tmp_path_factory.mktemp("OUT")
    launcher = tmp_path_factory.mktemp("launch") / "launcher.py"
    launcher.write_text(LAUNCHER.format(tests=str(TESTS), block_ms=BLOCK_MS, head_ms=HEAD_MS))
    mp = pytest.MonkeyPatch()
    mp.setenv("SCALE_LAUNCH", f"{sys.executable} {launcher}")
    mp.setattr(scale, "PORT0", free_port_block(max(len(p.systems) for p in scale.PHASES.values())))
    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(printed):
            code = scale.main(
                ["run", "--work", str(built), "--phases", "graph,correctors,base,eager,tput,widths7", "--out", str(out)]
            )
        assert code == 0, printed.getvalue()[-6000:]
    finally:
        mp.undo()
    (out.parent / "printed.txt").write_text(printed.getvalue())
    return out


def test_phases_pack_whole_bundles_of_paired_rounds(bundles):
    printed_phases = (bundles.parent / "printed.txt").read_text()
    assert sorted(p.name for p in bundles.iterdir()) == [
        "scale_base.tar.gz",
        "scale_correctors.tar.gz",
        "scale_eager.tar.gz",
        "scale_graph.tar.gz",
        "scale_tput.tar.gz",
        "scale_widths7.tar.gz",
    ]
    with tarfile.open(bundles / "scale_graph.tar.gz") as t:
        names = t.getnames()
        phase = json.loads(t.extractfile("graph/phase.json").read())
        round1 = [json.loads(line) for line in t.extractfile("graph/round1.jsonl").read().splitlines()]
    rounds = [f"round{r}.jsonl" for r in range(1, scale.PHASES["graph"].rounds + 1)]
    assert {f"graph/{r}" for r in rounds} <= set(names)
    assert phase["failures"] == [] and phase["rounds_written"] == rounds
    assert "[graph] lilicorr bs=1 graph: 10.01 ms per step over 90 steps" in printed_phases
    assert (
        "SGLANG_SIMULATE_ACC_LEN" in phase["server_env"]["builtin"] and "LILICORR" in phase["server_args"]["lilicorr"]
    )
    assert {(r["system"], r["concurrency"]) for r in round1} == {
        (s, c) for s in scale.PHASES["graph"].systems for c in scale.CONCURRENCY
    }
    assert all(t["completion_tokens"] == scale.MAX_TOKENS for r in round1 for t in r["turns"])
    with tarfile.open(bundles / "scale_tput.tar.gz") as t:
        tput = json.loads(t.extractfile("tput/phase.json").read())
        long_round = [json.loads(line) for line in t.extractfile("tput/round1.jsonl").read().splitlines()]
    assert tput["max_tokens"] == 1024 and "--max-total-tokens 49152" in tput["server_args"]["lilicorr"]
    assert not any("LILICORR_STAGE_TIMING" in env for env in tput["server_env"].values())  # what a user gets
    assert phase["server_env"]["lilicorr"]["LILICORR_STAGE_TIMING"].endswith("graph/stages/lilicorr")
    assert {r["system"] for r in long_round} == {"lilicorr", "builtin"} and all(
        t["completion_tokens"] == 1024 for r in long_round for t in r["turns"]
    )
    assert not [p for p in bundles.iterdir() if p.name.startswith(".")]  # no temporary left behind


def test_summary_has_every_system_and_concurrency(bundles, tmp_path):
    out = tmp_path / "results"
    assert scale_report.main([*map(str, sorted(bundles.iterdir())), "--out", str(out)]) == 0
    doc = json.loads((out / "summary.json").read_text())
    assert doc["card"] == "Stub H100" and doc["missing"] == []
    for s in scale.SYSTEMS:
        for c in ("1", "4", "16", "32"):
            e = doc["systems"][s][c]
            assert {"per_block_ms", "head_ms", "decode_step_ms", "tok_s"} <= set(e) and None not in (
                e["per_block_ms"],
                e["head_ms"],
                e["decode_step_ms"],
                e["tok_s"],
            )
            assert e["per_block_ms"] == pytest.approx(BLOCK_MS[s] + int(c) / 100)
            assert e["decode_step_ms"] == pytest.approx(7.0 + int(c) / 100) and e["forced_commit_len"] == 7.0
            assert e["per_block_ms_eager"] == pytest.approx(2.5 * BLOCK_MS[s] + int(c) / 100)
            assert e["projected_speedup"] == (
                pytest.approx(scale_report.PAPER_TAU[s] * e["decode_step_ms"] / e["per_block_ms"])
                if s in scale_report.PAPER_TAU
                else None
            )
            assert e["block_vs_dflash"] == pytest.approx(e["per_block_ms"] / (BLOCK_MS["dflash"] + int(c) / 100))
            assert len(e["tok_s_per_round"]) == scale.PHASES["graph"].rounds and e["speedup_measured"] > 0
    assert doc["systems"]["dflash"]["1"]["head_ms"] == 0.0 and doc["systems"]["lilicorr"]["1"][
        "head_ms"
    ] == pytest.approx(0.12)
    assert doc["systems"]["builtin"]["1"]["head_ms_eager"] == pytest.approx(1.05)
    rounds = scale.PHASES["graph"].rounds
    assert (
        doc["systems"]["lilicorr"]["4"]["tok_s_vs_builtin"]["n"] == rounds
        and doc["systems"]["builtin"]["4"]["tok_s_vs_dflash"]["n"] == rounds
    )
    for s in ("domino", "dspark"):  # paired against the correctors phase's own DFLASH
        assert doc["systems"][s]["4"]["tok_s_vs_dflash"]["n"] == rounds and doc["systems"][s]["1"][
            "head_ms"
        ] == pytest.approx(HEAD_MS[s])
    assert targets_met(doc, "lilicorr_head_below_domino")
    assert doc["base"]["16"]["tok_s"] > 0 and doc["systems"]["lilicorr"]["1"]["head_share"] == pytest.approx(
        0.12 / 10.01
    )
    assert doc["systems"]["builtin"]["4"]["recorded"]["host_ms"]["target_verify"] == pytest.approx(0.7 * 10.4)
    targets = doc["targets"]
    assert targets["head_share_c1_le_1.5pct"]["met"] is True and targets["lilicorr_block_le_builtin"]["met"] is True
    assert targets["lilicorr_block_le_1.01x_dflash"]["met"] is True
    mem = doc["memory"]["lilicorr"]
    assert (
        mem["kv_bytes_per_token"] == pytest.approx(3.75 * 2**30 / 24576)
        and doc["memory_derivation"]["free_before_load_gib"] == 78.5
    )
    pool = int((0.85 * 78.5 - 15.26 - 2.03) * 2**30 / mem["kv_bytes_per_token"])
    assert mem["pool_tokens_at_fraction"] == pool and mem["largest_batch"] == pool // (4096 + 16)
    assert (
        doc["memory"]["base"]["largest_batch"] == int((0.85 * 78.5 - 15.26) * 2**30 / mem["kv_bytes_per_token"]) // 4096
    )
    text = (out / "cost.md").read_text()
    assert (
        "| Stage (ms / block) | dflash (graph) | lilicorr (eager) | lilicorr (graph) | builtin (eager) "
        "| builtin (graph) |" in text
    )
    assert "every block committed 7 tokens" in text and "Plain decode step of the same target: 7.01 ms" in text
    assert doc["prefill"]["lilicorr"]["gpu_ms"]["mean"] == 35.0 and doc["prefill"]["base"]["gpu_ms"]["count"] == 90
    long_runs = doc["tok_s_1024"]  # the tput phase: its 1,024-token rounds decide the throughput target
    assert set(long_runs) == {"1", "4", "16", "32"} and set(long_runs["4"]["tok_s"]) == {"lilicorr", "builtin"}
    assert targets["lilicorr_tok_s_ge_builtin_ci_lo"]["values"]["4"] == long_runs["4"]["tok_s_vs_builtin"]["lo"]
    assert (
        "Throughput with 1,024-token outputs "
        "(tput phase: LILICORR and the built-in alone, paired rounds, uninstrumented)" in text
    )
    assert "| lilicorr | 90 | 4.0 | 35.00 / 35.00 / -- | 2.00 |" in text
    assert "| 1 | domino | 10.61 | 1.065 |" in text and "dspark (graph)" in text
    assert (out / "cost.png").stat().st_size > 0


def targets_met(doc: dict, name: str) -> bool:
    return doc["targets"][name]["met"] is True


def test_the_cost_keys_merge_into_the_baselines_summary(bundles, tmp_path):
    summary = tmp_path / "baselines" / "summary.json"
    summary.parent.mkdir()
    kept = {"tau": {"gsm8k": {"lilicorr": {"t0": 2.1, "t1": 1.3}}}, "tok_s": {"1": {"dflash": 90.0}}}
    summary.write_text(json.dumps({**kept, "viterbi": {"tau_t0": 2.05}}))
    bench = tmp_path / "corrector_bench.json"
    bench.write_text(json.dumps({"rows": [{"bs": 1, "lilicorr_greedy": 0.1, "lilicorr_viterbi": 0.13}]}))
    args = [*map(str, sorted(bundles.iterdir())), "--out", str(tmp_path / "r"), "--corrector-bench", str(bench)]
    assert scale_report.main([*args, "--baselines-summary", str(summary)]) == 0
    doc = json.loads(summary.read_text())
    assert {k: doc[k] for k in kept} == kept and doc["viterbi"]["tau_t0"] == 2.05  # other work's keys untouched
    assert set(doc["cost_8b"]) == set(baselines_summary.COST_SYSTEMS) == set(doc["head_ms_8b"])
    assert doc["cost_8b"]["domino"]["32"] == pytest.approx(BLOCK_MS["domino"] + 0.32)
    assert doc["head_ms_8b"]["dspark"] == pytest.approx(0.2) and doc["head_ms_8b"]["dflash"] == 0.0
    assert doc["viterbi"]["per_block_ms_8b"] == pytest.approx(10.01 + 0.03)
    # without the correctors phase, Domino's and DSpark's heads come from corrector_bench (the served phase wins)
    graph_only, _ = scale_report.summarize(scale_report.phase_folders([bundles / "scale_graph.tar.gz"], tmp_path / "g"))
    row = {"bs": 1, "lilicorr_greedy": 0.1, "lilicorr_viterbi": 0.13, "domino_head": 1.7, "dspark_head": 4.6}
    heads = baselines_summary.cost_keys(graph_only, row)["head_ms_8b"]
    assert heads["domino"] == 1.7 and heads["dspark"] == 4.6 and heads["lilicorr"] != 0.1
    assert "domino" not in baselines_summary.cost_keys(graph_only)["head_ms_8b"]
    assert baselines_summary.cost_keys(
        doc_full := scale_report.summarize(scale_report.phase_folders(sorted(bundles.iterdir()), tmp_path / "f"))[0],
        row,
    )["head_ms_8b"]["dspark"] == pytest.approx(0.2)
    assert doc_full["systems"]["dspark"]["1"]["head_ms"] is not None
    bench.write_text(json.dumps({"rows": [{"bs": 4, "lilicorr_greedy": 0.1}]}))
    with pytest.raises(UsageError, match="no bs = 1 row"):
        baselines_summary.read_bench(bench)
    summary.write_text("[1, 2]")
    with pytest.raises(UsageError, match="not a JSON object"):
        baselines_summary.merge(summary, {"cost_8b": {}})


def test_a_summary_of_the_graph_phase_alone_names_what_is_missing(bundles, tmp_path):
    doc, tables = scale_report.summarize(scale_report.phase_folders([bundles / "scale_graph.tar.gz"], tmp_path))
    e = doc["systems"]["lilicorr"]["1"]
    assert e["per_block_ms"] is not None and e["decode_step_ms"] is None and e["per_block_ms_eager"] is None
    assert (
        any("eager: no stage timings" in m for m in doc["missing"])
        and doc["targets"]["head_share_c1_le_1.5pct"]["met"] is True
    )
    # a gap is named once, not once per concurrency, in the summary and in cost.md's "Not measured:" line
    eager_gaps = [f"{s} eager: no stage timings" for s in scale_report.SYSTEMS]
    assert [m for m in doc["missing"] if m.endswith("eager: no stage timings")] == eager_gaps
    assert len(doc["missing"]) == len(set(doc["missing"]))
    (line,) = [x for x in scale_report.markdown(doc, tables).splitlines() if x.startswith("Not measured: ")]
    assert line.removeprefix("Not measured: ").split("; ") == doc["missing"]
    assert [s["variant"] for s in tables[1]["systems"]] == ["graph", "graph", "graph"]
    with pytest.raises(UsageError, match="given twice"):
        scale_report.phase_folders([bundles / "scale_graph.tar.gz", bundles / "scale_graph.tar.gz"], tmp_path / "x")
    with pytest.raises(UsageError, match="holds no phase folder"):
        scale_report.phase_folders([tmp_path / "empty"], tmp_path)
    assert scale_report.main([str(tmp_path), "--out", str(tmp_path / "r")]) == 2


def test_the_adaptive_width_is_compared_with_each_pinned_width(bundles, tmp_path):
    """widths7: the adaptive server beside LILICORR pinned at each width (the stand-ins slower the narrower, width 1
    eight times), blocks forced to commit 7: per c the best pinned width and the adaptive's tok/s over it."""
    (folder,) = scale_report.phase_folders([bundles / "scale_widths7.tar.gz"], tmp_path).values()
    record = json.loads((folder / "phase.json").read_text())
    assert record["forced_commit_len"] == 7 and record["server_env"]["lilicorr_w2"]["LILICORR_VERIFY_WIDTH"] == "2"
    doc, tables = scale_report.summarize({"widths7": folder})
    cells = doc["widths"]["widths7"]
    assert set(cells) == {"1", "4", "16", "32"}
    for x in cells.values():
        best = x["tok_s"][x["best_pinned"]]
        assert best == max(v for s, v in x["tok_s"].items() if s != "lilicorr") and x["tok_s"]["lilicorr_w1"] < best
        assert x["vs_best"] == pytest.approx(x["tok_s"]["lilicorr"] / best)
        assert set(x["pinned_vs_adaptive"]) == {f"lilicorr_w{w}" for w in (1, 2, 4, 8, 16)}
    text = scale_report.markdown(doc, tables)
    assert "## Adaptive verify width against each pinned width (widths7: blocks commit 7)" in text
    assert "| 1 | " in text.split("widths7: blocks commit 7")[1]


def test_the_uninstrumented_tput_phase_alone_names_its_card_from_the_phase_record(bundles, tmp_path):
    (folder,) = scale_report.phase_folders([bundles / "scale_tput.tar.gz"], tmp_path).values()
    record = json.loads((folder / "phase.json").read_text())
    assert record["phase"]["stage_timer"] is False and not list(folder.glob("stages/*/stages-*.json"))
    (folder / "phase.json").write_text(json.dumps({**record, "gpu": "Stub H200"}))
    doc, tables = scale_report.summarize({"tput": folder})
    assert doc["card"] == "Stub H200" and set(doc["tok_s_1024"]) == {"1", "4", "16", "32"}
    assert scale_report.markdown(doc, tables).startswith("# Cost at Qwen3-8B scale (Stub H200)")


def fresh_work(built: Path, tmp_path: Path) -> Path:
    """A WORK with the built inputs and no phase (a phase run again in the same WORK resumes its runs)."""
    work = tmp_path / "work"
    for part in ("target", "drafts"):
        shutil.copytree(built / part, work / part)
    shutil.copy(built / "build.json", work / "build.json")
    return work


def test_the_deadline_skips_a_phase_it_leaves_no_time_for(built, bundles, tmp_path, capsys):
    import time

    out = tmp_path / "OUT"
    code = scale.main(
        [
            "run",
            "--work",
            str(fresh_work(built, tmp_path)),
            "--phases",
            "base",
            "--out",
            str(out),
            "--deadline",
            str(time.time() + 60),
        ]
    )
    assert code == 4 and not out.exists() and "run it in the next call" in capsys.readouterr().out
    assert (
        scale.main(
            [
                "run",
                "--work",
                str(built),
                "--phases",
                "base,graph",
                "--out",
                str(out),
                "--deadline",
                str(time.time() + 60),
            ]
        )
        == 0
    )
    assert capsys.readouterr().out.count("measured in an earlier call") == 2  # packed again, not run again
    assert sorted(p.name for p in out.iterdir()) == ["scale_base.tar.gz", "scale_graph.tar.gz"]
    with pytest.raises(SystemExit, match="run `build` first"):
        scale.main(["run", "--work", str(tmp_path), "--phases", "graph", "--out", str(out)])
    with pytest.raises(SystemExit):
        scale.main(["run", "--work", str(built), "--phases", "graph,warp", "--out", str(out)])


def test_a_server_that_fails_to_start_leaves_its_log_in_the_bundle(built, tmp_path, monkeypatch, capsys):
    work = fresh_work(built, tmp_path)
    crash = tmp_path / "crash.py"
    crash.write_text(
        "import sys\nprint('Traceback (most recent call last):')\n"
        "print('ValueError: no flashinfer here')\nsys.exit(3)\n"
    )
    monkeypatch.setenv("SCALE_LAUNCH", f"{sys.executable} {crash}")
    monkeypatch.setattr(scale, "PORT0", free_port_block(1))
    assert scale.main(["run", "--work", str(work), "--phases", "base", "--out", str(tmp_path / "OUT")]) == 1
    printed = capsys.readouterr().out
    assert "ValueError: no flashinfer here" in printed and "servers: SGLang server" in printed
    with tarfile.open(tmp_path / "OUT" / "scale_base.tar.gz") as t:
        assert "base/logs/server-base.log" in t.getnames() and not [
            n for n in t.getnames() if n.startswith("base/round")
        ]


def test_the_stage_timer_flush_sends_a_greedy_request(monkeypatch):
    # LILICORR answers HTTP 400 to temperature > 0 where only the greedy verification exists (the GPU machine)
    from benchmarks.instrumentation import stage_timer
    from benchmarks.served import gpu_client

    sent = []
    monkeypatch.setattr(stage_timer, "IDLE_DUMP_S", 0.0)
    monkeypatch.setattr(gpu_client, "post_json", lambda url, path, body, timeout: sent.append((url, path, body)))
    assert scale.flush_stage_timers({"lilicorr": "http://a", "dflash": "http://b"}) == []
    assert [(url, path) for url, path, _ in sent] == [("http://a", "/generate"), ("http://b", "/generate")]
    assert all(body["sampling_params"]["temperature"] == 0.0 for _, _, body in sent)
