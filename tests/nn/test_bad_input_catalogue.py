"""Catalogue of bad inputs across the public API: each raises a clear Python exception.

Every case names the exception type it must raise (exactly: a subclass is listed as
itself) and a regular expression its message must match: the argument's name (and, where
the library states one, the broken rule). Every callable in ``torch_lattice.__all__``,
``torch_lattice.nn.__all__`` and ``torch_lattice.nn.functional.__all__`` that takes
arguments has at least one case calling it by name.
A case that crashed, raised an unclear error (a bare RuntimeError from deep inside
torch, an IndexError, an AttributeError, an assertion) or was silently accepted would be
a library bug, fixed at the API boundary rather than here.

Covered: ``SparseTensor`` construction and its methods, ``cat`` / ``add`` / ``to_dense``;
the convolution modules (``SubmConv3d``, ``Conv3d``, ``ConvTranspose3d``,
``GenerativeConvTranspose3d``, the ``Normalized*`` ones), pooling, ``BatchNorm`` and
the activations, constructed and called badly; the functional API
(``torch_lattice.nn.functional``); the dataflow configuration (``ConvConfig``,
``conv_config``, ``set_global_conv_config``, ``resolved_dataflow``); ``voxelize``,
``devoxelize`` and ``collate``; checkpoint conversion (``torch_lattice.migration``: the
Python API and the ``convert-checkpoint`` command line). Legacy checkpoints carry no
format version, so there is no "unknown version" case: an unrecognised container or
layout is what the converter refuses (covered). The joins across supports
(``reindex_sparse``, ``sparse_cat``, ``sparse_binary``), the transposed and global
pooling functions (``pool_transpose3d``, ``trilinear_upsample3d``, ``global_pool``) and
the MLX Lattice artifacts (``save_lattice_model_artifact``: arguments, unsupported
modules and dtypes, destinations; ``load_lattice_program``: arguments, file sets, another
IR version, an unknown op). ``ExportError`` is a ``ValueError``. The hostile cases of
issue 21: sizes a small input makes the library compute (refused by the memory budget),
coordinates and strides beyond int32, expanded and edited coordinates, converter outputs
that are its inputs, corrupted archives, export names and folders, replay case names and
FIFOs.

Not bad inputs, and so not here: NaN or infinite *features* (they propagate through the
arithmetic as in ``torch.nn.functional.conv3d``; NaN or infinite *points* are refused by
``voxelize``, below).

The last tests call ``torch_lattice._C`` entry points directly with null pointers and
non-zero sizes, negative sizes and too-small output capacities: each must raise
``ValueError`` (invalid argument) or ``RuntimeError`` ("output buffer too small"),
never crash or write past the capacity it was given.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import CodeType, TracebackType

import pytest
import torch

import torch_lattice as tl
from torch_lattice import _C, data, migration
from torch_lattice.artifact import ExportError, load_lattice_program, save_lattice_model_artifact
from torch_lattice.artifact import __main__ as replay_cli
from torch_lattice.artifact.mlir_parse import MlirSyntaxError
from torch_lattice.memory_budget import MemoryBudgetError
from torch_lattice.migration import cli as migration_cli
from torch_lattice.nn import functional as F
from torch_lattice.regular_file import read_regular_file

# --------------------------------------------------------------------------------------
# Fixtures of valid inputs
# --------------------------------------------------------------------------------------

C = 4


def _coords() -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    raw = torch.randint(0, 6, (40, 3), generator=g)
    b = torch.randint(0, 2, (40, 1), generator=g)
    return torch.unique(torch.cat([b, raw], dim=1), dim=0).to(torch.int32)


def _x(channels: int = C, dtype: torch.dtype = torch.float32, **kw) -> tl.SparseTensor:
    coords = _coords()
    return tl.SparseTensor(torch.randn(coords.shape[0], channels, dtype=dtype), coords, **kw)


def _feats(n: int | None = None) -> torch.Tensor:
    return torch.randn(_coords().shape[0] if n is None else n, C)


def _strided() -> tuple[tl.SparseTensor, tl.SparseTensor]:
    """A stride-1 tensor and its k2 s2 Conv3d output (for transposes)."""
    x = _x()
    y = tl.nn.Conv3d(C, C, 2, stride=2)(x)
    return x, y


def _w(k: int = 27, cin: int = C, cout: int = C) -> torch.Tensor:
    return torch.randn(k, cin, cout)


def _points(p: int = 20) -> torch.Tensor:
    return torch.rand(p, 3, generator=torch.Generator().manual_seed(1)) * 4


def _save(tmp: Path, obj: object, name: str = "legacy.pt") -> Path:
    path = tmp / name
    torch.save(obj, path)
    return path


def _spec(tmp: Path, spec: object) -> Path:
    path = tmp / "spec.json"
    path.write_text(json.dumps(spec))
    return path


def _legacy_state() -> dict[str, torch.Tensor]:
    return {"stem.kernel": torch.randn(27, 2, 3), "stem.bias": torch.randn(3)}


def _convert(tmp: Path, obj: object, spec: object, raw: bytes | None = None) -> None:
    if raw is not None:
        src = tmp / "legacy.pt"
        src.write_bytes(raw)
    else:
        src = _save(tmp, obj)
    migration.convert_checkpoint(src, tmp / "out.safetensors", spec)


@dataclass(frozen=True)
class Case:
    id: str
    fn: Callable[[Path], object]
    exc: type[BaseException]
    match: str


CASES: list[Case] = []


def add(id: str, exc: type[BaseException], match: str, fn: Callable[[], object]) -> None:
    CASES.append(Case(id, lambda tmp: fn(), exc, match))


def add_tmp(id: str, exc: type[BaseException], match: str, fn: Callable[[Path], object]) -> None:
    CASES.append(Case(id, fn, exc, match))


# --------------------------------------------------------------------------------------
# SparseTensor
# --------------------------------------------------------------------------------------

ST = tl.SparseTensor
add(
    "tensor-coords-list",
    TypeError,
    r"coords must be a torch\.Tensor",
    lambda: ST(torch.randn(1, C), [[0, 0, 0, 0]]),
)
add(
    "tensor-coords-float",
    TypeError,
    r"coords must be an integer tensor",
    lambda: ST(torch.randn(1, C), torch.zeros(1, 4)),
)
add(
    "tensor-arguments-swapped",
    TypeError,
    r"coords must be an integer tensor \(int32 or int64\), got torch\.float32; feats is an "
    r"integer \(2, 4\) tensor, so the two look swapped: "
    r"the order is SparseTensor\(feats, coords\)$",
    lambda: ST(torch.tensor([[0, 1, 2, 3], [0, 1, 2, 4]]), torch.randn(2, C)),
)
add(
    "tensor-coords-float-points",
    TypeError,
    r"coords must be an integer tensor \(int32 or int64\), got torch\.float64; for float "
    r"points \(e\.g\. metres\), tl\.voxelize\(points, feats, voxel_size=\.\.\.\) makes",
    lambda: ST(torch.randn(3, C), torch.rand(3, 4, dtype=torch.float64) * 10),
)
add(
    "tensor-coords-bool",
    TypeError,
    r"coords must be an integer tensor",
    lambda: ST(torch.randn(1, C), torch.zeros(1, 4, dtype=torch.bool)),
)
add(
    "tensor-coords-3-columns",
    ValueError,
    r"coords must have shape \(N, 4\)",
    lambda: ST(torch.randn(1, C), torch.zeros(1, 3, dtype=torch.int32)),
)
add(
    "tensor-coords-1d",
    ValueError,
    r"coords must have shape \(N, 4\)",
    lambda: ST(torch.randn(1, C), torch.zeros(4, dtype=torch.int32)),
)
add(
    "tensor-coords-negative",
    ValueError,
    r"coords must be non-negative",
    lambda: ST(torch.randn(1, C), torch.tensor([[0, -1, 0, 0]])),
)
add(
    "tensor-coords-beyond-int32",
    ValueError,
    r"coords must fit in int32",
    lambda: ST(torch.randn(1, C), torch.tensor([[0, 2**31, 0, 0]])),
)
add(
    "tensor-coords-duplicate-rows",
    ValueError,
    r"coords rows must be unique",
    lambda: ST(torch.randn(2, C), torch.tensor([[0, 1, 2, 3], [0, 1, 2, 3]])),
)
add(
    "tensor-coords-on-meta",
    ValueError,
    r"coords must be on the CPU or a CUDA device",
    lambda: ST(
        torch.randn(1, C, device="meta"), torch.zeros(1, 4, dtype=torch.int32, device="meta")
    ),
)
add(
    "tensor-feats-list",
    TypeError,
    r"feats must be a torch\.Tensor",
    lambda: ST([[0.0] * C], torch.zeros(1, 4, dtype=torch.int32)),
)
add(
    "tensor-feats-int",
    TypeError,
    r"feats must be a floating tensor",
    lambda: ST(torch.ones(1, C, dtype=torch.int64), torch.zeros(1, 4, dtype=torch.int32)),
)
add(
    "tensor-feats-bool",
    TypeError,
    r"feats must be a floating tensor",
    lambda: ST(torch.ones(1, C, dtype=torch.bool), torch.zeros(1, 4, dtype=torch.int32)),
)
for _f8 in (torch.float8_e4m3fn, torch.float8_e5m2):
    # float8 features were accepted and failed later, in the first layer's dtype check
    add(
        f"tensor-feats-{str(_f8).removeprefix('torch.')}",
        TypeError,
        r"feats must be a floating tensor of a supported dtype \(float32, float64, float16 or "
        rf"bfloat16\), got {_f8}",
        lambda _f8=_f8: ST(torch.ones(1, C).to(_f8), torch.zeros(1, 4, dtype=torch.int32)),
    )
# Sparse (COO, CSR) and nested tensors were accepted and failed later, inside torch
# ("unsupported memory format option", "Cannot access data pointer", "Internal error")
add(
    "tensor-feats-sparse-coo",
    TypeError,
    r"feats must be a dense \(strided\) tensor, got layout torch.sparse_coo",
    lambda: ST(torch.ones(1, C).to_sparse(), torch.zeros(1, 4, dtype=torch.int32)),
)
add(
    "tensor-feats-nested",
    TypeError,
    r"feats must be a dense \(strided\) tensor, got a nested tensor",
    lambda: ST(torch.nested.nested_tensor([torch.ones(C)]), torch.zeros(1, 4, dtype=torch.int32)),
)
add(
    "tensor-coords-sparse-coo",
    TypeError,
    r"coords must be a dense \(strided\) tensor, got layout torch.sparse_coo",
    lambda: ST(torch.ones(1, C), torch.zeros(1, 4, dtype=torch.int32).to_sparse()),
)
add(
    "tensor-replace-sparse-coo",
    TypeError,
    r"feats must be a dense \(strided\) tensor",
    lambda: _x().replace(_feats().to_sparse()),
)
add(
    "conv-weight-sparse-coo",
    TypeError,
    r"weight must be a dense \(strided\) tensor, got layout torch.sparse_coo",
    lambda: F.subm_conv3d(_x(), torch.ones(27, C, 2).to_sparse(), None, 3),
)
add(
    "voxelize-points-sparse-coo",
    TypeError,
    r"points must be a dense \(strided\) tensor, got layout torch.sparse_coo",
    lambda: tl.voxelize(torch.rand(5, 3).to_sparse(), torch.ones(5, 2)),
)
add(
    "tensor-replace-float8",
    TypeError,
    r"feats must be a floating tensor of a supported dtype \(float32, float64",
    lambda: _x().replace(_feats().to(torch.float8_e4m3fn)),
)
add(
    "tensor-to-float8",
    TypeError,
    r"to: feats must stay floating, of a supported dtype \(float32, float64, float16 or "
    r"bfloat16\), got torch.float8_e5m2",
    lambda: _x().to(torch.float8_e5m2),
)
add(
    "tensor-feats-1d",
    ValueError,
    r"feats must have shape \(N, C\)",
    lambda: ST(torch.ones(1), torch.zeros(1, 4, dtype=torch.int32)),
)
add(
    "tensor-feats-rows-mismatch",
    ValueError,
    r"feats must have one row per coordinate",
    lambda: ST(torch.ones(3, C), torch.zeros(1, 4, dtype=torch.int32)),
)
add(
    "tensor-feats-meta-coords-cpu",
    ValueError,
    r"feats and coords must be on the same device",
    lambda: ST(torch.ones(1, C, device="meta"), torch.zeros(1, 4, dtype=torch.int32)),
)
add("tensor-stride-zero", ValueError, r"stride must be positive", lambda: _x(stride=0))
add("tensor-stride-float", TypeError, r"stride must contain ints", lambda: _x(stride=(1.5, 1, 1)))
add(
    "tensor-stride-two-axes",
    ValueError,
    r"stride must have 3 components",
    lambda: _x(stride=(2, 2)),
)
add("tensor-stride-bool", TypeError, r"stride must be an int", lambda: _x(stride=True))
add(
    "tensor-range-three-items",
    ValueError,
    r"spatial_range must be None, an int or",
    lambda: _x(spatial_range=(2, 8, 8)),
)
add(
    "tensor-range-zero",
    ValueError,
    r"spatial_range must hold positive ints",
    lambda: _x(spatial_range=(2, 8, 0, 8)),
)
add(
    "tensor-range-too-small",
    ValueError,
    r"coords must lie inside spatial_range",
    lambda: _x(spatial_range=(2, 3, 8, 8)),
)
add(
    "tensor-range-string",
    TypeError,
    r"spatial_range must be None, an int or a sequence \(B, X, Y, Z\) of ints, got str",
    lambda: _x(spatial_range="abcd"),
)
add(
    "tensor-replace-rows",
    ValueError,
    r"feats must have one row per coordinate",
    lambda: _x().replace(torch.randn(2, C)),
)
add(
    "tensor-replace-int",
    TypeError,
    r"feats must be a floating tensor",
    lambda: _x().replace(torch.ones(len(_coords()), C, dtype=torch.int32)),
)
add("tensor-dense-no-range", ValueError, r"dense\(\) needs spatial_range", lambda: _x().dense())
add(
    "add-other-support",
    ValueError,
    r"add: .*support",
    lambda: _x() + tl.SparseTensor(torch.randn(1, C), torch.zeros(1, 4, dtype=torch.int32)),
)
add(
    "add-channels-differ",
    ValueError,
    r"add: channel counts differ",
    lambda: (lambda x: x + x.replace(torch.randn(len(x), C + 1)))(_x()),
)
add(
    "sparse-binary-same-support-dtypes-differ",
    TypeError,
    r"sparse_binary: lhs feats are torch.float32 but rhs feats torch.float64; feature "
    r"dtypes must match",
    lambda: (lambda x: tl.sparse_binary(x, x.double(), "add"))(_x()),
)
add(
    "add-not-sparse",
    TypeError,
    r"add: argument 1 must be a SparseTensor",
    lambda: tl.sparse_ops.add(_x(), torch.ones(1)),
)
add("cat-empty", ValueError, r"cat: tensors must not be empty", lambda: tl.cat([]))
add("cat-not-a-list", TypeError, r"cat: tensors must be a list", lambda: tl.cat(_x()))
add(
    "cat-mixed",
    TypeError,
    r"cat: argument 1 must be a SparseTensor",
    lambda: tl.cat([_x(), torch.ones(1)]),
)
add(
    "to-dense-tensor",
    TypeError,
    r"to_dense: x must be a SparseTensor",
    lambda: tl.to_dense(torch.ones(2, 2)),
)

# --------------------------------------------------------------------------------------
# Module constructors
# --------------------------------------------------------------------------------------

nn = tl.nn
add("subm-kernel-zero", ValueError, r"kernel_size must be positive", lambda: nn.SubmConv3d(C, C, 0))
add(
    "subm-kernel-negative",
    ValueError,
    r"kernel_size must be positive",
    lambda: nn.SubmConv3d(C, C, -3),
)
add(
    "subm-kernel-even",
    ValueError,
    r"kernel_size must be odd",
    lambda: nn.SubmConv3d(C, C, (3, 2, 3)),
)
add(
    "subm-kernel-four-axes",
    ValueError,
    r"kernel_size must have 3 components",
    lambda: nn.SubmConv3d(C, C, (3, 3, 3, 3)),
)
add("subm-kernel-float", TypeError, r"kernel_size must be an int", lambda: nn.SubmConv3d(C, C, 3.0))
add(
    "subm-kernel-string",
    TypeError,
    r"kernel_size must be an int",
    lambda: nn.SubmConv3d(C, C, "333"),
)
add(
    "subm-in-channels-zero",
    ValueError,
    r"in_channels must be a positive int",
    lambda: nn.SubmConv3d(0, C),
)
add(
    "subm-out-channels-bool",
    ValueError,
    r"out_channels must be a positive int",
    lambda: nn.SubmConv3d(C, True),
)
add(
    "subm-in-channels-float",
    ValueError,
    r"in_channels must be a positive int",
    lambda: nn.SubmConv3d(4.0, C),
)
add(
    "subm-dilation-zero",
    ValueError,
    r"dilation must be positive",
    lambda: nn.SubmConv3d(C, C, 3, dilation=0),
)
add(
    "subm-config-dict",
    TypeError,
    r"config must be a ConvConfig",
    lambda: nn.SubmConv3d(C, C, config={"dataflow": "implicit_gemm"}),
)
add(
    "conv-stride-zero", ValueError, r"stride must be positive", lambda: nn.Conv3d(C, C, 2, stride=0)
)
add(
    "conv-padding-negative",
    ValueError,
    r"padding must be >= 0",
    lambda: nn.Conv3d(C, C, 3, padding=-1),
)
add(
    "conv-dilation-zero",
    ValueError,
    r"dilation must be positive",
    lambda: nn.Conv3d(C, C, 3, dilation=(1, 0, 1)),
)
add(
    "conv-kernel-volume-beyond-int32",
    ValueError,
    r"kernel_size .* at most",
    lambda: nn.Conv3d(1, 1, (2048, 2048, 1024)),
)
add(
    "conv-out-channels-negative",
    ValueError,
    r"out_channels must be a positive int",
    lambda: nn.Conv3d(C, -1, 2),
)
add(
    "convtr-stride-zero",
    ValueError,
    r"stride must be positive",
    lambda: nn.ConvTranspose3d(C, C, 2, stride=0),
)
add(
    "convtr-config-string",
    TypeError,
    r"config must be a ConvConfig",
    lambda: nn.ConvTranspose3d(C, C, 2, stride=2, config="gather_scatter"),
)
add(
    "gen-padding-one",
    ValueError,
    r"padding must be 0 for GenerativeConvTranspose3d",
    lambda: nn.GenerativeConvTranspose3d(C, C, 2, stride=2, padding=1),
)
add(
    "gen-dilation-two",
    ValueError,
    r"dilation must be 1 for GenerativeConvTranspose3d",
    lambda: nn.GenerativeConvTranspose3d(C, C, 2, stride=2, dilation=2),
)
# dilation -1 was refused as "must be >= 0", a rule that 0 breaks too
add(
    "gen-dilation-negative",
    ValueError,
    r"dilation must be positive in every axis, got -1",
    lambda: nn.GenerativeConvTranspose3d(C, C, 2, stride=2, dilation=-1),
)
add(
    "gen-padding-negative",
    ValueError,
    r"padding must be >= 0 in every axis, got -1",
    lambda: nn.GenerativeConvTranspose3d(C, C, 2, stride=2, padding=-1),
)
add(
    "norm-subm-eps-zero",
    ValueError,
    r"eps must be a positive number",
    lambda: nn.NormalizedSubmConv3d(C, C, 3, eps=0.0),
)
add(
    "norm-convtr-eps-nan",
    ValueError,
    r"eps must be a positive number",
    lambda: nn.NormalizedConvTranspose3d(C, C, 2, stride=2, eps=float("nan")),
)
add(
    "norm-gen-eps-inf",
    ValueError,
    r"eps must be finite",
    lambda: nn.NormalizedGenerativeConvTranspose3d(C, C, 2, stride=2, eps=float("inf")),
)
add(
    "norm-subm-kernel-even",
    ValueError,
    r"kernel_size must be odd",
    lambda: nn.NormalizedSubmConv3d(C, C, 2),
)
add("maxpool-kernel-zero", ValueError, r"kernel_size must be positive", lambda: nn.MaxPool3d(0))
add(
    "avgpool-stride-zero", ValueError, r"stride must be positive", lambda: nn.AvgPool3d(2, stride=0)
)
add(
    "sumpool-padding-negative",
    ValueError,
    r"padding must be >= 0",
    lambda: nn.SumPool3d(2, padding=-1),
)
add("maxpool-kernel-float", TypeError, r"kernel_size must be an int", lambda: nn.MaxPool3d(2.5))

# --------------------------------------------------------------------------------------
# Module calls
# --------------------------------------------------------------------------------------

add("subm-wrong-channels", ValueError, r"in_channels=8", lambda: nn.SubmConv3d(8, C)(_x()))
add(
    "subm-dense-tensor-input",
    TypeError,
    r"input must be a torch_lattice\.SparseTensor",
    lambda: nn.SubmConv3d(C, C)(torch.randn(10, C)),
)
add(
    "subm-dtype-mismatch",
    TypeError,
    r"dtype .* does not match weight dtype",
    lambda: nn.SubmConv3d(C, C)(_x(dtype=torch.float64)),
)
add(
    "conv-target-wrong-stride",
    ValueError,
    r"coordinates stride .* must equal",
    lambda: nn.Conv3d(C, C, 2, stride=2)(_x(), coordinates=_x()),
)
add(
    "conv-target-duplicates",
    ValueError,
    r"coordinates rows must be unique",
    lambda: nn.Conv3d(C, C, 2, stride=2)(_x(), torch.tensor([[0, 0, 0, 0], [0, 0, 0, 0]])),
)
add(
    "conv-target-float",
    TypeError,
    r"coordinates must be an integer tensor",
    lambda: nn.Conv3d(C, C, 2, stride=2)(_x(), torch.zeros(1, 4)),
)
add(
    "conv-target-list",
    TypeError,
    r"coordinates must be a torch\.Tensor",
    lambda: nn.Conv3d(C, C, 2, stride=2)(_x(), [[0, 0, 0, 0]]),
)
add(
    "conv-target-twice",
    ValueError,
    r"coordinates= or target=, not both",
    lambda: (lambda x: nn.Conv3d(C, C, 1)(x, x, target=x))(_x()),
)
add(
    "conv-window-beyond-range",
    ValueError,
    r"kernel_size .* does not fit the input range",
    lambda: nn.Conv3d(C, C, 9, stride=2)(_x(spatial_range=(2, 6, 6, 6))),
)
add(
    "conv-window-beyond-range-empty",  # as torch.nn.Conv3d on an empty batch
    ValueError,
    r"kernel_size .* does not fit the input range",
    lambda: nn.Conv3d(C, C, 3)(
        tl.SparseTensor(torch.zeros(0, C), torch.zeros(0, 4, dtype=torch.int32),
                        spatial_range=(1, 2, 2, 2))
    ),
)
add(
    "convtr-no-history",
    ValueError,
    r"ConvTranspose3d\(src\) without a target needs src",
    lambda: nn.ConvTranspose3d(C, C, 2, stride=2)(_x(stride=2)),
)
add(
    "convtr-stride-not-divisible",
    ValueError,
    r"input stride .* must be divisible",
    lambda: nn.ConvTranspose3d(C, C, 2, stride=2)(_x(), _x()),
)
add(
    "convtr-target-wrong-stride",
    ValueError,
    r"coordinates stride .* must equal",
    lambda: (lambda xy: nn.ConvTranspose3d(C, C, 2, stride=2)(xy[1], xy[1]))(_strided()),
)
add(
    "convtr-target-explicit-dataflow",
    ValueError,
    r"target-conditioned transposes run with",
    lambda: (
        lambda xy: nn.ConvTranspose3d(
            C, C, 2, stride=2, config=F.ConvConfig(dataflow=F.Dataflow.ImplicitGEMM)
        )(xy[1], xy[0])
    )(_strided()),
)
add(
    "convtr-wrong-channels",
    ValueError,
    r"in_channels=8",
    lambda: (lambda xy: nn.ConvTranspose3d(8, C, 2, stride=2)(xy[1]))(_strided()),
)
add(
    "gen-stride-not-divisible",
    ValueError,
    r"input stride .* must be divisible",
    lambda: nn.GenerativeConvTranspose3d(C, C, 2, stride=2)(_x()),
)
add(
    "norm-subm-wrong-channels",
    ValueError,
    r"in_channels=8",
    lambda: nn.NormalizedSubmConv3d(8, C)(_x()),
)
add(
    "maxpool-dense-input",
    TypeError,
    r"input must be a torch_lattice\.SparseTensor",
    lambda: nn.MaxPool3d(2)(torch.randn(3, C)),
)
add(
    "avgpool-window-beyond-range",
    ValueError,
    r"kernel_size .* does not fit the input range",
    lambda: nn.AvgPool3d(9, stride=2)(_x(spatial_range=(2, 6, 6, 6))),
)
add(
    "global-avg-dense-input",
    TypeError,
    r"input must be a torch_lattice\.SparseTensor",
    lambda: nn.GlobalAvgPool()(torch.randn(3, C)),
)
add(
    "global-max-none",
    TypeError,
    r"input must be a torch_lattice\.SparseTensor",
    lambda: nn.GlobalMaxPool()(None),
)
add(
    "batchnorm-dense-input",
    TypeError,
    r"input must be a SparseTensor",
    lambda: nn.BatchNorm(C)(torch.randn(3, C)),
)
add("batchnorm-wrong-channels", ValueError, r"num_features=8", lambda: nn.BatchNorm(8)(_x()))
add(
    "batchnorm-relu-wrong-channels",
    ValueError,
    r"num_features=8",
    lambda: nn.BatchNormReLU(8)(_x()),
)
add(
    "f-batch-norm-one-row-training",
    ValueError,
    r"batch_norm: training needs more than 1 row per channel",
    lambda: F.batch_norm(torch.randn(1, C), None, None, training=True),
)
add(
    "f-batch-norm-eval-without-statistics",
    ValueError,
    r"batch_norm: eval mode \(training=False\) needs running statistics",
    lambda: F.batch_norm(torch.randn(3, C), None, None),
)
add(
    "f-batch-norm-one-running-buffer",
    ValueError,
    r"batch_norm: give both running_mean and running_var, or neither",
    lambda: F.batch_norm(torch.randn(3, C), torch.zeros(C), None, training=True),
)
add(
    "f-batch-norm-weight-shape",
    ValueError,
    r"batch_norm: weight must have shape \(4,\), got \(3,\)",
    lambda: F.batch_norm(torch.randn(3, C), None, None, torch.ones(3), training=True),
)
add(
    "f-batch-norm-dense-3d",
    ValueError,
    r"batch_norm: input must be \(N, C\) features, got \(2, 3, 4\)",
    lambda: F.batch_norm(torch.randn(2, 3, C), None, None, training=True),
)
add(
    "f-batch-norm-parameter-dtype",
    TypeError,
    r"batch_norm: parameters of dtype torch.bfloat16 do not mix with torch.float32 features",
    lambda: F.batch_norm(
        torch.randn(3, C), None, None, torch.ones(C, dtype=torch.bfloat16), training=True
    ),
)
add(
    "fold-batch-norm-training-mode",
    ValueError,
    r"fold_batch_norm: model is in training mode; call model.eval\(\) first",
    lambda: nn.fold_batch_norm(torch.nn.Sequential(nn.SubmConv3d(C, C, 3), nn.BatchNorm(C))),
)
add(
    "reuse-cpu-memory-not-bytes",
    TypeError,
    r"reuse_cpu_memory: max_block must be an int \(bytes\) or None, got str",
    lambda: tl.reuse_cpu_memory("1G"),  # type: ignore[arg-type]
)
add(
    "reuse-cpu-memory-out-of-range",
    ValueError,
    r"reuse_cpu_memory: max_block must be in \[1, 2\*\*31 - 1\] bytes \(a C int\), got 0",
    lambda: tl.reuse_cpu_memory(0),
)
add(
    "relu-dense-input",
    TypeError,
    r"ReLU input must be a SparseTensor",
    lambda: nn.ReLU()(torch.randn(3, C)),
)
add(
    "gelu-dense-input",
    TypeError,
    r"GELU input must be a SparseTensor",
    lambda: nn.GELU()(torch.randn(3, C)),
)
add(
    "leaky-relu-dense-input",
    TypeError,
    r"LeakyReLU input must be a SparseTensor",
    lambda: nn.LeakyReLU(0.1)(torch.randn(3, C)),
)
add(
    "silu-dense-input",
    TypeError,
    r"SiLU input must be a SparseTensor",
    lambda: nn.SiLU()(torch.randn(3, C)),
)

# --------------------------------------------------------------------------------------
# Functional API
# --------------------------------------------------------------------------------------

add(
    "f-subm-weight-shape",
    ValueError,
    r"weight must have shape \(K=27, C_in, C_out\)",
    lambda: F.subm_conv3d(_x(), _w(8), None, 3),
)
add(
    "f-subm-weight-none",
    TypeError,
    r"weight must be a torch\.Tensor",
    lambda: F.subm_conv3d(_x(), None, None, 3),
)
add(
    "f-subm-weight-int",
    TypeError,
    r"weight must be a floating tensor",
    lambda: F.subm_conv3d(_x(), torch.ones(27, C, C, dtype=torch.int32), None, 3),
)
add(
    "f-subm-bias-shape",
    ValueError,
    r"bias must have shape \(C_out,\) = \(4,\)",
    lambda: F.subm_conv3d(_x(), _w(), torch.randn(1), 3),
)
add(
    "f-subm-bias-list",
    TypeError,
    r"bias must be a torch\.Tensor or None",
    lambda: F.subm_conv3d(_x(), _w(), [0.0] * C, 3),
)
add(
    "f-subm-kernel-even",
    ValueError,
    r"kernel_size must be odd",
    lambda: F.subm_conv3d(_x(), _w(8), None, 2),
)
add(
    "f-conv-stride-zero",
    ValueError,
    r"stride must be positive",
    lambda: F.conv3d(_x(), _w(8), None, 2, 0),
)
add(
    "f-conv-bias-2d",
    ValueError,
    r"bias must have shape \(C_out,\)",
    lambda: F.conv3d(_x(), _w(8), torch.randn(1, C), 2, 2),
)
add(
    "f-convtr-weight-shape",
    ValueError,
    r"weight must have shape \(K=8, C_in, C_out\)",
    lambda: (lambda xy: F.conv_transpose3d(xy[1], _w(27), None, 2, 2))(_strided()),
)
add(
    "f-gen-weight-none",
    TypeError,
    r"weight must be a torch\.Tensor",
    lambda: F.generative_conv_transpose3d(_x(stride=2), None, None, 2, 2),
)
add(
    "f-maxpool-padding-negative",
    ValueError,
    r"padding must be >= 0",
    lambda: F.max_pool3d(_x(), 2, 2, -1),
)
add(
    "f-sumpool-dense-input",
    TypeError,
    r"input must be a torch_lattice\.SparseTensor",
    lambda: F.sum_pool3d(torch.randn(3, C), 2),
)
add(
    "f-avgpool-kernel-zero",
    ValueError,
    r"kernel_size must be positive in every axis",
    lambda: F.avg_pool3d(_x(), 0),
)
add(
    "f-global-max-dense-input",
    TypeError,
    r"input must be a torch_lattice\.SparseTensor",
    lambda: F.global_max_pool(torch.randn(3, C)),
)
add(
    "f-global-avg-dense-input",
    TypeError,
    r"input must be a torch_lattice\.SparseTensor",
    lambda: F.global_avg_pool(torch.randn(3, C)),
)
add(
    "f-normalized-eps-negative",
    ValueError,
    r"eps must be a positive number",
    lambda: F.normalized(lambda x, w: x, _x(), _w(), None, -1.0),
)

# --------------------------------------------------------------------------------------
# Configuration
# --------------------------------------------------------------------------------------

add(
    "config-dataflow-string",
    TypeError,
    r"dataflow must be a Dataflow",
    lambda: F.ConvConfig(dataflow="gather_scatter"),
)
add(
    "config-allow-tf32-int",
    TypeError,
    r"allow_tf32 must be a bool",
    lambda: F.ConvConfig(allow_tf32=1),
)
add(
    "config-dataflow-unknown-name",
    ValueError,
    r"'bogus' is not a valid Dataflow",
    lambda: F.Dataflow("bogus"),
)
add("conv-config-unknown-field", TypeError, r"bogus", lambda: F.conv_config(bogus=1).__enter__())
add(
    "conv-config-field-type",
    TypeError,
    r"dataflow must be a Dataflow",
    lambda: F.conv_config(dataflow="implicit_gemm").__enter__(),
)
add(
    "conv-config-positional-string",
    TypeError,
    r"config must be a ConvConfig",
    lambda: F.conv_config("implicit_gemm").__enter__(),
)
add(
    "set-global-config-none",
    TypeError,
    r"config must be a ConvConfig",
    lambda: F.set_global_conv_config(None),
)
add(
    "resolved-dataflow-int",
    TypeError,
    r"module_config must be a ConvConfig",
    lambda: F.resolved_dataflow(42),
)
add(
    "resolved-dataflow-device-int",
    TypeError,
    r"device must be a torch\.device",
    lambda: F.resolved_dataflow(device=3),
)
add(
    "resolved-dataflow-target-transpose-str",
    TypeError,
    r"target_transpose must be a bool",
    lambda: F.resolved_dataflow(target_transpose="yes"),
)
add(
    "resolved-dataflow-input-tensor",
    TypeError,
    r"input must be a SparseTensor",
    lambda: F.resolved_dataflow(device="cpu", input=torch.zeros(3, 4)),
)
add(
    "conv-config-autotune-str",
    TypeError,
    r"autotune must be a bool",
    lambda: F.ConvConfig(autotune="yes"),  # type: ignore[arg-type]
)

# Autotuning: the layer-shape key, and the opt-in file of choices
add(
    "tuning-key-zero-channels",
    ValueError,
    r"c_in must be an int in \[1, 2147483647\], got 0",
    lambda: F.TuningKey("cpu", "float32", 0, 4, 27, 10, False),
)
add(
    "tuning-key-size-class-str",
    TypeError,
    r"size_class must be an int in \[0, 63\]",
    lambda: F.TuningKey("cpu", "float32", 4, 4, 27, "10", False),  # type: ignore[arg-type]
)
add(
    "tuning-key-dtype",
    ValueError,
    r"dtype must be one of",
    lambda: F.TuningKey("cpu", "int8", 4, 4, 27, 10, False),
)
add_tmp(
    "load-tuning-missing",
    ValueError,
    r"tuning file .*does not exist",
    lambda tmp: F.load_tuning(tmp / "none.json"),
)
add_tmp(
    "load-tuning-not-json",
    ValueError,
    r"tuning file .* is not JSON",
    lambda tmp: (tmp / "t.json").write_text("{") and F.load_tuning(tmp / "t.json"),
)
add_tmp(
    "save-tuning-missing-folder",
    ValueError,
    r"save_tuning: the folder of path .* does not exist",
    lambda tmp: F.save_tuning(tmp / "no" / "t.json"),
)
add_tmp(
    "save-tuning-nul",
    ValueError,
    r"save_tuning: path .* contains a NUL byte",
    lambda tmp: F.save_tuning(str(tmp / "t\0.json")),
)
add(
    "save-tuning-bytes",
    TypeError,
    r"save_tuning: path must be a str or os.PathLike, got bytes",
    lambda: F.save_tuning(b"t.json"),  # type: ignore[arg-type]
)
add_tmp(
    "save-tuning-directory",
    ValueError,
    r"save_tuning: path .* is a directory",
    lambda tmp: F.save_tuning(tmp),
)

# --------------------------------------------------------------------------------------
# voxelize, devoxelize, collate
# --------------------------------------------------------------------------------------


def _nan_points() -> torch.Tensor:
    p = _points()
    p[3, 1] = float("nan")
    return p


def _inf_points() -> torch.Tensor:
    p = _points()
    p[5, 2] = float("inf")
    return p


add(
    "voxelize-points-nan",
    ValueError,
    r"points must be finite, points\[3\] = \[.*nan",
    lambda: tl.voxelize(_nan_points(), torch.randn(20, C)),
)
add(
    "voxelize-points-inf",
    ValueError,
    r"points must be finite, points\[5\] = \[.*inf",
    lambda: tl.voxelize(_inf_points(), torch.randn(20, C)),
)
add(
    "voxelize-points-below-origin",
    ValueError,
    r"points must lie at or above origin",
    lambda: tl.voxelize(_points() - 10, torch.randn(20, C)),
)
add(
    "voxelize-voxel-size-negative",
    ValueError,
    r"voxel_size must be finite and > 0",
    lambda: tl.voxelize(_points(), torch.randn(20, C), voxel_size=-0.1),
)
add(
    "voxelize-voxel-size-zero-axis",
    ValueError,
    r"voxel_size must be finite and > 0",
    lambda: tl.voxelize(_points(), torch.randn(20, C), voxel_size=(0.1, 0.0, 0.1)),
)
add(
    "voxelize-voxel-size-nan",
    ValueError,
    r"voxel_size must be",
    lambda: tl.voxelize(_points(), torch.randn(20, C), voxel_size=float("nan")),
)
add(
    "voxelize-voxel-size-string",
    TypeError,
    r"voxel_size must be a number or 3 numbers \(x, y, z\), got str",
    lambda: tl.voxelize(_points(), torch.randn(20, C), voxel_size="0.1"),
)
add(
    "voxelize-origin-inf",
    ValueError,
    r"origin must be finite",
    lambda: tl.voxelize(_points(), torch.randn(20, C), origin=float("-inf")),
)
add(
    "voxelize-features-rows",
    ValueError,
    r"features must have shape \(P, C\) with P = 20",
    lambda: tl.voxelize(_points(), torch.randn(19, C)),
)
add(
    "voxelize-features-int",
    TypeError,
    r"features must be a floating",
    lambda: tl.voxelize(_points(), torch.ones(20, C, dtype=torch.int64)),
)
add(
    "voxelize-points-int",
    TypeError,
    r"points must be a floating tensor",
    lambda: tl.voxelize(torch.ones(20, 3, dtype=torch.int64), torch.randn(20, C)),
)
add(
    "voxelize-points-2-columns",
    ValueError,
    r"points must have shape \(P, 3\)",
    lambda: tl.voxelize(torch.rand(20, 2), torch.randn(20, C)),
)
add(
    "voxelize-points-numpy",
    TypeError,
    r"points must be a torch\.Tensor",
    lambda: tl.voxelize(_points().numpy(), torch.randn(20, C)),
)
add(
    "voxelize-batch-float",
    TypeError,
    r"batch_indices must be an integer tensor",
    lambda: tl.voxelize(_points(), torch.randn(20, C), batch_indices=torch.zeros(20)),
)
add(
    "voxelize-batch-bool",
    TypeError,
    r"batch_indices must be an integer tensor",
    lambda: tl.voxelize(
        _points(), torch.randn(20, C), batch_indices=torch.zeros(20, dtype=torch.bool)
    ),
)
add(
    "voxelize-batch-negative",
    ValueError,
    r"batch_indices must be non-negative",
    lambda: tl.voxelize(_points(), torch.randn(20, C), batch_indices=torch.full((20,), -1)),
)
add(
    "voxelize-batch-length",
    ValueError,
    r"batch_indices must have shape \(P,\)",
    lambda: tl.voxelize(
        _points(), torch.randn(20, C), batch_indices=torch.zeros(19, dtype=torch.long)
    ),
)
add(
    "voxelize-reduction-unknown",
    ValueError,
    r"reduction must be one of",
    lambda: tl.voxelize(_points(), torch.randn(20, C), reduction="median"),
)
add(
    "devoxelize-voxels-tensor",
    TypeError,
    r"voxels must be a SparseTensor",
    lambda: tl.devoxelize(_points(), torch.randn(5, C)),
)
add(
    "devoxelize-interpolation-unknown",
    ValueError,
    r"interpolation must be one of",
    lambda: tl.devoxelize(
        _points(), tl.voxelize(_points(), torch.randn(20, C)), interpolation="cubic"
    ),
)
add(
    "devoxelize-points-nan",
    ValueError,
    r"points must be finite, points\[3\] = \[.*nan",
    lambda: tl.devoxelize(_nan_points(), tl.voxelize(_points(), torch.randn(20, C))),
)
add(
    "devoxelize-points-shape",
    ValueError,
    r"points must have shape \(P, 3\)",
    lambda: tl.devoxelize(torch.rand(20, 4), tl.voxelize(_points(), torch.randn(20, C))),
)
add(
    "devoxelize-voxel-size-zero",
    ValueError,
    r"voxel_size must be finite and > 0",
    lambda: tl.devoxelize(_points(), tl.voxelize(_points(), torch.randn(20, C)), voxel_size=0),
)
add(
    "collate-lengths-differ",
    ValueError,
    r"collate: need one features tensor per cloud",
    lambda: tl.collate([_points(), _points()], [torch.randn(20, C)]),
)
add(
    "collate-empty",
    ValueError,
    r"collate: need one features tensor per cloud",
    lambda: tl.collate([], []),
)
add(
    "collate-tensor-not-list",
    TypeError,
    r"collate: points and features must be lists",
    lambda: tl.collate(_points(), torch.randn(20, C)),
)
add(
    "collate-points-item-list",
    TypeError,
    r"collate: points\[1\] must be a tensor",
    lambda: tl.collate([_points(), [[0.0, 0.0, 0.0]]], [torch.randn(20, C)] * 2),
)
add(
    "collate-features-item-list",
    TypeError,
    r"collate: features\[0\] must be a tensor",
    lambda: tl.collate([_points()], [[0.0] * C]),
)
add(
    "collate-cloud-rows-differ",
    ValueError,
    r"collate: features\[1\] has 19 rows but "
    r"points\[1\] has 20",
    lambda: tl.collate([_points(), _points()], [torch.randn(20, C), torch.randn(19, C)]),
)
add(
    "collate-points-nan",
    ValueError,
    r"points must be finite",
    lambda: tl.collate([_nan_points()], [torch.randn(20, C)]),
)

# --------------------------------------------------------------------------------------
# Checkpoint conversion (Python API)
# --------------------------------------------------------------------------------------

SPEC = {"stem.kernel": [3, 3, 3]}
CE = migration.ConversionError
add_tmp(
    "migrate-missing-file",
    CE,
    r"source checkpoint .* does not exist",
    lambda tmp: migration.convert_checkpoint(tmp / "nope.pt", tmp / "o.safetensors", SPEC),
)
add_tmp(
    "migrate-not-a-checkpoint",
    CE,
    r"cannot load .* as a (weights-only )?torch checkpoint",
    lambda tmp: _convert(tmp, None, SPEC, raw=b"this is not a checkpoint"),
)
add_tmp(
    "migrate-top-level-list",
    CE,
    r"checkpoint top level is a list",
    lambda tmp: _convert(tmp, [torch.ones(1)], SPEC),
)
add_tmp(
    "migrate-optimizer-state",
    migration.OptimizerStateError,
    r"optimizer state",
    lambda tmp: _convert(
        tmp, {"model": _legacy_state(), "optimizer": {"state": {}, "param_groups": []}}, SPEC
    ),
)
add_tmp(
    "migrate-unsafe-pickle",
    migration.UnsafeCheckpointError,
    r"refusing",
    lambda tmp: _convert(tmp, {"stem.kernel": Path("/x")}, SPEC),
)
add_tmp(
    "migrate-kernel-wrong-rows",
    CE,
    r"legacy kernel 'stem.kernel' has shape \(8, 2, 3\)",
    lambda tmp: _convert(tmp, {"stem.kernel": torch.randn(8, 2, 3)}, SPEC),
)
add_tmp(
    "migrate-kernel-int",
    CE,
    r"legacy kernel 'stem.kernel' must be floating point",
    lambda tmp: _convert(tmp, {"stem.kernel": torch.ones(27, 2, 3, dtype=torch.int32)}, SPEC),
)
add_tmp(
    "migrate-spec-key-absent",
    CE,
    r"kernel spec keys not found in the checkpoint",
    lambda tmp: _convert(tmp, _legacy_state(), {**SPEC, "head.kernel": [1, 1, 1]}),
)
add_tmp(
    "migrate-spec-kernel-size-zero",
    CE,
    r"kernel_size",
    lambda tmp: _convert(tmp, _legacy_state(), {"stem.kernel": [3, 0, 3]}),
)
add_tmp(
    "migrate-spec-row-order-unknown",
    CE,
    r"row_order",
    lambda tmp: _convert(
        tmp, _legacy_state(), {"stem.kernel": {"kernel_size": [3, 3, 3], "row_order": "y"}}
    ),
)
add_tmp(
    "migrate-spec-not-json",
    CE,
    r"kernel spec .* is not valid JSON",
    lambda tmp: migration.convert_checkpoint(
        _save(tmp, _legacy_state()),
        tmp / "o.safetensors",
        (lambda p: (p.write_text("{not json"), p)[1])(tmp / "s.json"),
    ),
)
add_tmp(
    "migrate-spec-missing",
    CE,
    r"kernel spec .* does not exist",
    lambda tmp: migration.convert_checkpoint(
        _save(tmp, _legacy_state()), tmp / "o.safetensors", tmp / "none.json"
    ),
)
add_tmp(
    "migrate-output-exists",
    CE,
    r"(exists|force)",
    lambda tmp: migration.convert_checkpoint(
        _save(tmp, _legacy_state()),
        (lambda p: (p.write_bytes(b"x"), p)[1])(tmp / "o.safetensors"),
        SPEC,
    ),
)
add(
    "migrate-load-strict-wrong-shape",
    migration.StateDictMismatchError,
    r"weight",
    lambda: migration.load_state_dict_strict(
        nn.SubmConv3d(2, 3, 3),
        {
            "weight": torch.randn(8, 2, 3),
            "kernel_positions": nn.SubmConv3d(2, 3, 3).kernel_positions,
        },
    ),
)


# --------------------------------------------------------------------------------------
# Found by probing beyond the list above (each was unclear or accepted before its fix)
# --------------------------------------------------------------------------------------

add("tensor-to-int-dtype", TypeError, r"to: feats must stay floating", lambda: _x().to(torch.int32))
add(
    "tensor-to-meta",
    ValueError,
    r"to: a SparseTensor lives on the CPU or a CUDA device",
    lambda: _x().to("meta"),
)
add(
    "tensor-dense-range-too-large",
    ValueError,
    r"dense\(\) of spatial_range .* too large",
    lambda: _x(spatial_range=(2, 2**20, 2**20, 2**20)).dense(),
)
add(
    "conv-stride-beyond-int32",
    ValueError,
    r"stride must fit in int32",
    lambda: nn.Conv3d(C, C, 2, stride=2**31),
)
add(
    "conv-padding-beyond-int32",
    ValueError,
    r"padding must fit in int32",
    lambda: nn.Conv3d(C, C, 3, stride=2, padding=2**31),
)
add(
    "maxpool-stride-beyond-int32",
    ValueError,
    r"stride must fit in int32",
    lambda: nn.MaxPool3d(2, stride=2**40),
)
add(
    "batchnorm-dtype-mismatch",
    TypeError,
    r"input feats dtype torch.float64 .* BatchNorm",
    lambda: nn.BatchNorm(C)(_x(dtype=torch.float64)),
)
add(
    "f-conv-config-string",
    TypeError,
    r"config must be a ConvConfig or None",
    lambda: F.conv3d(_x(), _w(8), None, 2, 2, config="gather_scatter"),
)
add(
    "f-subm-config-int",
    TypeError,
    r"config must be a ConvConfig or None",
    lambda: F.subm_conv3d(_x(), _w(), None, 3, config=3),
)
add(
    "f-subm-bias-dtype",
    TypeError,
    r"bias must match weight's dtype",
    lambda: F.subm_conv3d(_x(), _w(), torch.zeros(C, dtype=torch.float64), 3),
)
add(
    "f-normalized-conv-none",
    TypeError,
    r"conv must be callable",
    lambda: F.normalized(None, _x(), _w(), None, 1e-8),
)
add(
    "resolved-dataflow-module-config-int",
    TypeError,
    r"module_config\.config must be",
    lambda: F.resolved_dataflow(type("M", (), {"config": 5})()),
)
add(
    "voxelize-points-meta",
    ValueError,
    r"points must be on the CPU or a CUDA device",
    lambda: tl.voxelize(_points().to("meta"), torch.randn(20, C, device="meta")),
)
add(
    "collate-channels-differ",
    ValueError,
    r"collate: features\[1\] has 5 channels",
    lambda: tl.collate([_points(), _points()], [torch.randn(20, C), torch.randn(20, C + 1)]),
)
add(
    "collate-devices-differ",
    ValueError,
    r"collate: points\[1\] and features\[1\] must be on",
    lambda: tl.collate([_points(), _points().to("meta")], [torch.randn(20, C)] * 2),
)
add(
    "collate-features-1d",
    ValueError,
    r"collate: features\[0\] must have shape \(P, C\)",
    lambda: tl.collate([_points()], [torch.randn(20)]),
)
add(
    "collate-generator",
    TypeError,
    r"collate: points and features must be lists",
    lambda: tl.collate((p for p in [_points()]), [torch.randn(20, C)]),
)
add(
    "migrate-state-none",
    CE,
    r"model state must be a mapping",
    lambda: migration.convert_state_dict(None, SPEC),
)
add(
    "migrate-convert-kernel-list",
    CE,
    r"legacy kernel 'stem.kernel' must be a tensor",
    lambda: migration.convert_kernel(migration.parse_kernel_spec(SPEC)["stem.kernel"], [1.0]),
)
add(
    "migrate-load-strict-non-tensor",
    TypeError,
    r"state must hold only tensors",
    lambda: migration.load_state_dict_strict(nn.SubmConv3d(2, 3), {"weight": 1}),
)
add(
    "migrate-load-strict-none",
    TypeError,
    r"state must be a mapping",
    lambda: migration.load_state_dict_strict(nn.SubmConv3d(2, 3), None),
)
add_tmp(
    "migrate-load-converted-missing",
    CE,
    r"converted weights .* do not exist",
    lambda tmp: migration.load_converted(nn.SubmConv3d(2, 3), tmp / "nope.safetensors"),
)
add_tmp(
    "migrate-load-converted-garbage",
    CE,
    r"cannot read .* as safetensors",
    lambda tmp: migration.load_converted(
        nn.SubmConv3d(2, 3),
        (lambda p: (p.write_bytes(b"garbage!garbage!"), p)[1])(tmp / "g.safetensors"),
    ),
)
add_tmp(
    "migrate-source-none",
    TypeError,
    r"source must be a path",
    lambda tmp: migration.convert_checkpoint(None, tmp / "o.safetensors", SPEC),
)


# --------------------------------------------------------------------------------------
# Joins across supports: reindex_sparse, sparse_cat, sparse_binary
# --------------------------------------------------------------------------------------

add(
    "reindex-input-tensor",
    TypeError,
    r"reindex_sparse: input must be a SparseTensor",
    lambda: tl.reindex_sparse(_feats(), _x()),
)
add(
    "reindex-target-none",
    TypeError,
    r"reindex_sparse: target must be a SparseTensor",
    lambda: tl.reindex_sparse(_x(), None),
)
add(
    "reindex-fill-str",
    TypeError,
    r"reindex_sparse: fill must be a float",
    lambda: tl.reindex_sparse(_x(), _x(), fill="0"),
)
add(
    "reindex-fill-nan",
    ValueError,
    r"reindex_sparse: fill must not be NaN",
    lambda: tl.reindex_sparse(_x(), _x(), fill=float("nan")),
)
add(
    "reindex-strides-differ",
    ValueError,
    r"reindex_sparse: input stride \(1, 1, 1\) differs from target stride \(2, 2, 2\)",
    lambda: tl.reindex_sparse(*_strided()),
)
add(
    "sparse-cat-not-a-list",
    TypeError,
    r"sparse_cat: inputs must be a list or tuple of SparseTensors",
    lambda: tl.sparse_cat(_x()),
)
add(
    "sparse-cat-empty",
    ValueError,
    r"sparse_cat: inputs must not be empty",
    lambda: tl.sparse_cat([]),
)
add(
    "sparse-cat-join-unknown",
    ValueError,
    r"sparse_cat: join must be one of \('inner', 'left', 'right', 'outer'\), got 'full'",
    lambda: tl.sparse_cat([_x(), _x()], join="full"),
)
add(
    "sparse-cat-item-tensor",
    TypeError,
    r"sparse_cat: inputs\[1\] must be a SparseTensor",
    lambda: tl.sparse_cat([_x(), _feats()]),
)
add(
    "sparse-cat-strides-differ",
    ValueError,
    r"sparse_cat: inputs\[0\] stride \(1, 1, 1\) differs from inputs\[1\] stride",
    lambda: tl.sparse_cat(list(_strided())),
)
add(
    "sparse-cat-dtypes-differ",
    TypeError,
    r"sparse_cat: inputs\[0\] feats are torch.float32 but inputs\[1\] feats torch.float64",
    lambda: tl.sparse_cat([_x(), _x(dtype=torch.float64)]),
)
add(
    "sparse-binary-op-unknown",
    ValueError,
    r"sparse_binary: op must be one of \('add', 'sub', 'mul', 'maximum', 'minimum'\)",
    lambda: tl.sparse_binary(_x(), _x(), "pow"),
)
add(
    "sparse-binary-join-unknown",
    ValueError,
    r"sparse_binary: join must be one of",
    lambda: tl.sparse_binary(_x(), _x(), "add", join="cross"),
)
add(
    "sparse-binary-channels-differ",
    ValueError,
    r"sparse_binary: lhs has 4 channels but rhs 5",
    lambda: tl.sparse_binary(_x(), _x(C + 1), "add"),
)
add(
    "sparse-binary-rhs-tensor",
    TypeError,
    r"sparse_binary: rhs must be a SparseTensor",
    lambda: tl.sparse_binary(_x(), _feats(), "add"),
)
add(
    "sparse-binary-fill-nan",
    ValueError,
    r"sparse_binary: lhs_fill must not be NaN",
    lambda: tl.sparse_binary(_x(), _x(), "add", lhs_fill=float("nan")),
)
add(
    "sparse-binary-fill-str",
    TypeError,
    r"sparse_binary: rhs_fill must be a float",
    lambda: tl.sparse_binary(_x(), _x(), "add", rhs_fill="1"),
)


# --------------------------------------------------------------------------------------
# Transposed and global pooling: pool_transpose3d, trilinear_upsample3d, global_pool
# --------------------------------------------------------------------------------------

add(
    "pool-transpose-input-tensor",
    TypeError,
    r"input must be a torch_lattice\.SparseTensor",
    lambda: F.pool_transpose3d(_feats(), 2),
)
add(
    "pool-transpose-kernel-zero",
    ValueError,
    r"kernel_size must be positive",
    lambda: F.pool_transpose3d(_strided()[1], 0),
)
add(
    "pool-transpose-target-tensor",
    TypeError,
    r"target must be a torch_lattice\.SparseTensor",
    lambda: F.pool_transpose3d(_strided()[1], 2, target=_feats()),
)
add(
    "pool-transpose-target-stride",
    ValueError,
    r"coordinates stride \(2, 2, 2\) must equal \(1, 1, 1\)",
    lambda: F.pool_transpose3d(_strided()[1], 2, target=_strided()[1]),
)
add(
    "pool-transpose-expand-int",
    TypeError,
    r"expand_coordinates must be a bool",
    lambda: F.pool_transpose3d(_strided()[1], 2, expand_coordinates=1),
)
add(
    "pool-transpose-fine-input",
    ValueError,
    r"input stride \(1, 1, 1\) must be divisible by the transpose stride \(2, 2, 2\)",
    lambda: F.pool_transpose3d(_x(), 2),
)
add(
    "trilinear-input-tensor",
    TypeError,
    r"input must be a torch_lattice\.SparseTensor",
    lambda: F.trilinear_upsample3d(_feats(), 2),
)
add(
    "trilinear-stride-zero",
    ValueError,
    r"stride must be positive",
    lambda: F.trilinear_upsample3d(_strided()[1], 0),
)
add(
    "trilinear-stride-str",
    TypeError,
    r"stride must be an int or a 3-tuple of ints",
    lambda: F.trilinear_upsample3d(_strided()[1], "2"),
)
add(
    "trilinear-target-coords-tensor",
    TypeError,
    r"target must be a torch_lattice\.SparseTensor",
    lambda: F.trilinear_upsample3d(_strided()[1], 2, target=_coords()),
)
add(
    "trilinear-fine-input",
    ValueError,
    r"input stride \(1, 1, 1\) must be divisible by the transpose stride",
    lambda: F.trilinear_upsample3d(_x(), 2),
)
add(
    "global-pool-input-tensor",
    TypeError,
    r"input must be a torch_lattice\.SparseTensor",
    lambda: F.global_pool(_feats()),
)
add(
    "global-pool-mode-unknown",
    ValueError,
    r"mode must be one of \('sum', 'avg', 'max'\), got 'median'",
    lambda: F.global_pool(_x(), mode="median"),
)
add(
    "global-pool-batch-size-too-small",
    ValueError,
    r"batch_size 1 is smaller than the input's batch count 2",
    lambda: F.global_pool(_x(), batch_size=1),
)
add(
    "global-pool-batch-size-float",
    TypeError,
    r"batch_size must be an int or None, got 2\.0",
    lambda: F.global_pool(_x(), batch_size=2.0),
)
add(
    "global-pool-batch-size-bool",
    TypeError,
    r"batch_size must be an int or None, got True",
    lambda: F.global_pool(_x(), batch_size=True),
)


# --------------------------------------------------------------------------------------
# MLX Lattice artifacts: save_lattice_model_artifact, load_lattice_program
# --------------------------------------------------------------------------------------


class _LayerNormHead(torch.nn.Module):
    """A model with a module the artifact contract has no op for."""

    def __init__(self) -> None:
        super().__init__()
        self.ln = torch.nn.LayerNorm(C)

    def forward(self, x: tl.SparseTensor) -> tl.SparseTensor:
        return x.replace(self.ln(x.feats))


def _export(tmp: Path, model: torch.nn.Module | None = None, **kw) -> Path:
    """Exports ``model`` (default: an eval-mode SubmConv3d) into ``tmp/art``."""
    out = tmp / "art"
    kw.setdefault("example_inputs", (_x(),))
    save_lattice_model_artifact(
        nn.SubmConv3d(C, C, 3).eval() if model is None else model, out, **kw
    )
    return out


def _edit_graph(tmp: Path, old: str, new: str) -> Path:
    art = _export(tmp)
    graph = art / "graph.mlir"
    text = graph.read_text()
    assert old in text
    graph.write_text(text.replace(old, new))
    return art


add_tmp(
    "export-model-none",
    TypeError,
    r"model must be a torch\.nn\.Module, got NoneType",
    lambda tmp: save_lattice_model_artifact(None, tmp / "art", example_inputs=(_x(),)),
)
add_tmp(
    "export-artifact-dir-none",
    TypeError,
    r"artifact_dir must be a path, got NoneType",
    lambda tmp: save_lattice_model_artifact(
        nn.SubmConv3d(C, C, 3).eval(), None, example_inputs=(_x(),)
    ),
)
add_tmp(
    "export-example-inputs-bare-tensor",
    TypeError,
    r"example_inputs must be a tuple or list",
    lambda tmp: _export(tmp, example_inputs=_x()),
)
add_tmp(
    "export-example-inputs-empty",
    ExportError,
    r"example_inputs must not be empty",
    lambda tmp: _export(tmp, example_inputs=()),
)
add_tmp(
    "export-example-input-str",
    ExportError,
    r"input 'x' must be a SparseTensor or a torch\.Tensor, got str",
    lambda tmp: _export(tmp, _LayerNormHead().eval(), example_inputs=("x",)),
)
add_tmp(
    "export-too-many-example-inputs",
    ExportError,
    r"example_inputs has 2 values but model\.forward takes 1 to 1 positional inputs",
    lambda tmp: _export(tmp, _LayerNormHead().eval(), example_inputs=(_x(), _x())),
)
add_tmp(
    "export-training-mode",
    ExportError,
    r"model must be in eval mode \(call model\.eval\(\)\); in training mode: SubmConv3d",
    lambda tmp: _export(tmp, nn.SubmConv3d(C, C, 3)),
)
add_tmp(
    "export-unsupported-module",
    ExportError,
    r"node 'ln' \(call_module ln\): module torch\.nn\.modules\.normalization\.LayerNorm is not",
    lambda tmp: _export(tmp, _LayerNormHead().eval()),
)
add_tmp(
    "export-float64",
    ExportError,
    r"input 'input' features has dtype torch\.float64, which an artifact cannot hold",
    lambda tmp: _export(
        tmp, nn.SubmConv3d(C, C, 3).double().eval(), example_inputs=(_x(dtype=torch.float64),)
    ),
)
add_tmp(
    "export-quantize-bits-3",
    ValueError,
    r"quantize_bits must be None, 4 or 8, got 3",
    lambda tmp: _export(tmp, quantize_bits=3),
)
add_tmp(
    "export-quantize-bits-str",
    TypeError,
    r"quantize_bits must be None, 4 or 8, got '4'",
    lambda tmp: _export(tmp, quantize_bits="4"),
)
add_tmp(
    "export-quantize-group-size",
    ValueError,
    r"quantize_group_size must be 32, 64 or 128 \(the group sizes MLX Lattice runs",
    lambda tmp: _export(tmp, quantize_bits=4, quantize_group_size=3),
)
add_tmp(
    "export-quantize-group-size-16",
    ValueError,
    r"quantize_group_size must be 32, 64 or 128 \(the group sizes MLX Lattice runs packed "
    r"weights with\), got 16",
    lambda tmp: _export(tmp, quantize_bits=8, quantize_group_size=16),
)
add_tmp(
    "export-output-names-count",
    ExportError,
    r"output_names must be 1 distinct names \(one per output\), got \['a', 'b'\]",
    lambda tmp: _export(tmp, output_names=["a", "b"]),
)
add_tmp(
    "export-output-names-str",
    TypeError,
    r"output_names must be a sequence of non-empty strings",
    lambda tmp: _export(tmp, output_names="a"),
)
add_tmp(
    "export-parent-missing",
    ExportError,
    r"artifact_dir's parent folder .* does not exist",
    lambda tmp: _export(tmp / "no"),
)
add_tmp(
    "export-destination-is-a-file",
    FileExistsError,
    r"artifact_dir .* exists and is not a directory",
    lambda tmp: _export((lambda p: (p.mkdir(), (p / "art").write_text("x"), p)[2])(tmp / "f")),
)
add_tmp(
    "load-artifact-dir-none",
    TypeError,
    r"artifact_dir must be a path, got NoneType",
    lambda tmp: load_lattice_program(None),
)
add_tmp(
    "load-missing-directory",
    ValueError,
    r"artifact_dir .* is not a directory",
    lambda tmp: load_lattice_program(tmp / "missing"),
)
add_tmp(
    "load-coordinates-unknown",
    ValueError,
    r"coordinates must be 'physical' or 'logical', got 'pixel'",
    lambda tmp: load_lattice_program(tmp, coordinates="pixel"),
)
add_tmp(
    "load-device-unknown",
    ValueError,
    r"device 'tpu' is not a torch device",
    lambda tmp: load_lattice_program(tmp, device="tpu"),
)
add_tmp(
    "load-device-float",
    TypeError,
    r"device must be a str, torch\.device or None, got 3\.5",
    lambda tmp: load_lattice_program(tmp, device=3.5),
)
add_tmp(
    "load-empty-directory",
    ValueError,
    r"artifact_dir must hold exactly graph\.mlir and weights\.safetensors",
    lambda tmp: load_lattice_program(tmp),
)
add_tmp(
    "load-extra-file",
    ValueError,
    r"artifact_dir must hold exactly graph\.mlir and weights\.safetensors",
    lambda tmp: load_lattice_program(
        (lambda art: ((art / "notes.txt").write_text("x"), art)[1])(_export(tmp))
    ),
)
add_tmp(
    "load-other-ir-version",
    ValueError,
    r"ir_version",
    lambda tmp: load_lattice_program(
        _edit_graph(tmp, "lattice.ir_version = 2,", "lattice.ir_version = 3,")
    ),
)
add_tmp(
    "load-unknown-op",
    MlirSyntaxError,
    r"graph\.mlir line \d+.*lattice\.subm_conv4d",
    lambda tmp: load_lattice_program(
        _edit_graph(tmp, "lattice.subm_conv3d ", "lattice.subm_conv4d ")
    ),
)


# --------------------------------------------------------------------------------------
# Issue 21: sizes computed from small inputs, integers, owned coordinates, files.  One
# entry per hostile case; the scenario tests with their after-checks (nothing written,
# nothing listed, memory flat) are test_memory_budget.py, test_transpose_pairs.py,
# test_int_limits.py, test_tensor_ownership.py, test_migration_hostile.py,
# test_replay_hostile.py and test_artifact_writing.py.
# --------------------------------------------------------------------------------------

GIB = 2**30


def _within_budget(fn: Callable[[], object], nbytes: int = GIB) -> Callable[[], object]:
    """``fn`` run under a fixed memory budget (the default depends on the machine)."""

    def run() -> object:
        previous = tl.set_memory_budget(nbytes)
        try:
            return fn()
        finally:
            tl.set_memory_budget(previous)

    return run


def _rows(n: int, stride: int = 1, batch: int = 0) -> tl.SparseTensor:
    """``n`` rows along x in one batch, one channel."""
    coords = torch.zeros(n, 4, dtype=torch.int32)
    coords[:, 0] = batch
    coords[:, 1] = torch.arange(n, dtype=torch.int32)
    return tl.SparseTensor(torch.ones(n, 1), coords, stride=stride)


BUDGET = r"would allocate \d+ bytes .* beyond the memory budget of 1073741824 bytes"
add(
    "budget-global-pool-last-batch-index",
    MemoryBudgetError,
    r"global_pool of 2147483648 batches .*" + BUDGET,
    _within_budget(lambda: F.global_pool(_rows(1, batch=2**31 - 1), "sum")),
)
add(
    "budget-dense-2-50-cells",
    MemoryBudgetError,
    r"dense\(\) of spatial_range \(1, 131072, 131072, 65536\) .*" + BUDGET,
    _within_budget(lambda: ST(torch.ones(1, 1), torch.zeros(1, 4, dtype=torch.int32),
                              spatial_range=(1, 2**17, 2**17, 2**16)).dense()),
)
add(
    "budget-trilinear-stride-645",
    MemoryBudgetError,
    r"trilinear_upsample3d without a target \(1 rows x 2141700569 kernel positions.*" + BUDGET,
    _within_budget(lambda: F.trilinear_upsample3d(_rows(1, stride=645), 645)),
)
add(
    "budget-generative-32-cubed-1000-rows",
    MemoryBudgetError,
    r"transposed pair lists \(1000 source rows x 32768 kernel rows.*" + BUDGET,
    _within_budget(lambda: F.generative_conv_transpose3d(
        _rows(1000, stride=32), torch.ones(32**3, 1, 1), None, 32, 32)),
)
add(
    "budget-pool-transpose-32-cubed-1000-rows",
    MemoryBudgetError,
    r"pool_transpose3d without a target \(1000 rows x 32768 kernel positions.*" + BUDGET,
    _within_budget(lambda: F.pool_transpose3d(_rows(1000, stride=32), 32, 32,
                                              expand_coordinates=True)),
)


def _expanded(n: int, channels: int, x0: int = 0) -> tl.SparseTensor:
    """``n`` rows along x from ``x0``, ``channels`` features expanded from one number."""
    coords = torch.zeros(n, 4, dtype=torch.int32)
    coords[:, 1] = torch.arange(x0, x0 + n, dtype=torch.int32)
    return ST(torch.ones(1, 1).expand(n, channels), coords)


# sparse_binary's output on one support (and a + b, the same sum) was made without a
# check: 2 rows of features expanded to 2^28 channels asked for 2 GiB
add(
    "budget-sparse-binary-same-support-expanded",
    MemoryBudgetError,
    r"sparse_binary output \(2 rows x 268435456 channels\) .*" + BUDGET,
    _within_budget(lambda: (lambda x: tl.sparse_binary(x, x, "mul"))(_expanded(2, 2**28))),
)
add(
    "budget-sparse-binary-join-expanded",
    MemoryBudgetError,
    r"sparse_binary output \(3 rows x 134217728 channels\) .*" + BUDGET,
    _within_budget(lambda: tl.sparse_binary(_expanded(2, 2**27), _expanded(2, 2**27, 1),
                                            "add", join="outer")),
)
add(
    "budget-add-expanded",
    MemoryBudgetError,
    r"add output \(2 rows x 268435456 channels\) .*" + BUDGET,
    _within_budget(lambda: (lambda x: x + x)(_expanded(2, 2**28))),
)
# voxelize's per-point temporaries (voxel rows, unique rows, inverse, hash slots) and the
# copies of strided inputs were made unchecked: 24 bytes of expanded points asked for 3 GiB
add(
    "budget-voxelize-expanded-points",
    MemoryBudgetError,
    r"voxelizing 33554432 points .*" + BUDGET,
    _within_budget(lambda: tl.voxelize(torch.zeros(1, 3).expand(2**25, 3),
                                       torch.zeros(1, 1).expand(2**25, 1))),
)
# collate concatenated its clouds (expanded views too) and made an int64 batch index per
# point before anything was checked: two clouds of 2^28 expanded rows asked for 10 GiB
add(
    "budget-collate-expanded-clouds",
    MemoryBudgetError,
    r"collate of 2 clouds \(131072 points x 1 channels: .* would allocate 3145728 bytes "
    r".* beyond the memory budget of 1048576 bytes",
    _within_budget(lambda: tl.collate([torch.zeros(1, 3).expand(2**16, 3)] * 2,
                                      [torch.zeros(1, 1).expand(2**16, 1)] * 2), 2**20),
)
add(
    "budget-voxelize-widening-half-points",
    MemoryBudgetError,
    r"widening 134217728 torch.float16 points to float32 .*" + BUDGET,
    _within_budget(lambda: tl.voxelize(torch.zeros(1, 3, dtype=torch.half).expand(2**27, 3),
                                       torch.zeros(1, 1).expand(2**27, 1))),
)
add(
    "budget-voxelize-widening-half-features",
    MemoryBudgetError,
    r"voxelize: widening \(1000, 1048576\) torch.float16 features .*" + BUDGET,
    _within_budget(lambda: tl.voxelize(torch.rand(1000, 3),
                                       torch.zeros(1, 1, dtype=torch.half).expand(1000, 2**20))),
)
add(
    "budget-voxel-reduce-expanded-features",
    MemoryBudgetError,
    r"voxel reduction \(1 voxels x 1024 channels, sum\) .*" + BUDGET,
    _within_budget(lambda: torch.ops.lattice.voxel_reduce(
        torch.zeros(1, 1).expand(2**20, 2**10), torch.zeros(2**20, dtype=torch.int64), 1, "sum")),
)
# devoxelize's map, 16 bytes per point and corner, was made unchecked: 2^25 expanded
# points asked for 4 GiB of trilinear rows and weights
add(
    "budget-devoxelize-trilinear-expanded-points",
    MemoryBudgetError,
    r"devoxelization map \(33554432 points x 8 voxels\) .*" + BUDGET,
    _within_budget(lambda: tl.devoxelize(
        torch.full((1, 3), 0.5).expand(2**25, 3),
        tl.voxelize(torch.rand(10, 3) * 4, torch.ones(10, 1)), interpolation="trilinear")),
)
add(
    "budget-devoxel-gather-expanded-rows",
    MemoryBudgetError,
    r"devoxel gather output \(268435456 points x 2 channels\) .*" + BUDGET,
    _within_budget(lambda: torch.ops.lattice.devoxel_gather(
        torch.ones(3, 2), torch.zeros(1, 1, dtype=torch.int64).expand(2**28, 1),
        torch.ones(1, 1, dtype=torch.float64).expand(2**28, 1))),
)
# the synthetic scenes: an extent of 1e18 hung (a 40 m step no longer moved x), and their
# rays, points and columns were made unchecked
add("data-lidar-extent-1e18", ValueError, r"extent: must be a number in \(0, 10000\]",
    lambda: data.lidar_scan(extent=1e18, num_beams=2, points_per_beam=4))
add("data-room-size-1e300", ValueError, r"size\[x\]: must be a number in \(0, 10000\]",
    lambda: data.indoor_room(size=(1e300, 1.0, 1.0), points=10))
add("data-seed-2-64", ValueError, r"seed: must be in \[0, 2\^64\)",
    lambda: data.height_field(side=2, seed=2**64))
add("budget-data-lidar-rays", MemoryBudgetError, r"lidar_scan of 64 x 2097152 rays .*" + BUDGET,
    _within_budget(lambda: data.lidar_scan(num_beams=64, points_per_beam=2**21)))
add("budget-data-room-points", MemoryBudgetError, r"indoor_room of 60000000 points .*" + BUDGET,
    _within_budget(lambda: data.indoor_room(points=60_000_000)))
add("budget-data-height-field", MemoryBudgetError,
    r"height_field of 10000 x 10000 columns .*" + BUDGET,
    _within_budget(lambda: data.height_field(side=10_000)))
# the ops copied strided operands (features, tables, pairs, gradients) to contiguous ones
# unchecked: 4 bytes of expanded features or tables asked for gigabytes
add(
    "budget-subm-conv-expanded-features",
    MemoryBudgetError,
    r"lattice::sparse_conv: contiguous copies of strided feats \(200, 2097152\) .*" + BUDGET,
    _within_budget(lambda: nn.SubmConv3d(2**21, 1, 1)(_expanded(200, 2**21))),
)
add(
    "budget-max-pool-expanded-features",
    MemoryBudgetError,
    r"lattice::pool_max: contiguous copies of strided feats \(200, 2097152\) .*" + BUDGET,
    _within_budget(lambda: nn.MaxPool3d((8, 1, 1), (8, 1, 1))(_expanded(200, 2**21))),
)
add(
    "budget-batch-norm-expanded-features",
    MemoryBudgetError,
    r"lattice::batch_norm_stats: contiguous copies of strided x \(200, 2097152\) .*" + BUDGET,
    _within_budget(lambda: nn.BatchNorm(2**21)(_expanded(200, 2**21))),
)
add(
    "budget-sparse-conv-expanded-table",
    MemoryBudgetError,
    r"lattice::sparse_conv: contiguous copies of strided nbr \(268435456, 4\) .*" + BUDGET,
    _within_budget(lambda: torch.ops.lattice.sparse_conv(
        torch.ones(1, 1), torch.ones(4, 1, 1),
        torch.full((1, 1), -1, dtype=torch.int32).expand(2**28, 4),
        torch.full((1, 4), -1, dtype=torch.int32))),
)
add(
    "budget-kernel-pairs-expanded-table",
    MemoryBudgetError,
    r"lattice::kernel_pairs: contiguous copies of strided nbr \(2147483648, 1\) .*" + BUDGET,
    _within_budget(lambda: torch.ops.lattice.kernel_pairs(
        torch.full((1, 1), -1, dtype=torch.int32).expand(2**31, 1))),
)
add(
    "budget-pair-conv-expanded-pairs",
    MemoryBudgetError,
    r"lattice::pair_conv: contiguous copies of strided pair_in \(268435456,\), "
    r"pair_out \(268435456,\) .*" + BUDGET,
    _within_budget(lambda: torch.ops.lattice.pair_conv(
        torch.ones(1, 1), torch.ones(1, 1, 1), torch.tensor([0, 2**28]),
        torch.zeros(1, dtype=torch.int32).expand(2**28),
        torch.zeros(1, dtype=torch.int32).expand(2**28), None, None, None, 1, False)),
)
# tl.cat and sparse_cat concatenated expanded features unchecked (2 GiB asked here)
add(
    "budget-cat-expanded",
    MemoryBudgetError,
    r"cat output \(2 rows x 268435456 channels\) .*" + BUDGET,
    _within_budget(lambda: (lambda x: tl.cat([x, x]))(_expanded(2, 2**27))),
)
add(
    "budget-sparse-cat-same-support-expanded",
    MemoryBudgetError,
    r"sparse_cat output \(2 rows x 268435456 channels\) .*" + BUDGET,
    _within_budget(lambda: (lambda x: tl.sparse_cat([x, x]))(_expanded(2, 2**27))),
)
add(
    "budget-sparse-cat-join-expanded",
    MemoryBudgetError,
    r"sparse_cat output \(3 rows x 268435456 channels\) .*" + BUDGET,
    _within_budget(lambda: tl.sparse_cat([_expanded(2, 2**27), _expanded(2, 2**27, 1)],
                                         join="outer")),
)
add(
    "int-generative-coordinate-beyond-int32",
    ValueError,
    r"maps coordinate 1073741824 on axis x to 2147483649, beyond the int32 limit",
    lambda: F.generative_conv_transpose3d(
        ST(torch.ones(1, 1), torch.tensor([[0, 2**30, 0, 0]], dtype=torch.int32), stride=2),
        torch.ones(8, 1, 1), None, 2, 2),
)
add(
    "int-transpose-stride-2-31-minus-1",
    ValueError,
    r"to 4294967294, beyond the int32 limit",
    lambda: F.generative_conv_transpose3d(
        ST(torch.ones(1, 1), torch.tensor([[0, 2, 0, 0]], dtype=torch.int32),
           stride=(2**31 - 1, 1, 1)),
        torch.ones(1, 1, 1), None, 1, (2**31 - 1, 1, 1)),
)
add(
    "int-total-stride-beyond-int32",
    ValueError,
    r"total stride \(4294967296, 4294967296, 4294967296\) .* beyond the int32 limit",
    lambda: F.conv3d(_rows(1, stride=2**16), torch.ones(1, 1, 1), None, 1, 2**16),
)
add(
    "int-pool-transpose-coordinate-beyond-int32",
    ValueError,
    r"pool_transpose3d without a target generates coordinate 2147483649, beyond the int32",
    lambda: F.pool_transpose3d(
        ST(torch.ones(1, 1), torch.tensor([[0, 2**30, 0, 0]], dtype=torch.int32), stride=2),
        2, 2, expand_coordinates=True),
)
add(
    "int-voxel-size-zero-in-float32",
    ValueError,
    r"voxel_size must be a positive finite float32 .*got \[1e-50, 1e-50, 1e-50\]",
    lambda: tl.voxelize(_points(), torch.randn(20, C), voxel_size=1e-50),
)
add(
    "tensor-coords-expanded-view",
    ValueError,
    r"coords rows must be unique, row 1 repeats .*expanded view with row stride 0",
    lambda: ST(torch.ones(2**20, 1).expand(2**20, 1),
               torch.zeros(1, 4, dtype=torch.int32).expand(2**20, 4)),
)
add(
    "tensor-stored-coords-edited-in-place",
    ValueError,
    r"coords of this SparseTensor were modified in place after it was built",
    lambda: (lambda x: (x.coords.__setitem__((0, 1), 3), nn.SubmConv3d(1, 1, 3)(x)))(_rows(5)),
)


def _migration_inputs(tmp: Path) -> tuple[Path, Path]:
    """A legacy checkpoint and its kernel spec in ``tmp``."""
    return _save(tmp, {**_legacy_state(), "bn.weight": torch.ones(4)}), _spec(tmp, SPEC)


def _corrupt_crc(tmp: Path) -> Path:
    """The checkpoint with one stored byte of bn.weight changed: only the CRC can tell."""
    src, _ = _migration_inputs(tmp)
    raw = bytearray(src.read_bytes())
    at = bytes(raw).index(torch.ones(4).numpy().tobytes())
    raw[at + 3] ^= 0x7F
    src.write_bytes(bytes(raw))
    return src


def _duplicate_pickle(tmp: Path) -> Path:
    """The checkpoint's zip with its data.pkl entry written twice."""
    import warnings
    import zipfile

    src, _ = _migration_inputs(tmp)
    with zipfile.ZipFile(src) as archive:
        entries = [(info, archive.read(info)) for info in archive.infolist()]
    pickle_entry = next(e for e in entries if e[0].filename.endswith("data.pkl"))
    dup = tmp / "dup.pt"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zipfile warns about the duplicate name
        with zipfile.ZipFile(dup, "w", zipfile.ZIP_STORED) as archive:
            for info, data in [*entries, pickle_entry]:
                archive.writestr(info, data)
    return dup


add_tmp(
    "migrate-output-is-kernel-spec-even-with-force",
    CE,
    r"output .*spec\.json' would overwrite the kernel spec .*\(not even with --force\)",
    lambda tmp: migration.convert_checkpoint(
        *(lambda src, spec: (src, spec, spec))(*_migration_inputs(tmp)), force=True),
)
add_tmp(
    "migrate-manifest-is-kernel-spec",
    CE,
    r"output .*spec\.json' would overwrite the kernel spec",
    lambda tmp: (lambda src, spec: migration.convert_checkpoint(
        src, tmp / "out.safetensors", spec, manifest=spec, force=True))(*_migration_inputs(tmp)),
)
add_tmp(
    "migrate-output-is-source",
    CE,
    r"output .*legacy\.pt' would overwrite the source checkpoint",
    lambda tmp: (lambda src, spec: migration.convert_checkpoint(src, src, spec, force=True))(
        *_migration_inputs(tmp)),
)
add_tmp(
    "migrate-expanded-tensor-2-31",
    CE,
    r"'bomb' of shape \(2147483648,\) is an expanded view \(strides \(0,\)\)",
    lambda tmp: migration.convert_checkpoint(
        _save(tmp, {**_legacy_state(), "bomb": torch.zeros(1).expand(2**31)}),
        tmp / "out.safetensors", _spec(tmp, SPEC)),
)
add_tmp(
    "migrate-bad-crc",
    CE,
    r"corrupted archive: entry '.*' fails its CRC check",
    lambda tmp: migration.convert_checkpoint(_corrupt_crc(tmp), tmp / "out.safetensors",
                                             _spec(tmp, SPEC)),
)
add_tmp(
    "migrate-duplicate-entry",
    CE,
    r"corrupted archive: entry '.*data\.pkl' appears twice",
    lambda tmp: migration.convert_checkpoint(_duplicate_pickle(tmp), tmp / "out.safetensors",
                                             _spec(tmp, SPEC)),
)
add_tmp(
    "export-quantize-group-size-2-62",
    ValueError,
    r"quantize_group_size must be 32, 64 or 128 .*got 4611686018427387904",
    lambda tmp: _export(tmp, quantize_bits=4, quantize_group_size=2**62),
)
add_tmp(
    "export-output-name-newline",
    ExportError,
    r"output_names entry 'out\\nx' holds the control character '\\n'",
    lambda tmp: _export(tmp, output_names=["out\nx"]),
)


def _user_folder(tmp: Path) -> Path:
    """A folder holding graph.mlir and a sub-folder named weights.safetensors."""
    folder = tmp / "art"
    (folder / "weights.safetensors").mkdir(parents=True)
    (folder / "graph.mlir").write_text("mine")
    (folder / "weights.safetensors" / "notes.txt").write_text("mine")
    return folder


add_tmp(
    "export-over-a-user-folder",
    FileExistsError,
    r"artifact_dir .* exists and is not an artifact .*refusing to replace it",
    lambda tmp: (_user_folder(tmp), _export(tmp)),
)
add(
    "replay-case-name-parent",
    ValueError,
    r"case name '\.\./private' must be a plain folder name inside the fixture folder",
    lambda: replay_cli.check_case_name("../private", Path("manifest.json")),
)
add(
    "replay-case-name-absolute",
    ValueError,
    r"case name '/etc' must be a plain folder name",
    lambda: replay_cli.check_case_name("/etc", Path("manifest.json")),
)


def _fifo(tmp: Path) -> Path:
    import os

    path = tmp / "inputs.safetensors"
    os.mkfifo(path)
    return path


add_tmp(
    "replay-fifo-input",
    ValueError,
    r"inputs .*inputs\.safetensors' is a FIFO",
    lambda tmp: read_regular_file(_fifo(tmp), "inputs"),
)


# --------------------------------------------------------------------------------------
# Found by a later probe (each raised AttributeError / OverflowError / a C or torch error,
# or was accepted, before its fix)
# --------------------------------------------------------------------------------------

add(
    "from-support-feats-list",
    TypeError,
    r"feats must be a torch\.Tensor, got list",
    lambda: ST.from_support([[1.0]], _x().support),  # type: ignore[arg-type]
)
add(
    "from-support-feats-int",
    TypeError,
    r"feats must be a floating tensor",
    lambda: (lambda x: ST.from_support(x.feats.long(), x.support))(_x()),
)
add(
    "from-support-feats-1d",
    ValueError,
    r"feats must have shape \(N, C\)",
    lambda: (lambda x: ST.from_support(x.feats[:, 0], x.support))(_x()),
)
add(
    "from-support-feats-rows",
    ValueError,
    r"feats must have one row per coordinate: 1 rows for \d+ coords",
    lambda: (lambda x: ST.from_support(x.feats[:1], x.support))(_x()),
)
add(
    "from-support-none",
    TypeError,
    r"support must be a torch_lattice Support .*got NoneType",
    lambda: ST.from_support(_x().feats, None),  # type: ignore[arg-type]
)
add(
    "from-support-coords",
    TypeError,
    r"support must be a torch_lattice Support .*got Tensor",
    lambda: (lambda x: ST.from_support(x.feats, x.coords))(_x()),  # type: ignore[arg-type]
)


# reindex_sparse onto another support gathered the input's features unchecked
add(
    "budget-reindex-sparse-expanded",
    MemoryBudgetError,
    r"reindex_sparse output \(2 rows x 268435456 channels\) .*" + BUDGET,
    _within_budget(lambda: tl.reindex_sparse(_expanded(2, 2**28), _expanded(2, 1, x0=1))),
)


# an expanded weight (or bias) was made contiguous unchecked
add(
    "budget-conv-weight-expanded",
    MemoryBudgetError,
    r"contiguous copy of weight \(27, 1, 16777216\) " + BUDGET,
    _within_budget(
        lambda: F.subm_conv3d(_expanded(2, 1), torch.ones(1, 1, 1).expand(27, 1, 2**24))
    ),
)
add(
    "budget-conv-bias-expanded",
    MemoryBudgetError,
    r"contiguous copy of bias \(262144,\) would allocate 1048576 bytes .* beyond the memory "
    r"budget of 524288 bytes",
    _within_budget(
        lambda: F.conv3d(
            _expanded(2, 1), torch.zeros(1, 1, 2**18), torch.ones(1).expand(2**18), kernel_size=1
        ),
        2**19,
    ),
)


# F.batch_norm: arguments of the wrong type, non-floating input, a NaN momentum, a
# buffer on another device
for _rm_name, _rm in (("SparseTensor", None), ("list", [0.0] * C)):
    add(
        f"batch-norm-running-mean-{_rm_name}",
        TypeError,
        rf"batch_norm: running_mean must be a torch\.Tensor or None, got {_rm_name}",
        lambda _rm=_rm: F.batch_norm(
            _feats(), _x() if _rm is None else _rm, torch.ones(C), training=True
        ),
    )
for _dt in (torch.int64, torch.complex64):
    add(
        f"batch-norm-input-{str(_dt).split('.')[1]}",
        TypeError,
        rf"batch_norm: input must be a floating tensor, got {_dt}",
        lambda _dt=_dt: F.batch_norm(torch.ones(5, C, dtype=_dt), None, None, training=True),
    )
for _m in (float("nan"), -0.5, 1.5, float("inf")):
    add(
        f"batch-norm-momentum-{_m}",
        ValueError,
        r"batch_norm: momentum must be a number in \[0, 1\], got " + str(_m),
        lambda _m=_m: F.batch_norm(
            _feats(), torch.zeros(C), torch.ones(C), training=True, momentum=_m
        ),
    )
for _n in (8, 2**18):  # torch's path and the C passes
    add(
        f"batch-norm-running-mean-meta-{_n}",
        ValueError,
        r"batch_norm: running_mean must be on input's device \(cpu\), got meta",
        lambda _n=_n: F.batch_norm(
            torch.randn(_n, 1), torch.zeros(1, device="meta"), torch.ones(1), training=True
        ),
    )


# fold_batch_norm of a non-module; of a batch norm the model itself refuses to run; a
# BatchNorm of a negative width
add(
    "fold-batch-norm-none",
    TypeError,
    r"fold_batch_norm: model must be a torch\.nn\.Module, got NoneType",
    lambda: tl.nn.fold_batch_norm(None),  # type: ignore[arg-type]
)
add(
    "fold-batch-norm-sparse-tensor",
    TypeError,
    r"fold_batch_norm: model must be a torch\.nn\.Module, got SparseTensor",
    lambda: tl.nn.fold_batch_norm(_x()),  # type: ignore[arg-type]
)
add(
    "fold-batch-norm-negative-eps",
    ValueError,
    r"fold_batch_norm: batch norm '1' has eps=-2\.0; eps must be a non-negative number",
    lambda: tl.nn.fold_batch_norm(
        torch.nn.Sequential(tl.nn.SubmConv3d(C, C, 3), tl.nn.BatchNorm(C, eps=-2.0)).eval()
    ),
)
for _nf in (-1, 0):
    add(
        f"batch-norm-num-features-{_nf}",
        ValueError,
        rf"num_features must be a positive int, got {_nf}",
        lambda _nf=_nf: tl.nn.BatchNorm(_nf),
    )


# Python ints beyond the float range (OverflowError naming nothing before)
for _arg, _value in (("voxel_size", 10**400), ("origin", -(10**400))):
    add(
        f"voxelize-{_arg}-beyond-float",
        ValueError,
        rf"{_arg} must be finite.* in every axis, got \[-?inf, -?inf, -?inf\]",
        lambda _arg=_arg, _value=_value: tl.voxelize(_points(), _feats(20), **{_arg: _value}),
    )
add(
    "sparse-binary-fill-beyond-float",
    ValueError,
    r"sparse_binary: lhs_fill must be within the float range .*got an int of 1329 bits",
    lambda: tl.sparse_binary(_x(), _x(), "add", lhs_fill=10**400),
)
add(
    "reindex-sparse-fill-beyond-float",
    ValueError,
    r"reindex_sparse: fill must be within the float range",
    lambda: tl.reindex_sparse(_x(), _x(), fill=10**400),
)
add(
    "unet-width-inf",
    ValueError,
    r"width must be a positive finite number, got inf",
    lambda: tl.backbones.SparseResUNet42(3, 4, width=float("inf")),
)


# F.normalized with a conv that returns something else
for _k in (27, 1):  # the weight-normalized and the pointwise paths
    add(
        f"normalized-conv-result-tensor-k{_k}",
        TypeError,
        r"conv's result must be a torch_lattice\.SparseTensor .*got Tensor",
        lambda _k=_k: F.normalized(lambda x, w: x.feats, _x(), _w(_k), None, 1e-8),
    )
add(
    "normalized-input-tensor",
    TypeError,
    r"input must be a torch_lattice\.SparseTensor, got Tensor",
    lambda: F.normalized(lambda x, w: _x(), _feats(), _w(), None, 1e-8),  # type: ignore[arg-type]
)


# the voxel kernels' index rules, named (a bare "invalid argument" before)
add(
    "voxel-reduce-inverse-out-of-range",
    ValueError,
    r"voxel_reduce: invalid argument.*every inverse entry must be a voxel row in "
    r"\[0, num_voxels\)",
    lambda: torch.ops.lattice.voxel_reduce(
        torch.ones(3, 2), torch.tensor([0, 1, 5]), 2, "mean"
    ),
)
add(
    "devoxel-gather-idx-out-of-range",
    ValueError,
    r"voxel_gather: invalid argument.*every idx entry must be -1 \(no voxel\) or a voxel "
    r"row in \[0, M\)",
    lambda: torch.ops.lattice.devoxel_gather(
        torch.ones(2, 3), torch.tensor([[0], [7]]), torch.ones(2, 1, dtype=torch.float64)
    ),
)


# tl.cat and a + b on equal rows with another spatial_range kept the first one silently
for _op, _fn in (("cat", lambda a, b: tl.cat([a, b])), ("add", lambda a, b: a + b)):
    add(
        f"{_op}-different-spatial-range",
        ValueError,
        rf"{_op}: argument 1 has spatial_range \(2, 8, 8, 8\) but argument 0 \(2, 6, 6, 6\); "
        r"tensors on equal rows must have the same spatial_range",
        lambda _fn=_fn: (lambda a: _fn(a, ST(a.feats, a.coords, spatial_range=(2, 8, 8, 8))))(
            _x(spatial_range=(2, 6, 6, 6))
        ),
    )


# Meta tensors (a shape, no values) as sizes: torch's "Tensor.item() cannot be called on
# meta tensors" or "Cannot copy out of meta tensor" named no argument
_META = "must have values, got a meta tensor"


def _meta(*shape: int, dtype: torch.dtype = torch.int64) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype, device="meta")


add("tensor-range-meta", TypeError, rf"spatial_range {_META} of shape \(4,\)",
    lambda: _x(spatial_range=_meta(4)))
add("tensor-range-meta-scalar", TypeError, rf"spatial_range {_META} of shape \(\)",
    lambda: _x(spatial_range=_meta()))
add("tensor-stride-meta", TypeError, rf"stride {_META}", lambda: _x(stride=_meta()))
add("conv-kernel-meta", TypeError, rf"kernel_size {_META}", lambda: nn.Conv3d(C, C, _meta()))
add("conv-kernel-meta-items", TypeError, rf"kernel_size {_META}",
    lambda: nn.SubmConv3d(C, C, (_meta(), 3, 3)))
for _arg in ("stride", "padding", "dilation"):
    add(f"conv-{_arg}-meta", TypeError, rf"{_arg} {_META}",
        lambda _arg=_arg: nn.Conv3d(C, C, 3, **{_arg: _meta()}))
add("functional-conv-kernel-meta", TypeError, rf"kernel_size {_META}",
    lambda: F.conv3d(_x(), _w(), kernel_size=_meta()))
add("maxpool-kernel-meta", TypeError, rf"kernel_size {_META}", lambda: nn.MaxPool3d(_meta()))
for _arg in ("voxel_size", "origin"):
    for _shape in ((), (3,)):
        add(f"voxelize-{_arg}-meta-{len(_shape)}d", TypeError,
            rf"{_arg} {_META} of shape \({_shape[0]},\)" if _shape else rf"{_arg} {_META}",
            lambda _arg=_arg, _shape=_shape: tl.voxelize(
                _points(), torch.randn(20, C), **{_arg: _meta(*_shape, dtype=torch.float32)}))
add("devoxelize-voxel-size-meta", TypeError, rf"voxel_size {_META}",
    lambda: tl.devoxelize(_points(), tl.voxelize(_points(), torch.randn(20, C)),
                          voxel_size=_meta(3, dtype=torch.float32)))
add("collate-voxel-size-meta", TypeError, rf"voxel_size {_META}",
    lambda: tl.collate([_points()], [torch.randn(20, C)],
                       voxel_size=_meta(3, dtype=torch.float32)))
# (a meta cloud 0 reached torch.repeat_interleave: "cannot repeat_interleave a meta tensor")
add("collate-points-meta", ValueError,
    r"collate: points\[0\] must be on the CPU or a CUDA device, got meta",
    lambda: tl.collate([_points().to("meta")], [torch.randn(20, C).to("meta")]))

# bytes are a sequence of ints to Python: b"\x02\x08\x08\x08" was read as (2, 8, 8, 8)
_BYTES: tuple[type, ...] = (bytes, bytearray)
for _kind in _BYTES:
    _name = _kind.__name__
    add(f"tensor-range-{_name}", TypeError,
        rf"spatial_range must be None, an int or a sequence \(B, X, Y, Z\) of ints, got {_name}",
        lambda _kind=_kind: _x(spatial_range=_kind(b"\x02\x08\x08\x08")))
    add(f"tensor-stride-{_name}", TypeError, r"stride must be an int or a 3-tuple of ints",
        lambda _kind=_kind: _x(stride=_kind(b"\x01\x01\x01")))
    add(f"conv-kernel-{_name}", TypeError, r"kernel_size must be an int or a 3-tuple of ints",
        lambda _kind=_kind: nn.Conv3d(C, C, _kind(b"\x03\x03\x03")))
    add(f"functional-conv-dilation-{_name}", TypeError,
        r"dilation must be an int or a 3-tuple of ints",
        lambda _kind=_kind: F.conv3d(_x(), _w(), dilation=_kind(b"\x01\x01\x01")))
    add(f"voxelize-voxel-size-{_name}", TypeError,
        rf"voxel_size must be a number or 3 numbers \(x, y, z\), got {_name}",
        lambda _kind=_kind: tl.voxelize(_points(), torch.randn(20, C),
                                        voxel_size=_kind(b"\x01\x01\x01")))
    add(f"legacy-kernel-{_name}", TypeError, r"kernel_size must be an int or 3 ints",
        lambda _kind=_kind: migration.legacy_strided_support(
            _coords(), kernel_size=_kind(b"\x02\x02\x02"), stride=2, version="2.1"))
add("conv-kernel-string", TypeError, r"kernel_size must be an int or a 3-tuple of ints",
    lambda: nn.Conv3d(C, C, "333"))

# x.cuda(device) passed any device to to(): cuda("cpu") stayed on the CPU, cuda(1.5) made
# float64 features (torch.Tensor.cuda raises for both)
for _dev in ("cpu", torch.device("cpu"), "meta"):
    add(f"tensor-cuda-{_dev}-{type(_dev).__name__}", RuntimeError,
        rf"cuda: device must be a CUDA device, got {_dev}", lambda _dev=_dev: _x().cuda(_dev))
for _dev in (1.5, True, torch.float64):
    add(f"tensor-cuda-{_dev}", TypeError,
        r"cuda: device must be None, an int, a str or a torch\.device, got "
        + type(_dev).__name__, lambda _dev=_dev: _x().cuda(_dev))
add("tensor-cuda-negative", RuntimeError, r"cuda: device -1 is not a device: .*negative",
    lambda: _x().cuda(-1))


# --------------------------------------------------------------------------------------
# The catalogue
# --------------------------------------------------------------------------------------


def test_catalogue_ids_are_unique() -> None:
    ids = [c.id for c in CASES]
    assert len(ids) == len(set(ids)), [i for i in ids if ids.count(i) > 1]


# The public lists whose every entry point must have a bad-input case here.
PUBLIC = (tl, tl.nn, F)
# Public callables a user does not call with arguments of their own, and why.
NO_CASE = {
    "torch_lattice.CoordinateManager": "made by SparseTensor; its fields are its caches",
}


def _takes_arguments(obj: object) -> bool:
    """Whether a caller can pass ``obj`` anything (a class: its constructor)."""
    try:
        params = inspect.signature(obj).parameters.values()  # type: ignore[arg-type]
    except ValueError:  # no signature to read: assume it takes arguments
        return True
    return bool(params)


def _entry_points() -> dict[str, object]:
    """Every callable of the public lists that takes arguments, by qualified name.

    Left out: submodules (their own ``__all__`` is listed), data, and functions of
    no arguments (``get_global_conv_config``): there is nothing to pass them badly.
    """
    entries: dict[str, object] = {}
    for package in PUBLIC:
        for name in package.__all__:
            obj = getattr(package, name)
            if inspect.ismodule(obj) or not callable(obj) or not _takes_arguments(obj):
                continue
            entries.setdefault(f"{package.__name__}.{name}", obj)
    return entries


def _names_used(code: CodeType) -> set[str]:
    """Global and attribute names a case's code (and the lambdas inside it) uses."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, CodeType):
            names |= _names_used(const)
    return names


def _function_names(fn: object) -> set[str]:
    """_names_used of a function and of the functions it closes over: add() and
    _within_budget() wrap the case's own lambda."""
    code = getattr(fn, "__code__", None)
    if not isinstance(code, CodeType):
        return set()
    used = _names_used(code)
    for cell in getattr(fn, "__closure__", None) or ():
        used |= _function_names(cell.cell_contents)
    return used


def _calls(case: Case, name: str, obj: object) -> bool:
    """Whether the case's own code names the entry point, as ``pkg.name`` or through an
    alias of this file (``ST = tl.SparseTensor``)."""
    used = _function_names(case.fn)
    return name in used or any(globals().get(u) is obj for u in used)


def test_catalogue_covers_every_public_entry_point() -> None:
    entries = _entry_points()
    assert len(entries) > 40, sorted(entries)  # the lists were read, not found empty
    assert set(NO_CASE) <= set(entries), set(NO_CASE) - set(entries)  # no stale exemption
    missing = [
        qualified
        for qualified, obj in entries.items()
        if qualified not in NO_CASE
        and not any(_calls(c, qualified.rsplit(".", 1)[1], obj) for c in CASES)
    ]
    assert not missing, f"public entry points without a bad-input case: {missing}"


# Two refusals come from Python's own checks of the library's public enum and dataclass
# (an unknown Dataflow name, an unknown ConvConfig field); every other one is raised by
# torch_lattice itself.
STDLIB_RAISED = {"config-dataflow-unknown-name", "conv-config-unknown-field"}


def _raised_in(tb: TracebackType | None) -> str:
    """The module whose code raised: the innermost frame of the traceback."""
    assert tb is not None
    while tb.tb_next is not None:
        tb = tb.tb_next
    return str(tb.tb_frame.f_globals.get("__name__", ""))


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_raises_clear_error(case: Case, tmp_path: Path) -> None:
    with pytest.raises(case.exc, match=case.match) as info:
        case.fn(tmp_path)
    # Exactly the listed type: a subclass (ConversionError for ValueError, say) is listed
    # as itself, so that a change of type shows here.
    assert type(info.value) is case.exc, f"{type(info.value).__qualname__}: {info.value}"
    # The library decided: not an error from deep inside torch, NumPy or the allocator
    # that happens to have the right type; and the message is a sentence, not a value.
    module = _raised_in(info.tb)
    if case.id in STDLIB_RAISED:
        assert module in ("enum", "dataclasses"), module
    else:
        assert module.startswith("torch_lattice"), module
    message = str(info.value)
    assert len(message) > 10 and " " in message, message


# --------------------------------------------------------------------------------------
# convert-checkpoint command line: refusals are exit status 2 with a one-line reason
# --------------------------------------------------------------------------------------

CLI_CASES = {
    "cli-missing-file": (lambda tmp: (tmp / "nope.pt", SPEC), r"does not exist"),
    "cli-not-a-checkpoint": (
        lambda tmp: ((lambda p: (p.write_bytes(b"garbage"), p)[1])(tmp / "x.pt"), SPEC),
        r"cannot load",
    ),
    "cli-wrong-kernel-shape": (
        lambda tmp: (_save(tmp, {"stem.kernel": torch.randn(4, 2, 3)}), SPEC),
        r"legacy kernel 'stem.kernel' has shape",
    ),
    "cli-optimizer-state": (
        lambda tmp: (_save(tmp, {"state": {}, "param_groups": []}), SPEC),
        r"optimizer state",
    ),
}


@pytest.mark.parametrize("name", sorted(CLI_CASES))
def test_convert_checkpoint_cli_refuses(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    make, match = CLI_CASES[name]
    src, spec = make(tmp_path)
    out = tmp_path / "out.safetensors"
    code = migration_cli.main([str(src), str(out), "--kernel-spec", str(_spec(tmp_path, spec))])
    err = capsys.readouterr().err
    assert code == migration_cli.EXIT_REFUSED
    assert err.startswith("error: ")
    assert pytest.importorskip("re").search(match, err), err
    assert not out.exists()


def test_convert_checkpoint_cli_missing_spec_flag(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        migration_cli.main(["a.pt", "b.safetensors"])
    assert info.value.code == 2
    assert "--kernel-spec" in capsys.readouterr().err


# --------------------------------------------------------------------------------------
# torch_lattice._C: null and undersized buffers
# --------------------------------------------------------------------------------------

SUBM = ((3, 3, 3), (1, 1, 1), (1, 1, 1), (1, 1, 1))
DOWN = ((3, 3, 3), (2, 2, 2), (1, 1, 1), (1, 1, 1))
GEN = ((2, 2, 2), (2, 2, 2), (0, 0, 0), (1, 1, 1))
C3 = torch.tensor([[0, 0, 0, 0], [0, 1, 1, 1], [0, 2, 2, 2], [0, 5, 5, 5]], dtype=torch.int32)
N3 = C3.shape[0]


def _c_cases() -> dict[str, Callable[[dict[str, torch.Tensor]], object]]:
    """Each takes a dict of live buffers (kept alive by the caller)."""
    p = C3.data_ptr
    return {
        "find-duplicate-null": lambda b: _C.find_duplicate(0, N3),
        "find-duplicate-negative-n": lambda b: _C.find_duplicate(p(), -1),
        "generate-bound-negative-n": lambda b: _C.generate_bound(-1, DOWN, (6, 6, 6), 1),
        "generate-null-input": lambda b: _C.generate(
            0, N3, DOWN, (4, 4, 4), b["out"].data_ptr(), 100
        ),
        "generate-null-output": lambda b: _C.generate(p(), N3, DOWN, (4, 4, 4), 0, 100),
        "generate-negative-capacity": lambda b: _C.generate(
            p(), N3, DOWN, (4, 4, 4), b["out"].data_ptr(), -1
        ),
        "generative-null-input": lambda b: _C.generative(0, N3, GEN, b["out"].data_ptr(), 100),
        "generative-null-output": lambda b: _C.generative(p(), N3, GEN, 0, 100),
        "kmap-build-null-input": lambda b: _C.kmap_build(
            0, N3, p(), N3, SUBM, b["nbr"].data_ptr(), 1
        ),
        "kmap-build-null-output-coords": lambda b: _C.kmap_build(
            p(), N3, 0, N3, SUBM, b["nbr"].data_ptr(), 1
        ),
        "kmap-build-null-table": lambda b: _C.kmap_build(p(), N3, p(), N3, SUBM, 0, 1),
        "kmap-build-negative-n": lambda b: _C.kmap_build(
            p(), -1, p(), N3, SUBM, b["nbr"].data_ptr(), 1
        ),
        "kmap-build-kernel-zero": lambda b: _C.kmap_build(
            p(), N3, p(), N3, ((0, 3, 3), (1, 1, 1), (1, 1, 1), (1, 1, 1)), b["nbr"].data_ptr(), 1
        ),
        "kmap-reverse-null-nbr": lambda b: _C.kmap_reverse(0, N3, 27, N3, b["rev"].data_ptr(), 1),
        "kmap-reverse-null-rev": lambda b: _C.kmap_reverse(b["nbr"].data_ptr(), N3, 27, N3, 0, 1),
        "kmap-reverse-k-zero": lambda b: _C.kmap_reverse(
            b["nbr"].data_ptr(), N3, 0, N3, b["rev"].data_ptr(), 1
        ),
        "conv-forward-null-x": lambda b: _C.conv_forward(
            0, N3, N3, 27, C, C, 0, b["w"].data_ptr(), b["nbr"].data_ptr(), b["y"].data_ptr(), 1
        ),
        "conv-forward-null-out": lambda b: _C.conv_forward(
            0, N3, N3, 27, C, C, b["x"].data_ptr(), b["w"].data_ptr(), b["nbr"].data_ptr(), 0, 1
        ),
        "conv-forward-negative-channels": lambda b: _C.conv_forward(
            0,
            N3,
            N3,
            27,
            -C,
            C,
            b["x"].data_ptr(),
            b["w"].data_ptr(),
            b["nbr"].data_ptr(),
            b["y"].data_ptr(),
            1,
        ),
        "conv-weight-grad-null-dy": lambda b: _C.conv_weight_grad(
            0, N3, N3, 27, C, C, b["x"].data_ptr(), 0, b["nbr"].data_ptr(), b["w"].data_ptr(), 1
        ),
        "voxel-unique-null-rows": lambda b: _C.voxel_unique(
            0, N3, b["out"].data_ptr(), b["counts"].data_ptr(), 1
        ),
        "voxel-reduce-null-feats": lambda b: _C.voxel_reduce(
            0, 0, 0, N3, C, b["counts"].data_ptr(), N3, b["y"].data_ptr(), 0, 1
        ),
        "pool-sum-null-x": lambda b: _C.pool_sum(
            0, N3, N3, 27, C, 0, b["nbr"].data_ptr(), 0, b["y"].data_ptr(), 0, 1
        ),
        "pool-max-null-argmax": lambda b: _C.pool_max(
            0, N3, N3, 27, C, b["x"].data_ptr(), b["nbr"].data_ptr(), 0, b["y"].data_ptr(), 0, 1
        ),
        "pairs-count-null-nbr": lambda b: _C.pairs_count(0, N3, 27, b["counts"].data_ptr(), 1),
    }


C_CASES = _c_cases()


def _buffers() -> dict[str, torch.Tensor]:
    return {
        "out": torch.full((100, 4), -7, dtype=torch.int32),
        "nbr": torch.full((N3, 27), -1, dtype=torch.int32),
        "rev": torch.full((N3, 27), -1, dtype=torch.int32),
        "x": torch.randn(N3, C),
        "w": torch.randn(27, C, C),
        "y": torch.zeros(N3, C),
        "counts": torch.zeros(27, dtype=torch.int64),
    }


@pytest.mark.parametrize("name", sorted(C_CASES))
def test_c_entry_points_refuse_null_and_negative(name: str) -> None:
    bufs = _buffers()
    with pytest.raises((ValueError, TypeError), match=r"torch_lattice\._C\.\w+: |argument"):
        C_CASES[name](bufs)


@pytest.mark.parametrize("capacity", [0, 1, 3])
def test_c_generate_refuses_undersized_output(capacity: int) -> None:
    """``generate`` with a capacity below the row count fails and writes only inside it."""
    need = _C.generate_bound(N3, DOWN, (4, 4, 4), 1)
    assert need > capacity
    out = torch.full((need, 4), -7, dtype=torch.int32)
    with pytest.raises(RuntimeError, match=r"_C\.generate: output buffer too small"):
        _C.generate(C3.data_ptr(), N3, DOWN, (4, 4, 4), out.data_ptr(), capacity)
    assert bool((out[capacity:] == -7).all())


@pytest.mark.parametrize("capacity", [0, 1, 7])
def test_c_generative_refuses_undersized_output(capacity: int) -> None:
    out = torch.full((8 * N3, 4), -7, dtype=torch.int32)
    with pytest.raises(RuntimeError, match=r"_C\.generative: output buffer too small"):
        _C.generative(C3.data_ptr(), N3, GEN, out.data_ptr(), capacity)
    assert bool((out[capacity:] == -7).all())


def test_c_generate_exact_capacity_works() -> None:
    """The refusal is about size only: the same call with enough room succeeds."""
    need = _C.generate_bound(N3, DOWN, (4, 4, 4), 1)
    out = torch.full((need, 4), -7, dtype=torch.int32)
    n = _C.generate(C3.data_ptr(), N3, DOWN, (4, 4, 4), out.data_ptr(), need)
    assert 0 < n <= need
