"""The SGLang plugin: `--speculative-algorithm LILICORR` (the only code importing sglang's runtime); each module is
imported only where SGLang needs it. README.md lists the modules and the SGLang extension points used."""

ALGORITHM_NAME = "LILICORR"  # the name SGLang's --speculative-algorithm takes
