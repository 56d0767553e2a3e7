"""The SGLang plugin `--speculative-algorithm LILICORR`; README.md lists its modules and SGLang hooks."""

ALGORITHM_NAME = "LILICORR"  # the name SGLang's --speculative-algorithm takes
