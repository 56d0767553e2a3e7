"""tau, TPS, speedup, aggregation into cells, markdown tables, stage decomposition."""

import pytest

from sglang_lilicorr.bench import metrics, tables


from benchmarks.served import stages


def _record(system="spec", dataset="d", category="a", c=1, t=0.0, seed=0, turns=((40, 10, 0.0, 1.0),)):
    return {
        "system": system,
        "dataset": dataset,
        "category": category,
        "concurrency": c,
        "temperature": t,
        "seed": seed,
        "max_tokens": 64,
        "prompt_id": f"{category}{turns[0][2]}",
        "turns": [
            {"completion_tokens": n, "spec_verify_ct": v, "start": s, "end": e, "text": ""} for n, v, s, e in turns
        ],
    }


def test_tau_is_block_weighted_not_request_averaged():
    # request 1: 90 tokens in 10 blocks (9.0); request 2: 10 tokens in 10 blocks (1.0)
    recs = [_record(turns=((90, 10, 0.0, 1.0),)), _record(turns=((10, 10, 1.0, 2.0),))]
    assert metrics.tau(recs) == pytest.approx(100 / 20)  # not (9 + 1) / 2 either way, but pooled
    recs = [_record(turns=((90, 10, 0.0, 1.0),)), _record(turns=((10, 5, 1.0, 2.0),))]
    assert metrics.tau(recs) == pytest.approx(100 / 15)  # the per-request mean would be 5.5


def test_tau_is_none_without_spec_stats_and_skips_unreported_turns():
    assert metrics.tau([_record(turns=((40, None, 0.0, 1.0),))]) is None
    assert metrics.tau([_record(turns=((40, 10, 0.0, 1.0), (1, None, 1.0, 1.1)))]) == pytest.approx(4.0)


def test_block_ms_is_pooled_latency_per_verification_block():
    # 2.0 s over 10 blocks and 1.0 s over 40 blocks: 3000 ms / 50 blocks, not the mean of 200 and 25 ms
    recs = [_record(turns=((40, 10, 0.0, 2.0),)), _record(turns=((90, 40, 0.5, 1.5),))]
    assert metrics.block_ms(recs) == pytest.approx(3000 / 50)
    assert metrics.block_ms([_record(turns=((40, 10, 0.0, 1.0), (5, None, 1.0, 9.0)))]) == pytest.approx(100.0)
    assert metrics.block_ms([_record(turns=((40, None, 0.0, 1.0),))]) is None


def test_block_ratio_and_block_table_against_a_reference_system():
    recs = [
        _record(system="ar", turns=((40, None, 0.0, 2.0),)),
        _record(system="dflash", turns=((40, 20, 0.0, 0.4),)),  # 20 ms / block
        _record(system="lilicorr", turns=((40, 10, 0.0, 0.25),)),
    ]  # 25 ms / block
    cells = metrics.add_block_ratio(metrics.add_speedup(metrics.aggregate(recs), "ar"), "dflash")
    get = {c["system"]: c for c in cells}
    assert get["lilicorr"]["block_ms"] == pytest.approx(25.0) and get["lilicorr"]["block_ratio"] == pytest.approx(1.25)
    assert get["dflash"]["block_ratio"] == pytest.approx(1.0) and get["ar"]["block_ratio"] is None
    table = tables.block_table(cells, 1, "dflash")
    assert table.splitlines()[0] == "|  | Benchmark | dflash (ms / ratio vs dflash) | lilicorr (ms / ratio vs dflash) |"
    assert "| Greedy, T=0 | d | **20.00** / **1.00x** | 25.00 / 1.25x |" in table
    assert "| lilicorr (ms) |" in tables.block_table(cells, 1)
    full = tables.report(cells, "ar", "dflash")
    assert (
        "Per-block wall, concurrency 1 (ms of request latency per verification block; ratio = ms / ms of dflash)"
        in full
    )
    (row,) = [r for r in metrics.compare([get["ar"]], [get["lilicorr"]])]
    assert row["block_ms"] == pytest.approx(25.0)


def test_repeated_runs_pool_to_their_mean_with_the_spread_across_runs():
    first = metrics.aggregate(
        [
            _record(system="dflash", turns=((40, 20, 0.0, 0.4),)),
            _record(system="lilicorr", turns=((40, 10, 0.0, 0.25),)),
        ]
    )
    second = metrics.aggregate([_record(system="dflash", turns=((40, 20, 0.0, 0.6),))])  # lilicorr missing in this run
    cells = {c["system"]: c for c in metrics.pool_runs([first, second])}
    d, l = cells["dflash"], cells["lilicorr"]
    assert d["runs"] == 2 and d["block_ms"] == pytest.approx(25.0) and d["block_ms_std"] == pytest.approx(7.0710678)
    assert d["tps"] == pytest.approx((100.0 + 40 / 0.6) / 2) and d["tau"] == pytest.approx(2.0) and d["tau_std"] == 0.0
    assert d["completion_tokens"] == 80 and d["verify_blocks"] == 40
    assert l["runs"] == 1 and l["block_ms"] == pytest.approx(25.0)
    assert metrics.pool_runs([first]) == [{**c, "runs": 1, "run_ids": [0]} for c in first]  # one run: unchanged
    pooled = metrics.add_block_ratio(list(cells.values()), "dflash")
    assert {c["system"]: c["block_ratio"] for c in pooled}["lilicorr"] == pytest.approx(1.0)
    assert "Repeated runs pooled" in tables.report(pooled, None, "dflash")
    assert "Repeated runs pooled" not in tables.report(metrics.pool_runs([first]), None)
    assert d["block_ms_per_run"] == [pytest.approx(20.0), pytest.approx(30.0)] and "block_ms_per_run" not in l


def test_repeated_runs_pair_with_the_reference_run_by_run():
    """Each run's ratio to the reference's cell of the same run; a run without both cells is left
    out; the mean of the ratios with its 95 % t interval, in the report."""

    def run(d_end, l_end):
        recs = [_record(system="dflash", turns=((40, 20, 0.0, d_end),))]
        return metrics.aggregate(recs + ([_record(system="lilicorr", turns=((40, 10, 0.0, l_end),))] if l_end else []))

    runs = [run(0.4, None), run(0.4, 0.2), run(0.5, 0.2), run(0.4, 0.4)]  # lilicorr misses run 0
    cells = metrics.add_paired_ratios(metrics.add_block_ratio(metrics.pool_runs(runs), "dflash"), "dflash")
    get = {c["system"]: c for c in cells}
    assert "paired" not in get["dflash"] and get["lilicorr"]["paired"]["runs"] == [1, 2, 3]
    tps = [
        2.0,
        2.5,
        1.0,
    ]  # lilicorr tokens/s over dflash's, run by run (same tokens, wall 0.2 vs 0.4, 0.2 vs 0.5, 0.4 vs 0.4)
    block = [1.0, 0.8, 2.0]  # 20 ms vs 20, 20 vs 25, 40 vs 20
    for name, want in (("tps", tps), ("block_ms", block)):
        got = get["lilicorr"]["paired"][name]
        half = 4.303 * __import__("statistics").stdev(want) / 3**0.5  # t(0.975, df 2)
        assert got["n"] == 3 and got["mean"] == pytest.approx(sum(want) / 3)
        assert (got["lo"], got["hi"]) == (pytest.approx(got["mean"] - half), pytest.approx(got["mean"] + half))
    report = tables.report(cells, None, "dflash")
    assert "## Paired runs (each run's ratio to dflash" in report
    assert "| d | 1 | 0 | lilicorr | 3 | 1.833 (" in report
    single = metrics.add_paired_ratios(
        metrics.aggregate([_record(system="dflash"), _record(system="lilicorr")]), "dflash"
    )
    assert not any("paired" in c for c in single) and "Paired runs" not in tables.report(single, None, "dflash")
    assert metrics.mean_ci95([3.0]) == {"n": 1, "mean": 3.0, "std": 0.0, "lo": 3.0, "hi": 3.0}


def test_repeated_runs_are_plotted_per_run(tmp_path):
    from sglang_lilicorr.bench import plots

    runs = [
        metrics.aggregate(
            [
                _record(system="dflash", turns=((40, 20, 0.0, end),)),
                _record(system="lilicorr", turns=((40, 10, 0.0, 0.25),)),
            ]
        )
        for end in (0.4, 0.6)
    ]
    paths = plots.plot_all(metrics.pool_runs(runs), None, tmp_path)
    assert [p.name for p in paths] == ["runs_d_T0_c1.png"] and paths[0].stat().st_size > 0
    assert plots.plot_all(runs[0], None, tmp_path / "one") == []  # one run: nothing to plot per run


def test_busy_seconds_is_the_union_of_intervals():
    assert metrics.busy_seconds([(0, 2), (1, 3), (5, 6)]) == pytest.approx(4.0)
    assert metrics.busy_seconds([]) == 0.0
    with pytest.raises(ValueError):
        metrics.busy_seconds([(2, 1)])


def test_busy_seconds_off_zero_and_at_the_edges():
    """Intervals that do not start at 0 (a gap closes the interval before it), touching ones, empty ones."""
    assert metrics.busy_seconds([(1.0, 2.0), (4.0, 6.0)]) == pytest.approx(3.0)
    assert metrics.busy_seconds([(4.0, 6.0), (1.5, 2.0), (2.0, 3.0), (10.0, 10.5)]) == pytest.approx(4.0)
    assert metrics.busy_seconds([(3.0, 3.0)]) == 0.0  # a request that took no time is not an error
    assert metrics.busy_seconds([(1.0, 5.0), (2.0, 3.0), (7.0, 7.0)]) == pytest.approx(4.0)


def test_tps_of_records_that_span_no_time_is_refused():
    with pytest.raises(metrics.ResultsError, match="span no time"):
        metrics.output_tps([_record(turns=((40, 10, 2.0, 2.0),))])
    with pytest.raises(metrics.ResultsError, match="span no time"):
        metrics.output_tps([])
    assert metrics.output_tps([_record(turns=((30, 10, 2.0, 2.0), (30, 10, 2.0, 2.5)))]) == pytest.approx(120.0)


def test_one_seed_has_no_spread():
    (cell,) = metrics.aggregate([_record(turns=((40, 10, 1.0, 1.5),))])
    assert (cell["tau"], cell["block_ms"], cell["tps"]) == (
        pytest.approx(4.0),
        pytest.approx(50.0),
        pytest.approx(80.0),
    )
    assert (cell["tau_std"], cell["block_ms_std"], cell["tps_std"]) == (0.0, 0.0, 0.0)
    assert metrics._mean_std([None, 2.0, None]) == (2.0, 0.0) and metrics._mean_std([None]) == (None, None)
    (plain,) = metrics.aggregate([_record(turns=((40, None, 1.0, 1.5), (20, 0, 2.0, 2.5)))])  # no spec stats
    assert (plain["verify_blocks"], plain["completion_tokens"], plain["tau"], plain["block_ms"]) == (0, 60, None, None)


def test_runs_the_reference_did_not_play_give_no_paired_entry():
    """Pooled cells of two runs each, the reference's from other runs than the system's: no pair, no `paired`."""

    def run(system, end):
        return metrics.aggregate([_record(system=system, turns=((40, 10, 0.0, end),))])

    cells = metrics.pool_runs([run("dflash", 0.4), run("dflash", 0.5), run("lilicorr", 0.2), run("lilicorr", 0.3)])
    cells = metrics.add_paired_ratios(cells, "dflash")
    assert not any("paired" in c for c in cells)
    cells = metrics.add_paired_ratios(
        metrics.pool_runs([run("dflash", 0.4), run("dflash", 0.5)])
        + [{**c, "run_ids": [0, 1]} for c in metrics.pool_runs([run("lilicorr", 0.2), run("lilicorr", 0.25)])],
        "dflash",
    )
    paired = {c["system"]: c for c in cells}["lilicorr"]["paired"]
    assert paired["runs"] == [0, 1] and paired["tps"]["mean"] == pytest.approx((2.0 + 2.0) / 2)


def test_tps_counts_overlapping_requests_once():
    recs = [_record(turns=((100, 25, 0.0, 2.0),)), _record(turns=((100, 25, 1.0, 3.0),))]
    assert metrics.output_tps(recs) == pytest.approx(200 / 3.0)


def test_aggregate_groups_averages_seeds_and_adds_speedup():
    recs = [
        _record(system="ar", category="a", turns=((40, None, 0.0, 1.0),)),
        _record(system="ar", category="b", turns=((40, None, 1.0, 2.0),)),
        _record(system="spec", category="a", t=1.0, seed=0, turns=((40, 10, 0.0, 0.5),)),
        _record(system="spec", category="a", t=1.0, seed=1, turns=((40, 20, 0.0, 0.25),)),
        _record(system="ar", category="a", t=1.0, turns=((40, None, 0.0, 1.0),)),
        _record(system="spec", category="a", turns=((40, 10, 0.0, 0.25),)),
        _record(system="spec", category="b", turns=((40, 10, 1.0, 1.25),)),
    ]
    cells = metrics.add_speedup(metrics.aggregate(recs), "ar")
    get = {(c["system"], c["group"], c["temperature"]): c for c in cells}
    assert get[("spec", "all", 0.0)]["tps"] == pytest.approx(80 / 0.5)
    assert get[("spec", "all", 0.0)]["speedup"] == pytest.approx((80 / 0.5) / (80 / 2.0))
    assert get[("ar", "b", 0.0)]["speedup"] == pytest.approx(1.0) and get[("ar", "b", 0.0)]["tau"] is None
    sampled = get[("spec", "a", 1.0)]
    assert sampled["seeds"] == [0, 1] and sampled["tau"] == pytest.approx((4.0 + 2.0) / 2)
    assert sampled["tps"] == pytest.approx((80 + 160) / 2) and sampled["tps_std"] > 0


def test_single_category_dataset_has_only_the_all_cell():
    cells = metrics.aggregate([_record(category="gsm8k", dataset="gsm8k")])
    assert [c["group"] for c in cells] == ["all"]


def test_compare_matches_cells_and_errors_without_overlap():
    base = metrics.aggregate([_record(system="ar", turns=((40, None, 0.0, 2.0),))])
    spec = metrics.aggregate([_record(system="spec", turns=((40, 10, 0.0, 0.5),))])
    (row,) = metrics.compare(base, spec)
    assert row["speedup"] == pytest.approx(4.0) and row["tau"] == pytest.approx(4.0)
    with pytest.raises(ValueError, match="matches a baseline"):
        metrics.compare(base, metrics.aggregate([_record(system="spec", dataset="other")]))


def _sweep_cells():
    recs = []
    for c in (1, 2):
        for sys_, tau_blocks, dur in (("ar", None, 2.0), ("x", 10, 0.5), ("y", 20, 0.8)):
            for cat in ("low_entropy", "mixed"):
                recs.append(
                    _record(
                        system=sys_,
                        dataset="speed_throughput_1k",
                        category=cat,
                        c=c,
                        turns=((40, tau_blocks, 0.0, dur / c),),
                    )
                )
    return metrics.add_speedup(metrics.aggregate(recs), "ar")


def test_tables_follow_the_paper_layouts():
    cells = _sweep_cells()
    main = tables.main_table(cells, "ar", concurrency=1)
    assert main.splitlines()[0] == "|  | Benchmark | ar (TPS / Sp.) | x (τ / TPS / Sp.) | y (τ / TPS / Sp.) |"
    row = [line for line in main.splitlines() if "speed_throughput_1k" in line][0]
    assert (
        "Greedy, T=0" in row
        and "40 / 1.00x" in row
        and "**4.00** / **160** / **4.00x**" in row
        and "2.00 / 100 / 2.50x" in row
    )
    cat = tables.category_table(cells, "speed_throughput_1k", "ar")
    assert (
        "| Greedy, T=0 | low_entropy | 20 | **4.00** / **80** | 2.00 / 50 |" in cat
        and "| ar (TPS) | x (τ / TPS) |" in cat
    )
    conc = tables.concurrency_table(cells, "speed_throughput_1k", "ar", 0.0)
    assert "speed_throughput_1k, low_entropy" in conc and "speed_throughput_1k, mixed" in conc
    assert [line.split("|")[2].strip() for line in conc.splitlines()[2:]] == ["1", "2", "1", "2"]
    full = tables.report(cells, "ar")
    assert "concurrency 2" in full and "vs concurrency" in full


def test_stage_table_and_plot(tmp_path):
    doc = {
        "benchmark": "mt_bench",
        "systems": [
            {
                "system": "dflash",
                "stages": {
                    "target_verify": 7.48,
                    "draft_backbone": 1.28,
                    "lm_head": 0.49,
                    "spec_head": 0.05,
                    "accept": 0.57,
                },
            },
            {
                "system": "lilicorr",
                "variant": "optimized",
                "stages": {
                    "target_verify": 7.51,
                    "draft_backbone": 1.29,
                    "lm_head": 0.50,
                    "spec_head": 0.28,
                    "accept": 0.57,
                },
            },
        ],
    }
    md = stages.table(doc)
    assert "| Speculative head | **0.05** | 0.28 |" in md and "| Per-block wall | 9.87 | 10.15 |" in md
    assert "lilicorr (optimized)" in md
    png = stages.plot(doc, tmp_path / "stages.png")
    assert png.stat().st_size > 1000
    bad = {"systems": [{"system": "x", "stages": {"target_verify": 1.0}}]}
    with pytest.raises(stages.StageSchemaError, match="exactly the keys"):
        stages.validate(bad)


@pytest.mark.parametrize(
    "n,t",
    [
        (2, 12.706),
        (3, 4.303),
        (4, 3.182),
        (5, 2.776),
        (6, 2.571),
        (7, 2.447),
        (8, 2.365),
        (9, 2.306),
        (10, 2.262),
        (11, 2.228),
        (12, 2.228),
        (15, 2.228),
        (16, 2.131),
        (20, 2.131),
        (21, 2.086),
        (25, 2.086),
        (30, 2.086),
        (31, 2.042),
        (40, 2.042),
        (60, 2.042),
        (61, 2.000),
        (200, 2.000),
    ],
)
def test_t_interval_on_table_rows_between_them_and_above_the_last(n, t):
    """Degrees of freedom between rows take the row below and above the last row the last one: the interval is
    never narrower than the exact t interval (t(0.975, dof) decreases with dof)."""
    import statistics

    values = [1.0 + 0.37 * ((7 * k) % 5) + 0.01 * k for k in range(n)]
    got = metrics.mean_ci95(values)
    mean, std = statistics.fmean(values), statistics.stdev(values)
    half = t * std / n**0.5
    assert got == {
        "n": n,
        "mean": pytest.approx(mean),
        "std": pytest.approx(std),
        "lo": pytest.approx(mean - half),
        "hi": pytest.approx(mean + half),
    }


def test_pooling_summary_cells_that_carry_only_the_key_and_tps():
    """A summary .json cell needs only the cell key and tps (cli.SUMMARY_CELL_FIELDS): the counts it lacks pool to 0."""

    def cell(tps, **more):
        return {"system": "s", "dataset": "d", "group": "all", "concurrency": 1, "temperature": 0.0, "tps": tps, **more}

    (pooled,) = metrics.pool_runs([[cell(10.0)], [cell(30.0, verify_blocks=None)]])
    assert (pooled["n_prompts"], pooled["completion_tokens"], pooled["verify_blocks"]) == (0, 0, 0)
    assert pooled["tps"] == pytest.approx(20.0) and pooled["tau"] is None and pooled["runs"] == 2
    (pooled,) = metrics.pool_runs(
        [[cell(10.0, n_prompts=3, verify_blocks=4)], [cell(30.0, n_prompts=5, verify_blocks=None)]]
    )
    assert (pooled["n_prompts"], pooled["verify_blocks"]) == (5, 4)


def test_paired_ratios_skip_runs_without_the_value_on_either_side():
    """block_ms is None in a run without spec stats: that run gives no block ratio (either side), the tps ratio
    stays."""

    def run(system, end, spec=True):
        return metrics.aggregate([_record(system=system, turns=((40, 10 if spec else None, 0.0, end),))])

    runs = [
        run("ref", 0.4) + run("sys", 0.2, spec=False),
        run("ref", 0.4, spec=False) + run("sys", 0.2),
        run("ref", 0.5) + run("sys", 0.25),
    ]
    cells = {c["system"]: c for c in metrics.add_paired_ratios(metrics.pool_runs(runs), "ref")}
    paired = cells["sys"]["paired"]
    assert paired["runs"] == [0, 1, 2] and paired["tps"]["n"] == 3 and paired["tps"]["mean"] == pytest.approx(2.0)
    assert paired["block_ms"]["n"] == 1 and paired["block_ms"]["mean"] == pytest.approx(25.0 / 50.0)


def test_a_summary_read_back_loses_its_own_comparisons():
    """Found by mutation testing: pool_runs kept a summary cell's speedup, block_ratio and paired entries, so a report
    of summaries written with --block-ref, made without it (or pooled with other runs), showed the old runs' paired
    table against a reference it no longer had. They are dropped, and a report computes them again; a summary of
    repeated runs is not pooled with other runs (found by a second reader: it weighed its runs as one)."""

    def run(system, end):
        return metrics.aggregate([_record(system=system, turns=((40, 10, 0.0, end),))])

    old = metrics.pool_runs([run("ref", 0.4) + run("sys", 0.2), run("ref", 0.5) + run("sys", 0.2)])
    old = metrics.add_speedup(metrics.add_paired_ratios(metrics.add_block_ratio(old, "ref"), "ref"), "ref")
    assert "paired" in {c["system"]: c for c in old}["sys"]
    pooled = metrics.pool_runs([old])
    assert not any(k in c for c in pooled for k in metrics.COMPARISONS)
    assert "Paired runs" not in tables.report(metrics.add_speedup(pooled, None), None)
    with pytest.raises(metrics.ResultsError, match="a summary of repeated runs pooled with other runs .*results files"):
        metrics.pool_runs([old, run("sys", 0.4)])  # its two runs' counts are merged: they cannot be weighed again
    alone = metrics.add_paired_ratios(metrics.pool_runs([old]), "ref")  # read back alone, its runs still pair
    assert {c["system"]: c for c in alone}["sys"]["paired"]["runs"] == [0, 1]


def test_cells_come_sorted_by_their_key_whatever_the_record_order():
    recs = [
        _record(system="b", c=2),
        _record(system="b", c=1, seed=3),
        _record(system="a", c=8, t=1.0),
        _record(system="a", c=8, t=0.0, seed=1),
    ]
    keys = [(c["system"], c["concurrency"], c["temperature"]) for c in metrics.aggregate(recs)]
    assert keys == [("a", 8, 0.0), ("a", 8, 1.0), ("b", 1, 0.0), ("b", 2, 0.0)]
    assert metrics.aggregate(recs[::-1]) == metrics.aggregate(recs)


# --- what mutation testing found untested: touching intervals exactly, text order, pooled keys, pairs, compare ------


def test_touching_intervals_measure_as_one():
    """(0.1, 0.2) then (0.2, 1.1): 1.1 - 0.1 = 1.0, where (0.2 - 0.1) + (1.1 - 0.2) rounds to 1.0000000000000002."""
    assert metrics.busy_seconds([(0.1, 0.2), (0.2, 1.1)]) == 1.1 - 0.1
    with pytest.raises(ValueError) as refused:
        metrics.busy_seconds([(2.0, 1.0)])
    assert str(refused.value) == "interval ends before it starts: (2.0, 1.0)."
    with pytest.raises(metrics.ResultsError) as refused:
        metrics.output_tps([])
    assert (
        str(refused.value) == "the records span no time; cannot compute tokens per second: check their start/end times"
    )


def test_cells_sort_by_the_text_of_their_key():
    """Concurrency 16 before 4 (text order: a key may hold values of different types)."""
    cells = metrics.aggregate([_record(c=4), _record(c=16)])
    assert [c["concurrency"] for c in cells] == [16, 4] and [c["n_prompts"] for c in cells] == [1, 1]


def test_pooled_cells_keep_their_runs_and_union_their_seeds():
    first = metrics.aggregate([_record(seed=0), _record(seed=2)])
    second = metrics.aggregate([_record(seed=1), _record(seed=2)])
    (pooled,) = metrics.pool_runs([first, second])
    assert pooled["seeds"] == [0, 1, 2] and pooled["runs"] == 2
    (again,) = metrics.pool_runs([[pooled]])  # a pooled cell read back alone keeps its count of runs
    assert again["runs"] == 2


def test_pairs_need_per_run_values_on_both_sides_and_a_value():
    def run(system, end, spec=True):
        return metrics.aggregate([_record(system=system, turns=((40, 10 if spec else None, 0.0, end),))])

    pooled = metrics.pool_runs([run("sys", 0.2), run("sys", 0.25)])
    one_ref = [{**c, "run_ids": [0]} for c in metrics.pool_runs([run("ref", 0.4)])]  # the reference from one run
    assert not any("paired" in c for c in metrics.add_paired_ratios(pooled + one_ref, "ref"))
    assert not any("paired" in c for c in metrics.add_paired_ratios(pooled, "ref"))  # no reference cell at all
    plain = metrics.pool_runs(
        [run("ref", 0.4, False) + run("sys", 0.2, False), run("ref", 0.5, False) + run("sys", 0.2, False)]
    )
    paired = {c["system"]: c for c in metrics.add_paired_ratios(plain, "ref")}["sys"]["paired"]
    assert set(paired) == {"runs", "tps"} and paired["tps"]["mean"] == pytest.approx((2.0 + 2.5) / 2)


def test_compare_rows_in_full_past_an_unmatched_cell():
    base = metrics.aggregate([_record(system="ar", turns=((40, None, 0.0, 2.0),))])
    spec = metrics.aggregate(
        [_record(system="spec", dataset="other"), _record(system="spec", turns=((40, 10, 0.0, 0.5),))]
    )
    assert [c["dataset"] for c in spec] == ["d", "other"]
    spec = spec[::-1]  # the unmatched cell first
    assert metrics.compare(base, spec) == [
        {
            "dataset": "d",
            "group": "all",
            "concurrency": 1,
            "temperature": 0.0,
            "base_system": "ar",
            "system": "spec",
            "tau": 4.0,
            "block_ms": 50.0,
            "base_tps": 20.0,
            "tps": 80.0,
            "speedup": 4.0,
        }
    ]
    with pytest.raises(metrics.ResultsError) as refused:
        metrics.compare(base, spec[:1])
    assert str(refused.value) == (
        "no cell of the speculative results matches a baseline cell: compare runs of the same "
        "dataset, group, concurrency and temperature"
    )
