"""The LiLiCorr testbed on SmolLM2-135M-Instruct: data -> sweep -> train -> export -> eval -> speed -> tables.

`python -m benchmarks testbed STEP ...` (run.py: the steps and their options); one module per step, beside the helpers they share
(common.py), the sizes and variants (variants.py), the evaluation sets (eval_sets.py), the long-input lineage
(long_inputs.py) and the tables (report.py). Not installed with the package: run it from the checkout's root.
"""
