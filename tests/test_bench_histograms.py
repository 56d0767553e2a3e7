"""SGLang's per-request histograms through `lilicorr bench`: each turn records the verify steps by accepted drafts
(spec_correct_drafts_histogram) and by verified width (spec_cap_lens_histogram, LILICORR's verify width) where the
server sends them; `bench report` shows the acceptance per position and the width use per system and concurrency.
Records without them (older runs, no speculation) still read."""

import json

import pytest

pytest.importorskip("aiohttp")

from stub_server import StubServer

from sglang_lilicorr import cli
from sglang_lilicorr.bench import metrics, runner
from sglang_lilicorr.bench.client import Sampling
from sglang_lilicorr.bench.metrics import ResultsError
from sglang_lilicorr.bench.prompt import Prompt

PROMPTS = [Prompt(f"p{i}", "c", (f"tell me about thing {i}",), "t") for i in range(3)]


def play(stub, path, system="lilicorr", c=1, api="chat", **kw) -> list[dict]:
    cfg = runner.RunConfig(system, "d", c, 0.0, 0, 12)
    sampling = Sampling(max_tokens=12, ignore_eos=True)
    runner.run(PROMPTS, cfg, stub.url, path, sampling, api=api, show_progress=False, **kw)
    return runner.read_results(path)


@pytest.mark.parametrize("api", ["chat", "generate"])
def test_each_turn_records_the_servers_histograms_as_sglang_sends_them(tmp_path, api):
    """A LILICORR stand-in (widths 1, 16, 16; 4 tokens a block at most): 12 tokens in steps of 1, 4, 4, 1, 2 tokens
    -> accepted drafts 0, 3, 3, 0, 1 at widths 1, 16, 16, 1, 16; a DFLASH stand-in reports no widths, no speculation
    nothing."""
    with StubServer(accept=4, widths=(1, 16, 16)) as stub:
        (record, *_) = play(stub, tmp_path / "lilicorr.jsonl", api=api)
    turn = record["turns"][0]
    assert turn["spec_verify_ct"] == 5
    assert turn["spec_correct_drafts_histogram"] == [2, 1, 0, 2]
    assert turn["spec_cap_lens_histogram"] == [0, 2] + [0] * 14 + [3]
    with StubServer(accept=4) as stub:
        (record, *_) = play(stub, tmp_path / "dflash.jsonl", system="dflash", api=api)
    assert record["turns"][0]["spec_correct_drafts_histogram"] == [0, 0, 0, 3]
    assert "spec_cap_lens_histogram" not in record["turns"][0]
    with StubServer(speculative=False) as stub:
        (record, *_) = play(stub, tmp_path / "base.jsonl", system="base", api=api)
    assert not set(runner.TURN_LISTS) & set(record["turns"][0])


def test_record_ids_keeps_each_turns_token_ids_through_the_chat_api(tmp_path):
    with StubServer(accept=4, widths=(16,)) as stub:
        records = play(stub, tmp_path / "ids.jsonl", record_ids=True)
        body = stub.log[-1]["body"]
    assert body["return_input_ids_in_sglext"] and body["return_output_ids_in_sglext"]
    turn = records[0]["turns"][0]
    assert turn["input_ids"] == [7, 7, 7] and turn["output_ids"][:3] == [1, 2, 3]
    assert sum(turn["spec_cap_lens_histogram"]) == turn["spec_verify_ct"]
    with pytest.raises(ValueError, match="api 'generate' has no such option"):
        with StubServer() as stub:
            play(stub, tmp_path / "gen.jsonl", api="generate", record_ids=True)


def turn(hist=None, caps=None, **extra) -> dict:
    t = {"completion_tokens": 10, "spec_verify_ct": sum(hist or ()) or None, "start": 0.0, "end": 1.0, "text": "x"}
    if hist is not None:
        t["spec_correct_drafts_histogram"] = hist
    if caps is not None:
        t["spec_cap_lens_histogram"] = caps
    return {**t, **extra}


def record(system, c, prompt_id, *turns) -> dict:
    return {
        "system": system,
        "dataset": "d",
        "concurrency": c,
        "temperature": 0.0,
        "seed": 0,
        "max_tokens": 16,
        "prompt_id": prompt_id,
        "category": "c",
        "turns": list(turns),
    }


def write(path, *records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_old_records_still_read_and_a_bad_histogram_is_named(tmp_path):
    old = write(tmp_path / "old.jsonl", record("lilicorr", 1, "a", turn()))
    (cell,) = metrics.aggregate(runner.read_results(old))
    assert cell["acceptance"] is None and cell["tiers"] is None and cell["correct_drafts_histogram"] is None
    for bad in ([1, -1], [1.5], "3", [True], None):
        path = write(tmp_path / "bad.jsonl", record("lilicorr", 1, "a", turn([1, 2], spec_cap_lens_histogram=bad)))
        with pytest.raises(ResultsError, match=r"bad: \['spec_cap_lens_histogram'\]\) \(.*bad\.jsonl:1\)"):
            runner.read_results(path)
    with pytest.raises(ResultsError, match=r"bad: \['output_ids'\]"):
        runner.check_record(record("x", 1, "a", turn(output_ids=[3, "4"])), "here")


def test_acceptance_and_width_shares_pool_every_turn_seed_and_run():
    # c = 1: 4 steps accepting 0, 1, 1, 3 drafts at widths 1, 4, 4, 16 over two prompts (one of two turns)
    one = [
        record("lilicorr", 1, "a", turn([1, 1], [0, 1, 0, 0, 1]), turn([0, 0, 0, 1], [0] * 16 + [1])),
        record("lilicorr", 1, "b", turn([0, 1], [0, 0, 0, 0, 1])),
        record("base", 1, "a", turn()),
    ]
    cells = {(c["system"], c["concurrency"]): c for c in metrics.aggregate(one)}
    lilicorr = cells["lilicorr", 1]
    assert lilicorr["correct_drafts_histogram"] == [1, 2, 0, 1]
    assert lilicorr["acceptance"] == [0.75, 0.25, 0.25]
    assert lilicorr["tiers"] == {"1": 0.25, "4": 0.5, "16": 0.25}
    assert cells["base", 1]["acceptance"] is None and cells["base", 1]["tiers"] is None
    # every step accepting nothing still has a position 1
    assert metrics.acceptance([5]) == [0.0] and metrics.acceptance([]) is None
    # a second run of the cell: histograms summed, shares from the sums
    again = metrics.aggregate([record("lilicorr", 1, "a", turn([0, 0, 0, 4], [0] * 16 + [4]))])
    (pooled,) = [c for c in metrics.pool_runs([list(cells.values()), again]) if c["system"] == "lilicorr"]
    assert pooled["correct_drafts_histogram"] == [1, 2, 0, 5] and pooled["acceptance"] == [0.875, 0.625, 0.625]
    assert pooled["tiers"] == {"1": 0.125, "4": 0.25, "16": 0.625}


def test_report_shows_acceptance_per_position_and_width_use_per_system_and_concurrency(tmp_path, capsys):
    spec = write(
        tmp_path / "spec.jsonl",
        record("lilicorr", 1, "a", turn([1, 1, 0, 2], [0, 1, 0, 0, 1] + [0] * 11 + [2])),
        record("lilicorr", 8, "a", turn([3, 1], [0, 4])),
        record("dflash", 1, "a", turn([0, 0, 4])),
        record("dflash", 8, "a", turn([1, 1, 2])),
    )
    base = write(tmp_path / "base.jsonl", record("base", 1, "a", turn()), record("base", 8, "a", turn()))
    out = tmp_path / "report"
    assert cli.main(["bench", "report", str(base), str(spec), "--baseline", "base", "--out", str(out)]) == 0
    text = (out / "report.md").read_text()
    acceptance = text.split("## Acceptance per position")[1].split("\n## ")[0]
    assert "| Benchmark | T | system | c | 1 | 2 | 3 | verify steps |" in acceptance
    assert "| d | 0 | lilicorr | 1 | 0.750 | 0.500 | 0.500 | 4 |" in acceptance
    assert "| d | 0 | dflash | 8 | 0.750 | 0.500 | 0.000 | 4 |" in acceptance and "| base |" not in acceptance
    widths = text.split("## Verify width use")[1].split("\n## ")[0]
    assert "| Benchmark | T | system | c | w 1 | w 4 | w 16 | verify steps |" in widths
    assert "| d | 0 | lilicorr | 1 | 0.250 | 0.250 | 0.500 | 4 |" in widths
    assert "| d | 0 | lilicorr | 8 | 1.000 | 0.000 | 0.000 | 4 |" in widths and "dflash" not in widths
    cells = {(c["system"], c["concurrency"]): c for c in json.loads((out / "summary.json").read_text())["cells"]}
    assert cells["lilicorr", 8]["tiers"] == {"1": 1.0} and cells["dflash", 1]["acceptance"] == [1.0, 1.0]
    assert {"acceptance_d_T0.png", "tiers_d_T0.png"} <= {p.name for p in out.glob("*.png")}
    # the summary read back reports the same tables
    again = tmp_path / "again"
    assert cli.main(["bench", "report", str(out / "summary.json"), "--out", str(again), "--no-plots"]) == 0
    assert acceptance in (again / "report.md").read_text()
