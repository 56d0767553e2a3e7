"""The proposal pipeline and the head's serving path: `pipeline.propose` composes logits -> top-K/logsumexp -> head ->
walk -> draft ids for every caller as a plan (plan.py) says; `FastLiLiCorrSelect` (select.py) runs it on the head's
fused routes with constants folded from the head (constants.py)."""
