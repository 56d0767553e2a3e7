"""The lab's bf16-noise study (benchmarks/served/bf16_noise.py): the split-KV attention it emulates, its Poisson
intervals and permutation test, and a whole run over served rounds with a tiny Llama target."""

from __future__ import annotations

import gzip
import json
import math

import pytest
import torch

from benchmarks.served import bf16_noise
from benchmarks.served.bf16_noise import p_worst, poisson_interval, split_kv_attention
from sglang_lilicorr.reference.check import teacher_forced_logits
from test_reference import tiny_target


def reference_attention(q, k, v, mask, scaling):
    s = torch.matmul(q.double(), k.double().transpose(2, 3)) * scaling
    s = s.masked_fill(mask != 0, -math.inf)
    return torch.matmul(torch.softmax(s, -1), v.double()).transpose(1, 2)


@pytest.mark.parametrize("chunk", [1, 5, 16, 64])
def test_split_kv_attention_is_attention_in_any_chunking(chunk, gen):
    b, h, n, d = 2, 3, 23, 8
    q, k, v = (torch.randn(b, h, n, d, generator=gen, dtype=torch.float32) for _ in range(3))
    causal = torch.triu(torch.ones(n, n, dtype=torch.bool), 1)  # query i reads keys 0..i: early chunks, late queries
    mask = torch.zeros(b, 1, n, n).masked_fill(causal, torch.finfo(torch.float32).min)
    out = split_kv_attention(q, k, v, mask, 0.3, chunk)
    assert out.shape == (b, n, h, d) and out.dtype == q.dtype
    torch.testing.assert_close(out.double(), reference_attention(q, k, v, mask, 0.3), atol=1e-5, rtol=1e-5)
    bf = split_kv_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), mask, 0.3, chunk)
    assert bf.dtype == torch.bfloat16  # the probabilities meet V in bf16: close, not equal
    torch.testing.assert_close(bf.double(), reference_attention(q, k, v, mask, 0.3), atol=5e-2, rtol=5e-2)


def test_poisson_intervals_are_garwoods():
    assert poisson_interval(0) == pytest.approx((0.0, 3.689), abs=1e-3)
    assert poisson_interval(1) == pytest.approx((0.0253, 5.572), abs=1e-3)
    assert poisson_interval(10) == pytest.approx((4.795, 18.39), abs=1e-2)


def test_p_worst_is_how_often_a_random_split_puts_the_worst_in_the_systems_group():
    quiet = [{"served": {"worst": 0.5}}] * 3
    loud = [{"served": {"worst": 4.0}}]
    assert p_worst(quiet, quiet, 0.5) == 1.0 and p_worst(quiet, quiet, 3.0) == 0.0
    assert p_worst(quiet, loud + quiet[:2], 4.0) == pytest.approx(0.5, abs=0.03)  # one loud reply: a coin flip
    assert p_worst(quiet * 10, loud, 4.0) == pytest.approx(1 / 31, abs=0.01)  # its only reply is the loud one
    assert p_worst([], quiet, 1.0) is None


def greedy(model, prompt, n):
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            ids.append(int(model(input_ids=torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt) :]


def test_a_run_reads_each_distinct_reply_once_and_resumes(tmp_path, capsys):
    model = tiny_target()
    model.save_pretrained(tmp_path / "target")
    prompts = [[1, 2, 3, 4], [5, 6, 7], [9, 8, 7, 6, 5]]
    outs = [greedy(model, p, 12) for p in prompts]
    with torch.no_grad():  # a second-choice token at the last reply's 4th position: a deviation the check must see
        logits = model(input_ids=torch.tensor([prompts[2] + outs[2]])).logits[0, len(prompts[2]) + 2]
    worse = outs[2][:3] + [int(logits.topk(2).indices[1])] + outs[2][4:]

    def record(system, prompt, out):
        turn = {"input_ids": prompt, "output_ids": out, "completion_tokens": len(out)}
        return {"system": system, "prompt_id": str(prompt[0]), "concurrency": 1, "turns": [turn]}

    rounds = tmp_path / "rounds"
    rounds.mkdir()
    lines = [record("base", p, o) for p, o in zip(prompts, outs)]
    lines += [record("lilicorr", p, o) for p, o in zip(prompts[:2], outs[:2])] + [record("lilicorr", prompts[2], worse)]
    (rounds / "round1.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    again = "".join(json.dumps(x) + "\n" for x in lines[:2]).encode()  # the same replies again, kept gzipped
    (rounds / "round2.jsonl.gz").write_bytes(gzip.compress(again))
    out = tmp_path / "out"
    argv = [str(rounds), "--target", str(tmp_path / "target"), "--out", str(out), "--variants", "bf16 split-KV 64"]
    assert bf16_noise.main(argv) == 0
    rows = [json.loads(x) for x in (out / bf16_noise.ROWS).read_text().splitlines()]
    assert len(rows) == 4  # three shared by both systems once each, and the deviating reply
    summary = json.loads((out / "bf16_noise.json").read_text())
    base, lili = summary["served"]["base"], summary["served"]["lilicorr"]
    assert (base["replies"], base["tokens"], base["worst"], base["over_2"]) == (3, 36, 0.0, 0)
    assert "p_worst" not in base and lili["replies"] == 3 and lili["worst"] > 0
    assert lili["p_worst"] == pytest.approx(0.5, abs=0.03)  # three replies of six, the one deviating among them
    assert summary["variants"]["bf16 split-KV 64"]["tokens"] == 48
    assert "| lilicorr | 3 | 36 |" in (out / "bf16_noise.md").read_text()
    assert (out / bf16_noise.PLOT).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    capsys.readouterr()
    assert bf16_noise.main(argv) == 0 and "bf16-noise:" not in capsys.readouterr().out  # nothing measured again
    assert len((out / bf16_noise.ROWS).read_text().splitlines()) == 4
    assert bf16_noise.main(argv + ["bf16 sdpa, a token a step"]) == 0  # a new variant: only it is measured
    lines = (out / bf16_noise.ROWS).read_text().splitlines()
    assert len(lines) == 8 and all(
        set(json.loads(x)) == {"key", "prompt_id", "systems", "bf16 sdpa, a token a step"} for x in lines[4:]
    )
    summary = json.loads((out / "bf16_noise.json").read_text())
    assert (
        summary["variants"]["bf16 sdpa, a token a step"]["tokens"] == 48 and summary["served"]["base"]["replies"] == 3
    )


def test_a_token_a_step_reads_what_one_pass_reads():
    model = tiny_target()
    prompt, out = [1, 2, 3, 4], [5, 6, 7, 8, 9, 10]
    torch.testing.assert_close(
        bf16_noise.decoded_logits(model, prompt, out), teacher_forced_logits(model, prompt, out), atol=1e-5, rtol=1e-5
    )
