"""The head's serving path: `FastLiLiCorrSelect` (select.py) runs the trained `LiLiCorrHead` (sglang_lilicorr/head.py)
after the drafter pass, from the top-K/logsumexp of the LM head's logits to the greedy walk's draft, on the Triton
kernels of sglang_lilicorr/kernels/ or on the PyTorch path, as its plan (plan.py, from kernels/tuning.py's measured
tables) says; constants.py holds what it precomputes from the head, reference.py the plain PyTorch select it is tested
against, side_stream.py and counters.py its CUDA plumbing."""
