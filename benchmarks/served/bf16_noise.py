"""`python -m benchmarks bf16-noise ROUNDS... --target DIR --out DIR`: is a served system's worst greedy deviation its
verify's rounding, or the target's own bf16 noise?

Every distinct reply with token ids in the served-speed rounds (ROUNDS: folders of round*.jsonl[.gz]) is read by one
float32 teacher-forced pass of the target (sglang_lilicorr.reference.check): each served token's deficit (top logit -
its logit) in bf16 ulps of the top logit. Beside the servers, plain bf16 decoding by other kernels: bf16 teacher-forced
passes of the same target on this machine over the same contexts, each choosing its own argmax, with attention by
torch's SDPA, by eager matmuls (bf16 scores), and split over KV chunks whose fp32 partial softmaxes are merged as a
split-KV kernel merges them, each in one pass over the reply as a verify reads it, and SDPA also one token a step
with a KV cache as decoding reads it (VARIANTS).

Per source: replies, tokens, tokens beyond 1 and 2 ulps with exact Poisson 95 % intervals per 10k tokens, the worst;
per served system, `p_worst`: a permutation test of its worst deviation against no speculation's replies; plotted
(PLOT). Rows are kept as they come (ROWS in --out): a stopped run, or one asking for a new variant, measures only what
is missing.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import random
import time
from pathlib import Path

import torch

from benchmarks import save_json
from benchmarks.served.greedy_ulps import replies, reply_key

ROWS = "bf16_noise_rows.jsonl"
PLOT = "bf16_noise.png"
BASE = "base"
THRESHOLDS = (1.0, 2.0)  # ulps: a deviation beyond 2 is what the served check calls beyond a near-tie
# name: (transformers attention implementation, KV chunk of the split-KV merge, one token a step with a KV cache as
# decoding runs: else one pass over the reply as a verify runs)
VARIANTS = {
    "bf16 sdpa": ("sdpa", None, False),
    "bf16 sdpa, a token a step": ("sdpa", None, True),
    "bf16 eager": ("eager", None, False),
    "bf16 split-KV 64": ("lilicorr_split_kv", 64, False),
    "bf16 split-KV 512": ("lilicorr_split_kv", 512, False),
}


def split_kv_attention(query, key, value, mask, scaling: float, chunk: int) -> torch.Tensor:
    """Attention [b, q, h, d] in the query's dtype over KV chunks of `chunk`: per chunk fp32 scores of the bf16
    inputs, its max, sum and probabilities cast to the value's dtype times V accumulated in fp32 (a tensor-core
    kernel's split), the chunks merged in fp32. `mask`: additive [b, 1, q, k] (0 where attended) or None; key and
    value [b, h, k, d] (heads already repeated)."""
    q = query.float()
    m_all = l_all = o_all = None
    for start in range(0, key.shape[2], chunk):
        s = torch.matmul(q, key[:, :, start : start + chunk].float().transpose(2, 3)) * scaling
        if mask is not None:
            s = s.masked_fill(mask[..., start : start + chunk] != 0, -math.inf)
        m = s.amax(-1, keepdim=True)
        m = torch.where(torch.isinf(m), torch.zeros_like(m), m)  # a chunk this query may not read: weight 0
        p = torch.exp(s - m)
        l = p.sum(-1, keepdim=True)
        o = torch.matmul(p.to(value.dtype).float(), value[:, :, start : start + chunk].float())
        if m_all is None:
            m_all, l_all, o_all = m, l, o
            continue
        top = torch.maximum(m_all, m)
        a, b = torch.exp(m_all - top), torch.exp(m - top)
        m_all, l_all, o_all = top, l_all * a + l * b, o_all * a + o * b
    return (o_all / l_all).to(query.dtype).transpose(1, 2).contiguous()


def _register_split_kv() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, eager_mask
    from transformers.models.llama.modeling_llama import repeat_kv

    def attend(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
        groups = module.num_key_value_groups
        chunk = module.config.lilicorr_kv_chunk
        key, value = repeat_kv(key, groups), repeat_kv(value, groups)
        return split_kv_attention(query, key, value, attention_mask, scaling, chunk), None

    AttentionInterface.register("lilicorr_split_kv", attend)
    AttentionMaskInterface.register("lilicorr_split_kv", eager_mask)


def load_variants(target: str, names) -> dict:
    """{name: the target in bf16 with that variant's attention} on the CPU."""
    from transformers import AutoModelForCausalLM

    _register_split_kv()
    models = {}
    for name in names:
        impl, chunk, _ = VARIANTS[name]
        model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.bfloat16, attn_implementation=impl)
        model.config.lilicorr_kv_chunk = chunk
        models[name] = model.eval()
    return models


@torch.no_grad()
def decoded_logits(model, prompt_ids: list[int], output_ids: list[int]) -> torch.Tensor:
    """[len(output_ids), V] float64: `model`'s logits from a KV-cached run that reads the prompt, then one output
    token a step."""
    out = model(input_ids=torch.tensor([list(prompt_ids)]), use_cache=True)
    rows = [out.logits[0, -1]]
    for token in output_ids[:-1]:
        out = model(input_ids=torch.tensor([[token]]), past_key_values=out.past_key_values, use_cache=True)
        rows.append(out.logits[0, -1])
    return torch.stack(rows).double()


def deviations(fp32_logits: torch.Tensor, chosen: list[int]) -> list[float]:
    """Each chosen token's deficit under `fp32_logits` [n, V] in bf16 ulps of the top logit (0: the argmax)."""
    from sglang_lilicorr.reference.check import bf16_ulp

    top = fp32_logits.max(-1).values
    deficit = top - fp32_logits[torch.arange(len(chosen)), torch.tensor(chosen)]
    ulps = torch.tensor([bf16_ulp(v) for v in top.tolist()], dtype=torch.float64)
    return (deficit / ulps).tolist()


def describe(ulps: list[float]) -> dict:
    """tokens, tokens beyond each threshold, the worst deviation."""
    out = {"tokens": len(ulps), "worst": round(max(ulps, default=0.0), 3)}
    out.update({f"over_{t:g}": sum(u > t for u in ulps) for t in THRESHOLDS})
    return out


def distinct_replies(folders) -> dict:
    """{key: {"input_ids", "output_ids", "systems", "prompt_id"}} over every round*.jsonl (or .jsonl.gz, as kept in
    results) of `folders`."""
    found: dict = {}
    for folder in folders:
        for path in sorted(Path(folder).glob("round*.jsonl*")):
            text = gzip.decompress(path.read_bytes()).decode() if path.suffix == ".gz" else path.read_text()
            records = [json.loads(line) for line in text.splitlines() if line.strip()]
            for rec, turn in replies(records):
                row = found.setdefault(
                    reply_key(turn),
                    {"input_ids": turn["input_ids"], "output_ids": turn["output_ids"], "systems": set()},
                )
                row["systems"].add(rec["system"])
                row["prompt_id"] = rec.get("prompt_id")
    return found


def read_rows(path: Path) -> dict:
    """{key: row} of a ROWS file, each row merged from the lines that hold its parts."""
    rows: dict = {}
    for line in path.read_text().splitlines() if path.exists() else []:
        part = json.loads(line)
        rows.setdefault(part["key"], {}).update(part)
    return rows


def measure(found: dict, target: str, names, rows_path: Path, deadline: float) -> None:
    """Appends, per reply of `found`, what `rows_path` lacks of it (the served tokens' deviations, each variant's)
    until `deadline` (time.time())."""
    from transformers import AutoModelForCausalLM

    from sglang_lilicorr.reference.check import teacher_forced_logits

    done = read_rows(rows_path)
    todo = {k: [n for n in ("served", *names) if n not in done.get(k, {})] for k in found}
    todo = {k: missing for k, missing in todo.items() if missing}
    if not todo:
        return
    fp32 = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
    models = load_variants(target, {n for missing in todo.values() for n in missing if n != "served"})
    with open(rows_path, "a") as out:
        for i, (key, missing) in enumerate(todo.items()):
            if time.time() > deadline:
                print(f"bf16-noise: stopped at the deadline, {len(todo) - i} replies left (run again to resume)")
                return
            r = found[key]
            logits = teacher_forced_logits(fp32, r["input_ids"], r["output_ids"])
            row = {"key": key, "prompt_id": r["prompt_id"], "systems": sorted(r["systems"])}
            for name in missing:
                if name == "served":
                    row[name] = describe(deviations(logits, r["output_ids"]))
                    continue
                read = decoded_logits if VARIANTS[name][2] else teacher_forced_logits
                row[name] = describe(
                    deviations(logits, read(models[name], r["input_ids"], r["output_ids"]).argmax(-1).tolist())
                )
            out.write(json.dumps(row) + "\n")
            out.flush()
            print(f"bf16-noise: {i + 1}/{len(todo)} {r['prompt_id']} {row['systems']} {', '.join(missing)}")


def poisson_interval(k: int, level: float = 0.95) -> tuple[float, float]:
    """The exact (Garwood) interval of a Poisson mean from `k` events."""

    def cdf(x: int, mean: float) -> float:
        term = total = math.exp(-mean)
        for i in range(1, x + 1):
            term *= mean / i
            total += term
        return total

    def solve(f, lo: float, hi: float) -> float:  # f decreasing in the mean
        for _ in range(200):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if f(mid) > 0 else (lo, mid)
        return (lo + hi) / 2

    alpha = (1 - level) / 2
    upper = solve(lambda m: cdf(k, m) - alpha, 0.0, 10.0 * k + 20.0)
    lower = 0.0 if k == 0 else solve(lambda m: cdf(k - 1, m) - (1 - alpha), 0.0, 10.0 * k + 20.0)
    return lower, upper


def p_worst(base_rows: list[dict], rows: list[dict], worst: float, draws: int = 4000, seed: int = 0) -> float | None:
    """A permutation test of a system's worst deviation: with its replies (`rows`) and no speculation's pooled and
    split again at random into groups of their sizes, how often its group holds a deviation >= `worst` (~ its share
    of the pool where the two round alike; small where its worst stands out)."""
    if not base_rows or not rows:
        return None
    rng, pool = random.Random(seed), base_rows + rows
    hits = sum(max(r["served"]["worst"] for r in rng.sample(pool, len(rows))) >= worst for _ in range(draws))
    return round(hits / draws, 4)


def source_summary(described: list[dict]) -> dict:
    tokens = sum(d["tokens"] for d in described)
    out = {"replies": len(described), "tokens": tokens, "worst": max((d["worst"] for d in described), default=None)}
    for t in THRESHOLDS:
        k = sum(d[f"over_{t:g}"] for d in described)
        lo, hi = poisson_interval(k)
        per = 1e4 / tokens if tokens else 0.0
        out[f"over_{t:g}"] = k
        out[f"per_10k_over_{t:g}"] = [round(k * per, 2), round(lo * per, 2), round(hi * per, 2)]
    return out


def summarize(rows: list[dict], names) -> dict:
    """{"served": {system: summary with p_worst}, "variants": {name: summary over every context}}."""
    systems = sorted({s for r in rows for s in r["systems"]})
    base_rows = [r for r in rows if BASE in r["systems"]]
    served = {}
    for system in systems:
        mine = [r for r in rows if system in r["systems"]]
        served[system] = source_summary([r["served"] for r in mine])
        if system != BASE:
            served[system]["p_worst"] = p_worst(base_rows, mine, served[system]["worst"] or 0.0)
    variants = {name: source_summary([r[name] for r in rows if name in r]) for name in names}
    return {"served": served, "variants": variants}


def table(summary: dict) -> str:
    head = (
        "| source | replies | tokens | > 1 ulp per 10k [95 %] | > 2 ulps per 10k [95 %] | worst (ulps) | "
        "p (permutation, vs no spec.) |\n|---|---|---|---|---|---|---|\n"
    )

    def cell(s, t):
        mean, lo, hi = s[f"per_10k_over_{t:g}"]
        return f"{mean:.1f} [{lo:.1f}, {hi:.1f}] ({s[f'over_{t:g}']})"

    def line(name, s, p):
        cells = " | ".join(cell(s, t) for t in THRESHOLDS)
        return f"| {name} | {s['replies']} | {s['tokens']} | {cells} | {s['worst']} | {p} |\n"

    body = "".join(line(n, s, "-" if s.get("p_worst") is None else s["p_worst"]) for n, s in summary["served"].items())
    body += "".join(line(f"CPU {n} (same contexts)", s, "-") for n, s in summary["variants"].items())
    return head + body


def plot(summary: dict, path: Path) -> Path:
    """Per threshold, every source's tokens beyond it per 10k with its interval: the served systems, then the CPU's
    bf16 passes over the same contexts."""
    from sglang_lilicorr.bench.plots import pyplot, save

    plt = pyplot()
    sources = [(n, s, "C0") for n, s in summary["served"].items()]
    sources += [(f"CPU {n}", s, "C1") for n, s in summary["variants"].items()]
    fig, axes = plt.subplots(1, len(THRESHOLDS), figsize=(5.5 * len(THRESHOLDS), 0.4 * len(sources) + 1.5))
    for ax, t in zip(axes, THRESHOLDS):
        for y, (name, s, color) in enumerate(sources):
            mean, lo, hi = s[f"per_10k_over_{t:g}"]
            ax.errorbar([mean], [y], xerr=[[mean - lo], [hi - mean]], fmt="o", capsize=3, color=color)
        ax.set(yticks=range(len(sources)), xlabel=f"tokens beyond {t:g} bf16 ulp per 10k (95 %)", xlim=(0, None))
        ax.set_yticklabels([n for n, _, _ in sources], fontsize=8)
        ax.invert_yaxis()
    axes[0].set_title("served (blue) and CPU bf16 passes (orange)", fontsize=9)
    return save(fig, path)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks bf16-noise", description=__doc__.split("\n\n")[0])
    p.add_argument("rounds", nargs="+", help="folders of served-speed round*.jsonl (token ids recorded)")
    p.add_argument("--target", required=True, help="the target's HF folder")
    p.add_argument("--out", required=True, help="folder for bf16_noise.json, .md, .png and the rows")
    p.add_argument("--variants", nargs="*", default=list(VARIANTS), choices=list(VARIANTS))
    p.add_argument("--minutes", type=float, default=60.0, help="stop measuring after this long (rerun resumes)")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    a = p.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    found = distinct_replies(a.rounds)
    if not found:
        print(f"bf16-noise: no reply with token ids in round*.jsonl under {', '.join(a.rounds)}")
        return 2
    rows_path = out / ROWS
    measure(found, a.target, a.variants, rows_path, time.time() + 60 * a.minutes)
    rows = [r for k, r in read_rows(rows_path).items() if k in found and "served" in r]
    summary = {"replies": len(found), "measured": len(rows), **summarize(rows, a.variants)}
    save_json(out / "bf16_noise.json", summary)
    (out / "bf16_noise.md").write_text(table(summary))
    plot(summary, out / PLOT)
    print(table(summary))
    return 0 if len(rows) == len(found) else 3
