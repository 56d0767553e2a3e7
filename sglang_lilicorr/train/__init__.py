"""Training: regenerate data with the target, train the drafter + LiLiCorr head jointly, export
SGLang draft checkpoints. Its commands: `sglang_lilicorr/commands/train.py`."""
