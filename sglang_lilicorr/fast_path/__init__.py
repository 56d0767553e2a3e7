"""The proposal pipeline and the head's serving path: `pipeline.propose` composes logits -> top-K/logsumexp -> head ->
walk -> draft ids for every caller, as a plan (plan.py, from kernels/tuning.py's measured tables) says;
`FastLiLiCorrSelect` (select.py) runs it on the head's fused routes with the constants it folds from the head
(constants.py); side_stream.py and counters.py are its CUDA plumbing; precompile.py builds its kernels before
capture."""
