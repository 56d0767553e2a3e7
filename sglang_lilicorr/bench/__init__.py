"""`lilicorr bench`: SPEED-Bench and packaged prompt sets played against an SGLang server (runner, client), then tau,
tokens/s and speedup (metrics) in the paper's tables (tables) and figures (plots); `datasets` names the loaders."""
