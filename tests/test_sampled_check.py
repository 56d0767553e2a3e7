"""The exactness check at T > 0: sampled outputs against the target's softmax by the randomized probability integral
transform (benchmarks/served/sampled_check.py), and against a server (benchmarks/served/sampling_exactness.py): the
seeded, resumable collection of sampled outputs and the summary with each server's verification line and tau per
seed."""

from __future__ import annotations

import json

import pytest
import torch
from stub_server import StubServer
from test_reference import PROMPT, tiny_target

from benchmarks.served import sampling_exactness
from benchmarks.served import sampled_check

STEPS = 3


def ancestral(model, temperature: float, n: int) -> list[dict]:
    """n outputs of STEPS tokens drawn from the float32 model at `temperature`, recorded as sampled at T = 1."""
    g = torch.Generator().manual_seed(1)
    records = []
    with torch.no_grad():
        for seed in range(n):
            ids = list(PROMPT)
            for _ in range(STEPS):
                logits = model(input_ids=torch.tensor([ids])).logits[0, -1].double()
                ids.append(int(torch.multinomial(torch.softmax(logits / temperature, -1), 1, generator=g)))
            records.append({"input_ids": PROMPT, "output_ids": ids[len(PROMPT) :], "temperature": 1.0, "seed": seed})
    return records


def sharp_target():
    """The tiny target with logits spread over several nats (a random init's are nearly uniform)."""
    model = tiny_target()
    with torch.no_grad():
        model.lm_head.weight.mul_(40.0)
    return model


def test_exact_samples_pass_and_a_wrong_temperature_fails():
    model = sharp_target()
    exact = sampled_check.position_pvalues(model, ancestral(model, 1.0, 300), positions=[1, 2, 3])
    assert all(cell["n"] == 300 and cell["p"] > 0.01 for cell in exact.values()), exact
    cold = sampled_check.position_pvalues(model, ancestral(model, 0.5, 300), positions=[1, 2, 3])
    assert all(cell["p"] < 1e-3 for cell in cold.values()), cold


def test_chi_square_of_uniform_values():
    grid = [(k + 0.5) / 200 for k in range(200)]
    assert sampled_check.chi_square_uniform(grid) == {"n": 200, "chi2": 0.0, "dof": 19, "p": pytest.approx(1.0)}
    assert sampled_check.chi_square_uniform([0.01] * 200)["p"] < 1e-12
    with pytest.raises(ValueError, match="send at least 100 requests"):
        sampled_check.chi_square_uniform(grid[:50])


def test_records_and_prompts_name_the_bad_line(tmp_path):
    records = tmp_path / "r.jsonl"
    records.write_text(
        '{"system": "base", "input_ids": [1], "output_ids": [2], "temperature": 1, "seed": 0}\n{"system": "base"}\n'
    )
    with pytest.raises(ValueError, match="r.jsonl:2: not a sampled-output record"):
        sampled_check.read_records([records])
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "a", "messages": [{"role": "user", "content": "hi"}]}\n')
    with pytest.raises(ValueError, match="p.jsonl:1: .*pass --tokenizer"):
        sampling_exactness.read_prompts(prompts, None)


@pytest.mark.parametrize("as_dict", [True, False])
def test_prompts_from_messages_are_the_chat_templates_token_ids(tmp_path, monkeypatch, as_dict):
    import transformers

    class Tokenizer:  # transformers 5 returns a BatchEncoding from tokenize=True; older ones a list of ids
        def apply_chat_template(self, messages, add_generation_prompt, tokenize):
            ids = [1, 2, len(messages[0]["content"])]
            return transformers.BatchEncoding({"input_ids": ids, "attention_mask": [1] * 3}) if as_dict else ids

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", lambda folder: Tokenizer())
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "a", "messages": [{"role": "user", "content": "hi"}]}\n')
    assert sampling_exactness.read_prompts(prompts, "TARGET") == [{"prompt": "a", "input_ids": [1, 2, 2]}]


def test_collect_is_seeded_and_resumes(tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "a", "input_ids": [5, 6, 7]}\n{"prompt": "b", "input_ids": [8]}\n')
    out = tmp_path / "records.jsonl"
    with StubServer(speculative=True, step_s=0.0, min_latency_s=0.0) as stub:
        argv = [
            "collect",
            "--url",
            stub.url,
            "--system",
            "lilicorr",
            "--prompts",
            str(prompts),
            "--requests",
            "3",
            "--max-new-tokens",
            "4",
            "--out",
            str(out),
            "--concurrency",
            "4",
        ]
        assert sampling_exactness.main(argv) == 0
        assert sampling_exactness.main(argv) == 0  # resumed: nothing left to send
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted((r["prompt"], r["seed"]) for r in rows) == [(p, s) for p in "ab" for s in range(3)]
    assert all(len(r["output_ids"]) == 4 and r["system"] == "lilicorr" for r in rows)
    bodies = [r["body"] for r in stub.log]
    assert len(bodies) == 6 and {b["sampling_params"]["sampling_seed"] for b in bodies} == {0, 1, 2}
    assert all(b["sampling_params"]["ignore_eos"] and b["sampling_params"]["temperature"] == 1.0 for b in bodies)


def test_summary_names_each_servers_verification_and_tau_per_seed(tmp_path):
    from test_train import make_target
    from transformers import AutoModelForCausalLM

    target = make_target(tmp_path / "target")
    model = AutoModelForCausalLM.from_pretrained(target).float().eval()
    records = tmp_path / "lilicorr.jsonl"
    records.write_text("".join(json.dumps({"system": "lilicorr", **r}) + "\n" for r in ancestral(model, 1.0, 120)))
    log = tmp_path / "lilicorr.log"
    log.write_text(
        "server_args={'speculative_verification': None}\n[2026] DFLASH sampling pre-warm: bs=16\n"
        "[2026] LILICORR verification: T = 0 greedy; T > 0 exact rejection sampling (SGLang's kernel)\nready\n"
    )
    tau = tmp_path / "tau_t1.jsonl"
    turn = lambda n, b: {"completion_tokens": n, "spec_verify_ct": b, "start": 0.0, "end": 1.0}  # noqa: E731
    run = {
        "system": "lilicorr",
        "dataset": "eval",
        "concurrency": 32,
        "temperature": 1.0,
        "max_tokens": 256,
        "category": "all",
    }
    tau.write_text(
        "".join(
            json.dumps({**run, "seed": s, "prompt_id": f"p{k}", "turns": [turn(30, 10) if k else turn(10, 10)]}) + "\n"
            for s in (0, 1)
            for k in (0, 1)
        )
    )
    out = tmp_path / "summary.json"
    assert (
        sampling_exactness.main(
            [
                "check",
                target,
                str(records),
                "--positions",
                "1",
                "3",
                "--startup-log",
                f"lilicorr={log}",
                "--tau-records",
                str(tau),
                "--out",
                str(out),
            ]
        )
        == 0
    )
    summary = json.loads(out.read_text())["lilicorr"]
    assert set(summary["positions"]) == {"1", "3"} and summary["positions"]["1"]["n"] == 120
    assert summary["verification"].startswith("[2026] LILICORR verification: T = 0 greedy")
    assert summary["tau_t1"] == {"0": 2.0, "1": 2.0}
    with pytest.raises(SystemExit):
        sampling_exactness.main(["check", target, str(records), "--startup-log", "lilicorr", "--out", str(out)])


def test_startup_verification_names_the_verifier_not_the_server_args(tmp_path):
    logs = {
        "dflash": "server_args={'x_verification': 1}\n[t] DFLASH sampling pre-warm: bs=16\n",
        "fallback": "[t] DFLASH non-greedy verification is unavailable on this build/device; falling back to greedy\n",
        "base": "server_args={'speculative_verification': None}\nready\n",
    }
    found = {}
    for name, text in logs.items():
        (tmp_path / name).write_text(text)
        found[name] = sampling_exactness.startup_verification(tmp_path / name)
    assert found["dflash"] == "[t] DFLASH sampling pre-warm: bs=16" and found["fallback"].startswith(
        "[t] DFLASH non-greedy"
    )
    assert found["base"] == sampling_exactness.NO_SPECULATION


# --- exact values off T = 1 and at sample sizes off the boundary (mutation testing) -----------------------------------


def test_pit_values_by_hand_at_temperatures_off_1():
    import math

    from test_reference_check import TABLE, Bigram

    outputs = [[1, 3, 4], [2, 0, 1], [4, 4, 0]]
    for temperature in (0.6, 1.7):
        g = torch.Generator().manual_seed(7)
        u = sampled_check.pit_values(Bigram(), [3, 0], outputs, temperature, g)
        v = torch.rand(3, 3, 1, generator=torch.Generator().manual_seed(7), dtype=torch.float64).squeeze(-1).tolist()
        for b, out in enumerate(outputs):
            ctx = [0] + out[:-1]
            for j, x in enumerate(out):
                p = torch.softmax(torch.tensor(TABLE[ctx[j]], dtype=torch.float64) / temperature, -1).tolist()
                assert u[b][j] == pytest.approx(sum(p[:x]) + v[b][j] * p[x], abs=1e-12)
                assert 0.0 <= u[b][j] <= 1.0
        assert not math.isclose(
            u[0][1], sampled_check.pit_values(Bigram(), [3, 0], outputs, 1.0, torch.Generator().manual_seed(7))[0][1]
        )


def test_pit_values_refusals():
    from test_reference_check import Bigram

    g = torch.Generator()
    for prompt, outputs in (([], [[1]]), ([0], []), ([0], [[]]), ([0], [[1], [1, 2]])):
        with pytest.raises(ValueError, match="outputs of one length >= 1"):
            sampled_check.pit_values(Bigram(), prompt, outputs, 1.0, g)
    for temperature in (0.0, -0.5):
        with pytest.raises(ValueError, match="temperature must be > 0"):
            sampled_check.pit_values(Bigram(), [0], [[1]], temperature, g)


def test_chi_square_values_between_and_at_the_bounds():
    import math

    u = [0.1] * 8 + [0.3] * 4 + [0.6] * 4 + [1.0] * 4  # 20 values, 4 bins: counts 8, 4, 4, 4 (1.0 in the last bin)
    r = sampled_check.chi_square_uniform(u, bins=4)
    x = (9 + 1 + 1 + 1) / 5
    sf3 = math.erfc(math.sqrt(x / 2)) + math.sqrt(2 * x / math.pi) * math.exp(-x / 2)  # chi-square survival, 3 dof
    assert (r["n"], r["chi2"], r["dof"]) == (20, 2.4, 3) and r["p"] == pytest.approx(sf3, rel=1e-9)
    assert sampled_check.chi_square_uniform([0.5] * 100)["dof"] == 19  # exactly 5 per bin: enough
    with pytest.raises(ValueError, match="99 values for 20 bins; send at least 100"):
        sampled_check.chi_square_uniform([0.5] * 99)
    assert sampled_check.chi_square_uniform([0.05] * 15, bins=3)["chi2"] == 30.0
    assert (
        sampled_check.chi_square_uniform([0.1] * 8 + [0.5] * 5 + [0.9] * 4, bins=3)["chi2"] == 1.529
    )  # 26/17, 3 decimals


def test_position_pvalues_group_batch_and_skip_short_outputs(monkeypatch):
    """Positions count from 1; a position past an output's length is skipped; prompts, lengths and temperatures are
    separate groups; more than BATCH outputs go in several passes."""
    from test_reference_check import Bigram

    monkeypatch.setattr(sampled_check, "BATCH", 4)
    seen = []
    real = sampled_check.pit_values

    def spy(model, prompt, outputs, temperature, generator):
        seen.append((tuple(prompt), len(outputs), len(outputs[0]), temperature))
        return real(model, prompt, outputs, temperature, generator)

    monkeypatch.setattr(sampled_check, "pit_values", spy)
    recs = (
        [{"input_ids": [0], "output_ids": [1, 2, 0], "temperature": 0.5}] * 6
        + [{"input_ids": [0], "output_ids": [1], "temperature": 0.5}] * 3
        + [{"input_ids": [2], "output_ids": [0, 1, 2], "temperature": 0.5}] * 2
        + [{"input_ids": [0], "output_ids": [1, 2, 0], "temperature": 2}] * 1
    )
    monkeypatch.setattr(sampled_check, "chi_square_uniform", lambda u: {"n": len(u), "u": u})
    out = sampled_check.position_pvalues(Bigram(), recs, positions=[1, 3])
    assert sorted(seen) == sorted(
        [((0,), 4, 3, 0.5), ((0,), 2, 3, 0.5), ((0,), 3, 1, 0.5), ((2,), 2, 3, 0.5), ((0,), 1, 3, 2.0)]
    )
    assert out["1"]["n"] == 12 and out["3"]["n"] == 9
    g = torch.Generator().manual_seed(0)
    first = real(Bigram(), [0], [[1, 2, 0]] * 4, 0.5, g)
    assert out["3"]["u"][:4] == [row[2] for row in first] and out["1"]["u"][:4] == [row[0] for row in first]


def test_pit_pass_runs_without_tf32_and_restores_it():
    from test_reference_check import Bigram

    saved = torch.backends.cuda.matmul.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = True
        sampled_check.pit_values(Bigram(), [0], [[1]], 1.0, torch.Generator())
        assert Bigram.calls[-1][2] is False and torch.backends.cuda.matmul.allow_tf32 is True
        assert Bigram.calls[-1][3] is False  # one pass over whole outputs: no KV cache
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved


# --- what mutation testing found untested: the device, the clamp at 1, binning in float64, seeds, blank lines -------


def test_pit_values_stay_on_the_models_device():
    """On a model on the meta device every tensor pit_values makes is meta: the values fail only where they are
    copied to the host at the end."""
    from test_reference_check import TABLE, Bigram

    class OnMeta(Bigram):
        def forward(self, input_ids, use_cache=True):
            self.ids_device = input_ids.device.type
            return super().forward(input_ids, use_cache)

    model = OnMeta().to("meta")
    model.table = torch.nn.Parameter(torch.tensor(TABLE).to("meta"))
    with pytest.raises(NotImplementedError, match="Cannot copy out of meta tensor"):
        sampled_check.pit_values(model, [0], [[1, 2]], 0.7, torch.Generator().manual_seed(0))
    assert model.ids_device == "meta"


def test_u_is_clamped_to_1_where_rounding_passes_it(monkeypatch):
    """F(x - 1) + V p(x) <= 1 exactly, but the rounded cumulative sum of a softmax can end an ulp above 1: with V at
    its largest (1 - 2^-53) the last token's u would be above 1."""
    from test_reference_check import Bigram

    table = [[0.0] * 7 for _ in range(7)]
    table[0] = (torch.randn(7, generator=torch.Generator().manual_seed(10)) * 3).tolist()
    p = torch.softmax(torch.tensor(table[0], dtype=torch.float64) / 0.7, -1)
    assert torch.cumsum(p, -1)[-1].item() > 1.0  # the case this needs
    top = 1.0 - 2.0**-53
    monkeypatch.setattr(torch, "rand", lambda *shape, generator, dtype: torch.full(shape, top, dtype=dtype))
    model = Bigram(table).double()
    (u,) = sampled_check.pit_values(model, [0], [[6]], 0.7, torch.Generator())
    assert u == [1.0]


def test_chi_square_bins_in_float64_and_keeps_values_outside_0_1():
    """0.1499999999 is in bin 2 of 20 (it would be in bin 3 as a float32); values below 0 or from 1 on count in the
    end bins."""
    u = [0.1499999999] * 5 + [0.16] * 10 + [-0.2] * 5 + [1.3] * 5 + [0.5] * 75
    r = sampled_check.chi_square_uniform(u)
    counts = [5, 0, 5, 10] + [0] * 6 + [75] + [0] * 8 + [5]
    assert r["chi2"] == round(sum((c - 5) ** 2 / 5 for c in counts), 3)


def test_position_pvalues_draw_from_their_own_seed():
    """The V draws come from the seed argument's generator, not torch's global one."""
    from test_reference_check import Bigram

    recs = [{"input_ids": [0], "output_ids": [1, 2], "temperature": 0.8}] * 100
    torch.manual_seed(1)
    a = sampled_check.position_pvalues(Bigram(), recs, positions=[1, 2], seed=3)
    torch.manual_seed(2)
    assert sampled_check.position_pvalues(Bigram(), recs, positions=[1, 2], seed=3) == a
    assert sampled_check.position_pvalues(Bigram(), recs, positions=[1, 2], seed=4) != a


def test_records_pass_over_blank_lines_and_the_refusals_in_full(tmp_path):
    from test_reference_check import Bigram

    row = '{"system": "base", "input_ids": [1], "output_ids": [2], "temperature": 1, "seed": 0}\n'
    path = tmp_path / "r.jsonl"
    path.write_text(row + "\n  \n" + row.replace("base", "lilicorr"))
    assert {k: len(v) for k, v in sampled_check.read_records([path]).items()} == {"base": 1, "lilicorr": 1}
    path.write_text('{"system": "base"}\n')
    with pytest.raises(ValueError) as refused:
        sampled_check.read_records([path])
    assert str(refused.value) == (
        f"{path}:1: not a sampled-output record ('input_ids'); expected system, input_ids, "
        "output_ids, temperature and seed (benchmarks/served/sampling_exactness.py writes them)."
    )
    with pytest.raises(ValueError) as refused:
        sampled_check.pit_values(Bigram(), [0], [], 1.0, torch.Generator())
    assert str(refused.value) == "pit_values: a prompt and outputs of one length >= 1 are needed (ignore_eos requests)."
