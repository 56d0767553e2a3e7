"""The `lilicorr` subcommands (cli.py builds the parser from them; `bench` is bench/cli.py): demo.py (and its target,
smollm2.py), check_draft.py, train.py (regenerate | train | export; the work is train/'s) and replay.py. This layer
imports every layer below it; nothing below imports it."""
