"""Ready-made sparse networks: ``tl.backbones.SparseResUNet42``."""

from torch_lattice.backbones.unet import ResidualBlock, SparseResUNet42

__all__ = ["ResidualBlock", "SparseResUNet42"]
