"""The trainable DFlash drafter, its block layout, and exported drafts loaded strictly (`load_draft`)."""

from .blocks import BlockLayout, block_attention, block_layout, eligible_anchors, sample_anchors
from .config import DrafterConfig, DrafterConfigError, RopeScaling, default_target_layer_ids
from .model import DFlashDrafter, DrafterShapeError, drafter_tensors
from .draft import load_draft

__all__ = ["BlockLayout", "block_attention", "block_layout", "eligible_anchors", "sample_anchors"]
__all__ += ["DrafterConfig", "DrafterConfigError", "RopeScaling", "default_target_layer_ids"]
__all__ += ["DFlashDrafter", "DrafterShapeError", "drafter_tensors", "load_draft"]
