"""reference/check.py on a bigram model whose logits are chosen exactly: deficits, tolerances in bf16 ulps
(off the default 1 and 2), the top-2 gap, the float32/float64 pass; and the lab's greedy-check over served files
(benchmarks/served/greedy_check.py): its counts and exit code."""

import gzip
import json
import math

import pytest
import torch
from torch import nn

from benchmarks.served import greedy_check
from benchmarks.served.greedy_check import served_greedy_records
from sglang_lilicorr.reference.check import GreedyReport, Mismatch, bf16_ulp, check_greedy

# next-token logits after each token (exact in float32); the top logit 8 has a bf16 ulp of 1/16, 2 has 1/64
TABLE = [
    [0.0, 8.0, 7.5, 1.0, 0.0],  # after 0: argmax 1, gap 0.5
    [0.0, 0.0, 8.0, 8.0 - 2.5 / 16, 0.0],  # after 1: argmax 2; token 3 is 2.5 ulps short
    [4.0, 0.0, 0.0, 0.0, 3.0],  # after 2: argmax 0, gap 1
    [0.0, 0.0, 0.0, 0.0, 16.0],  # after 3: argmax 4, gap 16
    [2.0, 2.0 - 1.25 / 64, 0.0, 0.0, 0.0],  # after 4: argmax 0; token 1 is 1.25 ulps short
]


class Bigram(nn.Module):
    calls: list = []

    def __init__(self, table=TABLE):
        super().__init__()
        self.table = nn.Parameter(torch.tensor(table))

    def forward(self, input_ids, use_cache=True):
        Bigram.calls.append((self, self.table.dtype, torch.backends.cuda.matmul.allow_tf32, use_cache))
        return type("Out", (), {"logits": self.table[input_ids]})()


def test_bf16_ulp_values():
    assert bf16_ulp(1.0) == 2.0**-7
    assert bf16_ulp(8.0) == bf16_ulp(-8.0) == bf16_ulp(15.9) == 2.0**-4
    assert bf16_ulp(0.75) == 2.0**-8
    assert bf16_ulp(0.0) == 2.0**-133
    for x in (1.0, 3.0, 96.0):  # the spacing of torch's bfloat16 there
        b = torch.tensor(x, dtype=torch.bfloat16)
        assert bf16_ulp(x) == float((b.float() + bf16_ulp(x)).bfloat16()) - x == float(b.float() + bf16_ulp(x)) - x


def test_refusals_and_empty_output():
    m = Bigram()
    with pytest.raises(ValueError, match="prompt is empty"):
        check_greedy(m, [], [1])
    with pytest.raises(ValueError, match="dtype"):
        check_greedy(m, [0], [1], dtype=torch.bfloat16)
    r = check_greedy(m, [0], [])
    assert (r.num_tokens, r.not_argmax, r.min_top2_gap, r.min_gap_position, r.ok) == (0, [], math.inf, -1, True)


def test_greedy_output_passes_with_the_smallest_gap_located():
    r = check_greedy(Bigram(), [3, 0], [1, 2, 0, 1])  # gaps 0.5, 2.5/16, 1, 0.5
    assert r.ok and r.not_argmax == [] and r.num_tokens == 4
    assert (r.min_top2_gap, r.min_gap_position) == (2.5 / 16, 1)
    assert (
        r.summary() == "PASS: 4 tokens, 0 not the target's greedy choice, 0 near-ties within tol; "
        f"smallest top-2 gap {2.5 / 16:.4f} at 1"
    )


@pytest.mark.parametrize("tol_ulps,ok", [(1.0, False), (2.0, False), (2.5, True), (3.0, True)])
def test_tolerance_in_ulps(tol_ulps, ok):
    r = check_greedy(Bigram(), [0], [1, 3, 4], tol_ulps=tol_ulps)  # position 1: 3 emitted, 2.5 ulps short
    assert r.ok is ok
    (m,) = r.not_argmax
    assert (m.position, m.emitted, m.argmax, m.deficit, m.ulp, m.tol) == (1, 3, 2, 2.5 / 16, 1 / 16, tol_ulps / 16)
    assert m.deficit / m.ulp == 2.5
    assert r.failures == ([] if ok else [m])
    near = 1 if ok else 0
    assert r.summary().startswith(
        f"{'PASS' if ok else 'FAIL'}: 3 tokens, {1 - near} not the target's greedy choice, {near} near-ties"
    )


def test_default_tolerance_is_one_ulp_and_an_explicit_tol_wins():
    assert not check_greedy(Bigram(), [4], [1]).ok  # 1.25 ulps short: over the default 1 ulp
    assert check_greedy(Bigram(), [4], [1], tol_ulps=1.25).ok
    assert check_greedy(Bigram(), [4], [1], tol=1.25 / 64).ok
    assert not check_greedy(Bigram(), [4], [1], tol=1.2 / 64, tol_ulps=100).ok
    assert check_greedy(Bigram(), [4], [1], tol=0.0, tol_ulps=0.0).not_argmax[0].tol == 0.0


def test_the_pass_runs_in_the_requested_precision_without_tf32_and_leaves_the_model():
    m = Bigram()
    Bigram.calls.clear()
    check_greedy(m, [0], [1])
    assert Bigram.calls[-1][0] is m and Bigram.calls[-1][1] == torch.float32
    check_greedy(m, [0], [1], dtype=torch.float64)
    who, dtype, tf32, use_cache = Bigram.calls[-1]
    assert who is not m and dtype == torch.float64 and tf32 is False and use_cache is False  # one pass: no KV cache
    assert m.table.dtype == torch.float32  # a copy was converted, not the caller's model
    m64 = Bigram().double()
    check_greedy(m64, [0], [1], dtype=torch.float64)
    assert Bigram.calls[-1][0] is m64
    saved = torch.backends.cuda.matmul.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = True
        check_greedy(m, [0], [1])
        assert Bigram.calls[-1][2] is False and torch.backends.cuda.matmul.allow_tf32 is True
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved


def test_a_reference_with_a_nan_logit_certifies_nothing():
    """topk ranks NaN first and every comparison with NaN is false: the token such a row would have passed fails."""
    table = [row[:] for row in TABLE]
    table[0][4] = math.nan  # after token 0 the reference's row holds a NaN
    r = check_greedy(Bigram(table), [0], [1])  # token 1 is row 0's argmax among the finite logits
    assert not r.ok and [m.position for m in r.failures] == [0]


def test_a_model_of_mixed_precision_is_converted_whole():
    class Mixed(Bigram):
        def __init__(self):
            super().__init__()
            self.low = nn.Parameter(torch.zeros(1, dtype=torch.bfloat16))  # a bf16 layer after an fp32 one

    m = Mixed()
    Bigram.calls.clear()
    check_greedy(m, [0], [1])
    assert Bigram.calls[-1][0] is not m and m.low.dtype == torch.bfloat16  # a converted copy ran the pass


class Positional(Bigram):
    """A one-token vocabulary whose logit grows with the position (so positions are told apart)."""

    def forward(self, input_ids, use_cache=True):
        steps = torch.arange(input_ids.shape[1], dtype=self.table.dtype)
        return type("Out", (), {"logits": (self.table[input_ids].squeeze(-1) * steps).unsqueeze(-1)})()


def test_a_one_token_vocabulary_has_zero_gap():
    r = check_greedy(Bigram([[1.0]]), [0, 0], [0, 0])
    assert r.ok and (r.min_top2_gap, r.min_gap_position) == (0.0, 0)
    r = check_greedy(Positional([[3.0]]), [0, 0], [0, 0, 0])
    assert r.ok and r.not_argmax == [] and (r.num_tokens, r.min_top2_gap, r.min_gap_position) == (3, 0.0, 0)


def test_report_properties():
    a = Mismatch(0, 1, 2, 0.5, 1.0, 0.25)
    b = Mismatch(1, 1, 2, 2.0, 1.0, 0.25)
    r = GreedyReport(2, [a, b], 0.1, 0)
    assert r.failures == [b] and not r.ok and b.deficit / b.ulp == 8.0


def records(tmp_path, name, rows):
    path = tmp_path / name
    path.write_text(json.dumps(rows))
    return str(path)


def rec(prompt, ids, out, temperature=0.0, error=None):
    sampling = {} if temperature is None else {"temperature": temperature}
    return {"prompt": prompt, "input_ids": ids, "output_ids": out, "sampling": sampling, "error": error}


def test_served_greedy_records_keep_temperature_zero_without_error(tmp_path):
    rows = [
        rec("a", [0], [1]),
        rec("b", [0], [1], temperature=1.0),
        rec("c", [0], [1], temperature=None),
        rec("d", [0], [1], error="boom"),
        rec("e", [0], [1], temperature=0.5),
    ]
    assert [r["prompt"] for r in served_greedy_records(records(tmp_path, "r.json", rows))] == ["a"]


@pytest.fixture
def cli(monkeypatch):
    import transformers

    loaded = []

    def from_pretrained(path, dtype=None):
        loaded.append(dtype)
        return Bigram().to(dtype)

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", staticmethod(from_pretrained))
    return loaded


def test_cli_counts_and_exit_codes(tmp_path, capsys, cli):
    long_prompt = "p" * 59 + "QR"
    good = records(
        tmp_path, "good.json", [rec("x", [0], [1, 2, 0]), rec("y", [3], [4, 0]), rec("z", [0], [9], temperature=1.0)]
    )
    near = records(tmp_path, "near.json", [rec(long_prompt, [0], [1, 3])])  # 2.5 ulps: over the default 2
    assert greedy_check.main(["model", good]) == 0
    out = capsys.readouterr().out
    assert (
        f"{good}: 2 greedy responses, 5 tokens, 0 with a token" in out and "beyond 2 bf16 ulp, 0 near-tie tokens" in out
    )
    assert out.strip().endswith("GREEDY_CHECK PASS") and cli == [torch.float32]
    assert greedy_check.main(["model", good, near]) == 1
    out = capsys.readouterr().out
    assert f"{near}: {'p' * 59 + 'Q'!r}: FAIL: 2 tokens, 1 not" in out
    assert (
        f"{near}: 1 greedy responses, 2 tokens, 1 with a token that is not the target's greedy choice beyond 2 bf16 "
        "ulp, 0 near-tie tokens within it"
    ) in out
    assert out.strip().endswith("GREEDY_CHECK FAIL")
    assert greedy_check.main(["model", near, "--tol-ulps", "3", "--dtype", "float64"]) == 0
    out = capsys.readouterr().out
    assert (
        "0 with a token" in out and "beyond 3 bf16 ulp, 1 near-tie tokens within it" in out and cli[-1] == torch.float64
    )
    assert greedy_check.main(["model", near, good, "--tol-ulps", "2.5"]) == 0
    capsys.readouterr()


def test_cli_fails_a_greedy_reply_without_token_ids(tmp_path, capsys, cli):
    """A reply with text but no token ids cannot be checked: it fails, it does not pass as 0 tokens."""
    path = records(tmp_path, "s.json", [rec("x", [0], [1, 2, 0]), rec("y", [0], None), rec("z", [0], [])])
    assert greedy_check.main(["model", path]) == 1
    out = capsys.readouterr().out
    assert "'y': FAIL: no output token ids to check" in out and "'z': FAIL" in out and "2 with a token" in out


def test_cli_baseline_byte_equality(tmp_path, capsys, cli):
    served = records(
        tmp_path, "s.json", [rec("x", [0], [1, 2, 0]), rec("y", [3], [4, 0]), rec("w", [2], [0]), rec("u", [4], [0])]
    )
    base = records(
        tmp_path,
        "b.json",
        [
            rec("x", [0], [1, 2, 0]),
            rec("y", [3], [4, 1]),
            rec("v", [2], [0]),
            rec("w", [2], [0], error="lost"),
            rec("u", [4], [0]),
        ],
    )
    assert greedy_check.main(["model", served, "--baseline", base]) == 0
    assert "; byte-equal with the baseline on 2/3" in capsys.readouterr().out
    assert greedy_check.main(["model", served]) == 0
    assert "byte-equal" not in capsys.readouterr().out


def test_cli_baseline_of_another_commit_pairs_replies_by_phase_and_names_where_they_part(tmp_path, capsys, cli):
    def phased(phase, prompt, out):
        return {**rec(prompt, [0], out), "phase": phase}

    served = records(
        tmp_path,
        "after.json",
        [phased("greedy", p, [1, 2, 0]) for p in "xyz"] + [phased("concurrent2", "y", [1, 2, 0])],
    )
    before = tmp_path / "before.json.gz"  # kept results are gzipped
    with gzip.open(before, "wt") as f:
        json.dump(
            [phased("greedy", "x", [1, 2, 0]), phased("greedy", "y", [1, 2, 0]), phased("greedy", "z", [1, 2])]
            + [phased("concurrent2", "y", [1, 0])],
            f,
        )
    assert greedy_check.main(["model", served, "--baseline", str(before)]) == 0
    out = capsys.readouterr().out
    assert "; byte-equal with the baseline on 2/4" in out  # greedy y paired with greedy y, not with concurrent2's
    assert "  'z': parts from the baseline at token 2 of 3" in out
    assert out.count("parts from the baseline") == 1  # a concurrent phase's batches differ by arrival: counted only


# --- what mutation testing found untested: the CLI's help, choices, device, and each file's verdict ------------------

HELP = """usage: python -m benchmarks greedy-check [-h] [--tol-ulps TOL_ULPS] [--baseline BASELINE]
                                         [--dtype {float32,float64}]
                                         model_dir results [results ...]

Check every greedy response a server returned (gpu_client JSON files) against the target.

positional arguments:
  model_dir             the target's HF folder
  results               gpu_client result files

options:
  -h, --help            show this help message and exit
  --tol-ulps TOL_ULPS   near-tie tolerance in bf16 ulps of the top logit
  --baseline BASELINE   another run's result file: also report the byte-equal fraction against it
  --dtype {float32,float64}
"""


def test_cli_help_and_the_dtype_choices(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "112")
    with pytest.raises(SystemExit) as e:
        greedy_check.main(["--help"])
    assert e.value.code == 0 and capsys.readouterr().out == HELP
    with pytest.raises(SystemExit) as e:
        greedy_check.main(["model", "r.json", "--dtype", "float16"])
    assert e.value.code == 2 and "argument --dtype: invalid choice: 'float16'" in capsys.readouterr().err


@pytest.mark.parametrize("cuda", [False, True])
def test_cli_loads_the_model_on_the_gpu_when_there_is_one(tmp_path, capsys, monkeypatch, cuda):
    import transformers

    seen = []

    class Placed(Bigram):
        def to(self, *args, **kwargs):
            if args and not isinstance(args[0], torch.dtype):  # a device: recorded, the model stays where it is
                seen.append(("to", args[0]))
                return self
            return super().to(*args, **kwargs)

    def from_pretrained(path, dtype=None):
        seen.append(("load", path, dtype))
        return Placed().to(dtype)

    def spy(*args, **kwargs):
        seen.append(("check", kwargs["dtype"]))
        return greedy(*args, **kwargs)

    greedy = greedy_check.check_greedy
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", staticmethod(from_pretrained))
    monkeypatch.setattr(greedy_check, "check_greedy", spy)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    good = records(tmp_path, "good.json", [rec("x", [0], [1, 2, 0])])
    assert greedy_check.main(["model-dir", good, "--dtype", "float32"]) == 0
    assert greedy_check.main(["model-dir", good, "--dtype", "float64"]) == 0
    device = "cuda" if cuda else "cpu"
    assert seen == [
        ("load", "model-dir", torch.float32),
        ("to", device),
        ("check", torch.float32),
        ("load", "model-dir", torch.float64),
        ("to", device),
        ("check", torch.float64),
    ]
    capsys.readouterr()


def test_cli_fails_when_any_file_fails_and_prints_whole_lines(tmp_path, capsys, cli):
    good = records(tmp_path, "good.json", [rec("x", [0], [1, 2, 0])])
    near = records(tmp_path, "near.json", [rec("n", [0], [1, 3])])
    assert greedy_check.main(["model", near, good]) == 1  # a later passing file does not clear an earlier failure
    assert capsys.readouterr().out.strip().endswith("GREEDY_CHECK FAIL")
    assert greedy_check.main(["model", good, "--baseline", good]) == 0
    assert capsys.readouterr().out.splitlines()[0] == (
        f"{good}: 1 greedy responses, 3 tokens, 0 with a token that is not the target's greedy choice beyond 2 bf16 "
        "ulp, 0 near-tie tokens within it; byte-equal with the baseline on 1/1"
    )


def test_check_greedy_on_the_models_device_a_two_token_vocabulary_and_its_refusal():
    """The ids go to the model's device (a meta model fails only where the logits are copied to the host); with two
    tokens the top-2 gap is the gap between them; an empty prompt is refused in full."""

    class OnMeta(Bigram):
        def forward(self, input_ids, use_cache=True):
            self.ids_device = input_ids.device.type
            return super().forward(input_ids, use_cache)

    model = OnMeta().to("meta")
    with pytest.raises(NotImplementedError, match="Cannot copy out of meta tensor"):
        check_greedy(model, [0], [1])
    assert model.ids_device == "meta"
    two = Bigram([[1.0, 3.5], [2.0, 1.25]])
    report = check_greedy(two, [0], [1, 0])
    assert (report.min_top2_gap, report.min_gap_position) == (0.75, 1) and report.ok
    with pytest.raises(ValueError) as refused:
        check_greedy(two, [], [1])
    assert str(refused.value) == "check_greedy: the prompt is empty; the first output token needs a context."
