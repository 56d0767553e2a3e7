"""sglang-lilicorr: LiLiCorr speculative decoding for SGLang (the plugin: `sglang_lilicorr.serving`)."""

from .config import LiLiCorrConfig
from .head import LiLiCorrHead
from .walk import greedy_walk, path_score, viterbi

__all__ = ["LiLiCorrConfig", "LiLiCorrHead", "greedy_walk", "viterbi", "path_score"]
__version__ = "0.1.0"
