"""Functional API: ``from torch_lattice.nn import functional as F``."""

from torch_lattice.nn.functional.config import (
    ConvConfig,
    Dataflow,
    clear_global_conv_config,
    conv_config,
    get_global_conv_config,
    resolved_dataflow,
    set_global_conv_config,
)
from torch_lattice.nn.functional.conv import conv3d, subm_conv3d
from torch_lattice.nn.functional.conv_transpose import (
    conv_transpose3d,
    generative_conv_transpose3d,
)
from torch_lattice.nn.functional.norm import batch_norm
from torch_lattice.nn.functional.normalized import normalized
from torch_lattice.nn.functional.pooling import (
    avg_pool3d,
    global_avg_pool,
    global_max_pool,
    global_pool,
    max_pool3d,
    pool_transpose3d,
    sum_pool3d,
    trilinear_upsample3d,
)
from torch_lattice.nn.functional.tuning import (
    TuningKey,
    clear_tuning,
    load_tuning,
    save_tuning,
    tuning_choices,
)

__all__ = [
    "ConvConfig",
    "Dataflow",
    "TuningKey",
    "avg_pool3d",
    "batch_norm",
    "clear_global_conv_config",
    "clear_tuning",
    "conv3d",
    "conv_config",
    "conv_transpose3d",
    "generative_conv_transpose3d",
    "get_global_conv_config",
    "global_avg_pool",
    "global_max_pool",
    "global_pool",
    "load_tuning",
    "max_pool3d",
    "normalized",
    "pool_transpose3d",
    "resolved_dataflow",
    "save_tuning",
    "set_global_conv_config",
    "subm_conv3d",
    "sum_pool3d",
    "trilinear_upsample3d",
    "tuning_choices",
]
