"""The SGLang plugin: `--speculative-algorithm LILICORR` (the only code importing sglang's runtime). plugin.py
registers it; algorithm.py routes it down SGLang's DFlash paths; server_args.py, draft_check.py and verification.py
check before start; models/ is the draft model; worker.py runs proposer.py in the draft graph (vocab_parallel.py under
--tp-size N). Each module is imported only where SGLang needs it. README.md lists the SGLang extension points used."""

ALGORITHM_NAME = "LILICORR"  # the name SGLang's --speculative-algorithm takes
