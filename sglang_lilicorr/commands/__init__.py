"""The `lilicorr` subcommands (cli.py builds the parser from them; `bench` is bench/cli.py). Nothing below this layer
imports it."""
