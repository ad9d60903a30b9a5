"""Export, then replay: the artifact reproduces ``model(*inputs)`` in eval mode.

Every exportable module and function is exported on a random scene, loaded
with ``load_lattice_program`` (IR v2, physical coordinates at the boundary)
and run on the same inputs.  Sparse outputs are compared after sorting both
by coordinates (row order is not part of the contract); coordinates must be
equal exactly, features to float32 tolerance (packed weights: to the model
run with the dequantized weights).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import torch_lattice as tl
from torch_lattice.artifact import load_lattice_program, save_lattice_model_artifact
from torch_lattice.artifact.packing import pack_weight, unpack_weight
from torch_lattice.artifact.weights import conv_weight_to_artifact
from torch_lattice.nn import functional as F

try:
    from artifact_export_helpers import abi_inputs, assert_same
except ImportError:  # tests/ may become a package; then it is imported through it
    from tests.artifact_export_helpers import abi_inputs, assert_same


def scene(
    channels: int,
    *,
    seed: int,
    n: int = 60,
    extent: int = 8,
    batches: int = 2,
    stride: int | tuple[int, int, int] = 1,
) -> tl.SparseTensor:
    g = torch.Generator().manual_seed(seed)
    rows = torch.cat(
        [
            torch.randint(0, batches, (4 * n, 1), generator=g),
            torch.randint(0, extent, (4 * n, 3), generator=g),
        ],
        dim=1,
    )
    coords = torch.unique(rows, dim=0)
    coords = coords[torch.randperm(len(coords), generator=g)[:n]]
    feats = torch.randn(len(coords), channels, generator=g)
    # A range the strides divide: strided layers keep every row, as the contract does.
    return tl.SparseTensor(feats, coords, stride=stride, spatial_range=(batches, *(extent,) * 3))


def roundtrip(
    tmp_path: Path,
    model: nn.Module,
    inputs: tuple[Any, ...],
    atol: float = 1e-5,
    reference: nn.Module | None = None,
    **kw: Any,
) -> str:
    model.eval()
    art = tmp_path / "artifact"
    save_lattice_model_artifact(model, art, example_inputs=inputs, **kw)
    program = load_lattice_program(art)
    got = program(**abi_inputs(model, inputs))
    with torch.no_grad():
        ref = (reference or model).eval()(*inputs)
    refs = ref if isinstance(ref, tuple) else (ref,)
    assert list(got) == list(program.output_names)
    for r, name in zip(refs, program.output_names, strict=True):
        assert_same(r, got[name], atol)
    return (art / "graph.mlir").read_text()


class Seq(nn.Module):
    """Applies its modules in order (traced through, so each is a node)."""

    def __init__(self, *mods: nn.Module) -> None:
        super().__init__()
        self.layers = nn.ModuleList(mods)

    def forward(self, x: Any) -> Any:
        for m in self.layers:
            x = m(x)
        return x


class Lambda(nn.Module):
    def __init__(self, fn: Callable[..., Any], *mods: nn.Module) -> None:
        super().__init__()
        self.fn = fn
        self.mods = nn.ModuleList(mods)

    def forward(self, x: Any, y: Any = None) -> Any:
        return self.fn(self, x) if y is None else self.fn(self, x, y)


def _bias(m: nn.Module) -> nn.Module:
    with torch.no_grad():
        for p in m.parameters():
            p.uniform_(-0.5, 0.5)
    return m


@pytest.mark.parametrize(
    "make",
    [
        lambda: tl.nn.SubmConv3d(3, 5, 3, bias=True),
        lambda: tl.nn.SubmConv3d(3, 4, (3, 1, 5), dilation=(1, 2, 1)),
        lambda: tl.nn.Conv3d(3, 4, 2, stride=2, bias=True),
        lambda: tl.nn.Conv3d(3, 4, (2, 1, 2), stride=(2, 1, 2), dilation=(1, 3, 1)),
        lambda: tl.nn.Conv3d(3, 2, 1, bias=True),
        lambda: tl.nn.NormalizedSubmConv3d(3, 4, 3, bias=True),
        lambda: tl.nn.NormalizedSubmConv3d(3, 4, 1, bias=True),
        lambda: tl.nn.GenerativeConvTranspose3d(3, 2, 2, 2, bias=True),
        lambda: tl.nn.GenerativeConvTranspose3d(3, 2, (2, 1, 1), (2, 2, 1)),
        lambda: tl.nn.NormalizedGenerativeConvTranspose3d(3, 2, 2, 2, bias=True),
        lambda: tl.nn.MaxPool3d(2),
        lambda: tl.nn.AvgPool3d((1, 2, 2)),
        lambda: tl.nn.SumPool3d((2, 1, 2)),
        lambda: tl.nn.ReLU(),
        lambda: tl.nn.LeakyReLU(0.2),
        lambda: tl.nn.SiLU(),
        lambda: tl.nn.GELU(),
        lambda: tl.nn.GELU(approximate="tanh"),
    ],
)
def test_single_module(tmp_path: Path, make: Callable[[], nn.Module]) -> None:
    torch.manual_seed(0)
    module = _bias(make())
    # Generative transposes need an input lattice their stride divides.
    stride = 2 if isinstance(module, tl.nn.GenerativeConvTranspose3d) else 1
    roundtrip(tmp_path, Seq(module), (scene(3, seed=1, stride=stride),))


def test_a_bare_module_is_a_model(tmp_path: Path) -> None:
    text = roundtrip(
        tmp_path, _bias(tl.nn.Conv3d(3, 4, 2, stride=2, bias=True)), (scene(3, seed=14),)
    )
    assert 'storage_key = "conv3d.weight"' in text
    target = scene(1, seed=15, extent=4, stride=2)
    text = roundtrip(
        tmp_path, tl.nn.Conv3d(3, 4, 3, stride=2, padding=1), (scene(3, seed=14), target)
    )
    assert "= lattice.target_conv3d %input, %coordinates, " in text


def test_batch_norm_with_running_statistics(tmp_path: Path) -> None:
    bn = tl.nn.BatchNorm(3)
    with torch.no_grad():
        bn.running_mean.uniform_(-1, 1)
        bn.running_var.uniform_(0.5, 2)
        bn.weight.uniform_(0.5, 1.5)
        bn.bias.uniform_(-1, 1)
    roundtrip(tmp_path, Seq(bn, tl.nn.ReLU()), (scene(3, seed=2),))
    affine_free = tl.nn.BatchNorm(3, affine=False)
    with torch.no_grad():
        affine_free.running_var.fill_(4.0)
    roundtrip(tmp_path, Seq(affine_free), (scene(3, seed=3),))


def test_batch_norm_relu_is_a_batch_norm_then_a_relu(tmp_path: Path) -> None:
    bn = tl.nn.BatchNormReLU(3)
    with torch.no_grad():
        bn.running_mean.uniform_(-1, 1)
        bn.bias.uniform_(-1, 1)
    x = scene(3, seed=2)
    assert (bn.eval()(x).feats == 0).any()  # the ReLU cuts something
    text = roundtrip(tmp_path, Seq(tl.nn.SubmConv3d(3, 3, 3), bn), (x,))
    norm, act = text.index("lattice.batch_norm"), text.index("lattice.activation")
    assert norm < act and "kind = #lattice.activation<relu>" in text[act:]


def test_down_up_inverse_transposes(tmp_path: Path) -> None:
    def fn(self: Lambda, x: tl.SparseTensor) -> tl.SparseTensor:
        down, up, nup = self.mods
        d = down(x)
        return tl.cat([up(d), nup(d)])

    model = Lambda(
        fn,
        tl.nn.Conv3d(3, 4, 2, stride=2),
        tl.nn.ConvTranspose3d(4, 2, 2, stride=2, bias=True),
        tl.nn.NormalizedConvTranspose3d(4, 3, 2, stride=2, bias=True),
    )
    text = roundtrip(tmp_path, model, (scene(3, seed=4),))
    # The contract's no-target transpose generates its support; ours returns onto the
    # Conv3d's input, so the artifact names that input as the target.
    assert "= lattice.target_conv_transpose3d %mods_0, %x, " in text
    assert "= lattice.target_normalized_conv_transpose3d %mods_0, %x, " in text


def test_target_convolutions(tmp_path: Path) -> None:
    def fn(self: Lambda, x: tl.SparseTensor, target: tl.SparseTensor) -> tuple[Any, ...]:
        down, up, nup, gen = self.mods
        coarse = down(x, coordinates=target)
        return up(coarse, x), nup(coarse, target=x), gen(coarse, x), coarse

    model = Lambda(
        fn,
        tl.nn.Conv3d(3, 4, 3, stride=2, padding=1, bias=True),
        tl.nn.ConvTranspose3d(4, 2, 3, stride=2, padding=1),
        tl.nn.NormalizedConvTranspose3d(4, 2, 3, stride=2, padding=1, bias=True),
        tl.nn.NormalizedGenerativeConvTranspose3d(4, 2, 2, stride=2),
    )
    target = scene(1, seed=6, extent=4, stride=2)
    text = roundtrip(tmp_path, model, (scene(3, seed=5), target))
    assert "lattice.target_conv3d %x, %y," in text
    assert text.count("lattice.target_normalized_conv_transpose3d") == 2


def test_dense_head_after_global_pools(tmp_path: Path) -> None:
    def fn(self: Lambda, x: tl.SparseTensor) -> tuple[torch.Tensor, ...]:
        gap, gmp, lin, act, bn = self.mods
        a = act(lin(gap(x)))
        return a, bn(gmp(x)), F.global_pool(x, "sum"), F.global_max_pool(x)

    bn = nn.BatchNorm1d(3)
    with torch.no_grad():
        bn.running_mean.uniform_(-1, 1)
    model = Lambda(fn, tl.nn.GlobalAvgPool(), tl.nn.GlobalMaxPool(), nn.Linear(3, 2), nn.Tanh(), bn)
    roundtrip(tmp_path, model, (scene(3, seed=7),), output_names=("a", "b", "c", "d"))


def test_feature_replace_and_residual(tmp_path: Path) -> None:
    def fn(self: Lambda, x: tl.SparseTensor) -> tl.SparseTensor:
        conv, lin = self.mods
        h = conv(x)
        h = h.replace(torch.relu(lin(h.feats)))
        h = h.replace(nn.functional.leaky_relu(h.feats, 0.3))
        return tl.cat([h + h, h])

    roundtrip(tmp_path, Lambda(fn, tl.nn.SubmConv3d(3, 4, 3), nn.Linear(4, 4)), (scene(3, seed=8),))


def test_pool_functions_and_blocks(tmp_path: Path) -> None:
    def fn(self: Lambda, x: tl.SparseTensor, target: tl.SparseTensor) -> tuple[Any, ...]:
        coarse = F.avg_pool3d(x, 2)
        up = F.pool_transpose3d(coarse, 2, target=x)
        up_inverse = F.pool_transpose3d(F.max_pool3d(x, 2), 2)
        smooth = F.trilinear_upsample3d(coarse, 2, target=x)
        moved = tl.reindex_sparse(x, target, fill=-0.5)
        joined = tl.sparse_cat([x, moved], join="outer")
        left = tl.sparse_cat([x, moved, x], join="left")
        diff = tl.sparse_binary(x, moved, "sub", join="outer", lhs_fill=1.0, rhs_fill=2.0)
        prod = tl.sparse_binary(x, moved, "maximum", join="inner")
        return up, up_inverse, smooth, joined, left, diff, prod

    text = roundtrip(tmp_path, Lambda(fn), (scene(2, seed=9), scene(1, seed=10)))
    # Without a target ours reuses the pooling's input; the artifact names it.
    assert "= lattice.pool_transpose3d %max_pool3d, %x {" in text


def test_points_voxelize_devoxelize(tmp_path: Path) -> None:
    def fn(
        self: Lambda, points: torch.Tensor, features: torch.Tensor, batch: torch.Tensor
    ) -> tuple[torch.Tensor, ...]:
        conv, down = self.conv, self.down
        v = tl.voxelize(
            points,
            features,
            batch_indices=batch,
            voxel_size=0.5,
            origin=(-1.0, -1.0, -1.0),
            reduction="mean",
        )
        h = conv(v)
        near = tl.devoxelize(points, h, batch_indices=batch, voxel_size=0.5, origin=-1.0)
        coarse = down(h)
        tri = tl.devoxelize(
            points,
            coarse,
            batch_indices=batch,
            voxel_size=0.5,
            origin=-1.0,
            interpolation="trilinear",
        )
        s = tl.voxelize(
            points, features, batch_indices=batch, voxel_size=(0.5, 0.25, 1.0), reduction="sum"
        )
        return near, tri, s

    class Points(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = tl.nn.SubmConv3d(2, 3, 3, bias=True)
            self.down = tl.nn.Conv3d(3, 3, 2, stride=2)

        def forward(
            self, points: torch.Tensor, features: torch.Tensor, batch: torch.Tensor
        ) -> tuple[torch.Tensor, ...]:
            return fn(self, points, features, batch)  # type: ignore[arg-type]

    g = torch.Generator().manual_seed(11)
    # Points off the voxel faces and centres, so float rounding cannot move them.
    points = (torch.randint(0, 16, (300, 3), generator=g) * 0.25 + 0.1).float()
    features = torch.randn(300, 2, generator=g)
    batch = torch.randint(0, 2, (300,), generator=g, dtype=torch.int32)
    text = roundtrip(tmp_path, Points(), (points, features, batch), atol=1e-5)
    assert '"points", "features", "batch", "points_active"' in text


@pytest.mark.parametrize("bits", [4, 8])
def test_packed_weights_replay_the_dequantized_model(tmp_path: Path, bits: int) -> None:
    def fn(self: Lambda, x: tl.SparseTensor) -> torch.Tensor:
        conv, sub, pool, lin = self.mods
        return lin(pool(sub(conv(x))))

    model = Lambda(
        fn,
        tl.nn.Conv3d(40, 8, 2, stride=2, bias=True),
        tl.nn.SubmConv3d(8, 6, 3),
        tl.nn.GlobalAvgPool(),
        nn.Linear(6, 3),
    ).eval()
    x = scene(40, seed=12)
    dequantized = copy.deepcopy(model)
    with torch.no_grad():
        for m in dequantized.modules():
            if isinstance(m, nn.Linear):
                m.weight.copy_(
                    unpack_weight(
                        *pack_weight(m.weight, bits=bits).astuple(),
                        bits=bits,
                        in_channels=m.in_features,
                    )
                )
            elif isinstance(m, (tl.nn.Conv3d, tl.nn.SubmConv3d)):
                ks = m.kernel_size
                w = conv_weight_to_artifact(m.weight, ks)
                back = unpack_weight(
                    *pack_weight(w, bits=bits).astuple(),
                    bits=bits,
                    in_channels=m.in_channels,
                    kernel_size=ks,
                )
                m.weight.copy_(back.permute(1, 2, 3, 4, 0).reshape(m.weight.shape))
    roundtrip(tmp_path, model, (x,), atol=1e-5, reference=dequantized, quantize_bits=bits)
    with torch.no_grad():
        spread = (model(x) - dequantized(x)).abs().max().item()
    assert 0 < spread < (0.2 if bits == 4 else 0.02)


def test_half_precision_model(tmp_path: Path) -> None:
    model = Seq(tl.nn.SubmConv3d(3, 4, 3, bias=True), tl.nn.BatchNorm(4), tl.nn.ReLU()).half()
    text = roundtrip(tmp_path, model, (scene(3, seed=13).half(),), atol=2e-3)
    assert "!lattice.weight<conv3d, f16>" in text and "tensor<?x3xf16>" in text
