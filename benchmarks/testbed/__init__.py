"""The LiLiCorr testbed on SmolLM2-135M-Instruct: data -> sweep -> train -> export -> eval -> speed -> tables.

`python -m benchmarks testbed STEP ...` (run.py assembles the steps; each module declares its own, as common.Step),
beside the helpers they share (common.py), the sizes and variants (variants.py), the evaluation sets (eval_sets.py), the
long-input lineage (long_inputs.py) and the tables (report.py). Run from the checkout's root; not installed.
"""
