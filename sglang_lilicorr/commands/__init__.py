"""The `lilicorr` subcommands (cli.py builds the parser from them; `bench` is bench/cli.py)."""
