"""The SGLang plugin: `--speculative-algorithm LILICORR` (the only code importing sglang's runtime).

Modules (each imported only where SGLang needs it, so the plugin stays cheap in the processes that
never draft):
  plugin.py      entry point `sglang.srt.plugins` -> register(): the algorithm, idempotently
  algorithm.py   LiLiCorrSpecAlgo, the CustomSpecAlgo that routes LILICORR down SGLang's DFlash paths
  server_args.py validation + resolution of the server arguments, before any process starts
  draft_check.py the draft against the target, every problem collected (also `lilicorr check-draft`)
  verification.py which verification serves T = 0 / T > 0 (start-up line), LILICORR_T_GT_0's refusals
  models/        LiLiCorrDraftModel: SGLang's DFlashDraftModel + our head, strictly loaded
  proposer.py    the draft block: LM-head logits -> top-K/LSE -> head -> walk (CUDA-graph safe); LILICORR_WALK
  vocab_parallel.py  under --tp-size N: this rank's LM head shard -> top-K/LSE partials -> one all-gather -> merge
  worker.py      LiLiCorrWorker: SGLang's DFlash v2 worker with our proposer in the draft graph
The GPU proof tools (gpu_check.sh and the steps it runs) live in the lab, benchmarks/ at the top of the repository.
See README.md for every SGLang extension point used.
"""

ALGORITHM_NAME = "LILICORR"  # the name SGLang's --speculative-algorithm takes
