"""`lilicorr bench`: prompt sets played against an SGLang server, then tau, tokens/s and speedup."""
