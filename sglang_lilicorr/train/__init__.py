"""Training: regenerate data with the target, train the drafter + LiLiCorr head jointly, export
SGLang draft checkpoints. Entry points: `sglang_lilicorr.train.cli.register`."""
