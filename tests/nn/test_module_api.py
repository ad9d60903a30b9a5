"""Module-level contract of ``tl.nn.SubmConv3d`` and ``tl.nn.Conv3d`` (API.md).

Parameters: ``weight`` (K, C_in, C_out), ``bias`` (C_out,) or None, and a persistent
int32 buffer ``kernel_positions`` (K, 3) whose row n is (rx, ry, rz) with
n = (rx*Ky + ry)*Kz + rz (z fastest). Bad arguments raise ValueError naming them.
"""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
import torch

import torch_lattice as tl

try:
    import conformance_helpers as ch
    import dense_oracle as oracle
except ImportError:  # tests/ may become a package; then they are imported through it
    from tests import conformance_helpers as ch
    from tests import dense_oracle as oracle

F64 = torch.float64
KERNELS = [1, 2, 3, (3, 1, 2), (2, 3, 1), (1, 5, 3)]
ODD_KERNELS = [1, 3, 5, (3, 1, 5), (1, 3, 3)]


def conv_of(kind: str, cin: int, cout: int, **kwargs: object) -> torch.nn.Module:
    cls = tl.nn.SubmConv3d if kind == "subm" else tl.nn.Conv3d
    return cls(cin, cout, **kwargs)


# --------------------------------------------------------------------------------------
# Parameters and buffers
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("kernel", KERNELS, ids=str)
def test_conv3d_weight_and_kernel_positions(kernel: int | tuple[int, int, int]) -> None:
    conv = tl.nn.Conv3d(3, 5, kernel_size=kernel)
    k = oracle.kernel_volume(kernel)
    assert tuple(conv.weight.shape) == (k, 3, 5)
    assert isinstance(conv.weight, torch.nn.Parameter)
    pos = conv.kernel_positions
    assert pos.dtype == torch.int32
    assert tuple(pos.shape) == (k, 3)
    # Row n must be (rx, ry, rz) with z fastest.
    assert pos.tolist() == [list(r) for r in oracle.kernel_offsets(kernel)]


@pytest.mark.parametrize("kernel", ODD_KERNELS, ids=str)
def test_subm_weight_and_kernel_positions(kernel: int | tuple[int, int, int]) -> None:
    conv = tl.nn.SubmConv3d(4, 2, kernel_size=kernel)
    k = oracle.kernel_volume(kernel)
    assert tuple(conv.weight.shape) == (k, 4, 2)
    assert conv.kernel_positions.dtype == torch.int32
    assert conv.kernel_positions.tolist() == [list(r) for r in oracle.kernel_offsets(kernel)]


def test_kernel_positions_z_fastest_explicit() -> None:
    """Spot-check the row formula on a non-cubic kernel without the oracle helper."""
    pos = tl.nn.Conv3d(1, 1, kernel_size=(2, 3, 4)).kernel_positions
    kx, ky, kz = 2, 3, 4
    for rx, ry, rz in [(0, 0, 1), (0, 1, 0), (1, 0, 0), (1, 2, 3), (0, 2, 1)]:
        assert pos[(rx * ky + ry) * kz + rz].tolist() == [rx, ry, rz]
    assert pos.shape[0] == kx * ky * kz


@pytest.mark.parametrize("kind", ["subm", "conv"])
def test_defaults_and_state_dict(kind: str) -> None:
    conv = conv_of(kind, 2, 3)
    # Defaults per API.md: kernel_size=3, bias=False.
    assert tuple(conv.weight.shape) == (27, 2, 3)
    assert conv.bias is None
    sd = conv.state_dict()
    # kernel_positions is a persistent buffer, so checkpoints carry the row layout.
    assert set(sd) == {"weight", "kernel_positions"}
    assert "kernel_positions" in dict(conv.named_buffers())
    assert torch.equal(sd["kernel_positions"], conv.kernel_positions)

    with_bias = conv_of(kind, 2, 3, bias=True)
    assert isinstance(with_bias.bias, torch.nn.Parameter)
    assert tuple(with_bias.bias.shape) == (3,)
    assert set(with_bias.state_dict()) == {"weight", "bias", "kernel_positions"}

    # A strict round trip restores the parameters exactly.
    fresh = conv_of(kind, 2, 3, bias=True)
    fresh.load_state_dict(with_bias.state_dict(), strict=True)
    assert torch.equal(fresh.weight, with_bias.weight)
    assert torch.equal(fresh.bias, with_bias.bias)


@pytest.mark.parametrize(
    "module", [tl.nn.Conv3d, tl.nn.ConvTranspose3d, tl.nn.GenerativeConvTranspose3d]
)
def test_kernel_positions_of_another_kernel_do_not_load(module: type) -> None:
    """(3, 2, 1) and (2, 3, 1) have the same weight shape; their rows are other positions."""
    a, b = module(2, 2, kernel_size=(3, 2, 1)), module(2, 2, kernel_size=(2, 3, 1))
    before = b.weight.detach().clone()
    with pytest.raises(RuntimeError, match="kernel_positions: the checkpoint's rows are not "
                                           r"the z-fastest positions of kernel_size \(2, 3, 1\)"):
        b.load_state_dict(a.state_dict())
    assert torch.equal(b.weight.detach(), before)
    edited = a.state_dict()
    edited["kernel_positions"] = edited["kernel_positions"][[1, 0, 2, 3, 4, 5]]  # rows swapped
    with pytest.raises(RuntimeError, match="another order"):
        module(2, 2, kernel_size=(3, 2, 1)).load_state_dict(edited)
    same = module(2, 2, kernel_size=(3, 2, 1))
    same.load_state_dict(a.state_dict())  # the same kernel: loads
    assert torch.equal(same.weight, a.weight)
    # Integer rows of another integer dtype load; rows of any other dtype do not, not even
    # 0.9 where 0 is expected (compared as integers it passed, truncated).
    widened = {**a.state_dict(), "kernel_positions": a.kernel_positions.long()}
    module(2, 2, kernel_size=(3, 2, 1)).load_state_dict(widened)
    for odd in (a.kernel_positions.float() + 0.9, a.kernel_positions.double(),
                a.kernel_positions.bool()):
        kept = module(2, 2, kernel_size=(3, 2, 1))
        before = kept.weight.detach().clone()
        with pytest.raises(RuntimeError, match="kernel_positions: the checkpoint's rows must "
                                               f"be integers, got {odd.dtype}"):
            kept.load_state_dict({**a.state_dict(), "kernel_positions": odd})
        assert torch.equal(kept.weight.detach(), before)
        assert kept.kernel_positions.dtype == torch.int32


def test_a_weight_beyond_the_memory_budget_is_refused_before_allocating() -> None:
    previous = tl.set_memory_budget(64 * 2**20)
    try:
        with pytest.raises(ValueError, match=r"Conv3d weight \(16384 kernel rows x 64 x 64\).*"
                                             "memory budget"):
            tl.nn.Conv3d(64, 64, kernel_size=(32, 32, 16))
        with pytest.raises(ValueError, match="memory budget"):
            tl.nn.SubmConv3d(64, 64, kernel_size=127)  # 32 GiB asked
        tl.nn.SubmConv3d(64, 64, kernel_size=3)  # 442 KiB: fine
    finally:
        tl.set_memory_budget(previous)


def test_numpy_integers_are_ints_as_in_torch_conv3d() -> None:
    """torch.nn.Conv3d takes NumPy integers for its sizes; so do the modules, the same
    geometry as Python ints, while bools and floats of either kind stay refused."""
    conv = tl.nn.Conv3d(2, 3, np.int64(3), stride=(np.int32(2), 1, 2), padding=np.int16(1))
    assert (conv.kernel_size, conv.stride, conv.padding) == ((3, 3, 3), (2, 1, 2), (1, 1, 1))
    assert all(type(v) is int for v in (*conv.kernel_size, *conv.stride, *conv.padding))
    for bad in (np.bool_(True), np.float64(3.0), (np.float32(1), 1, 1)):
        with pytest.raises(TypeError, match="kernel_size must"):
            tl.nn.SubmConv3d(2, 3, bad)


def test_numpy_and_tensor_channel_counts_are_ints_as_in_torch() -> None:
    """torch.nn.Conv3d and BatchNorm1d take NumPy integers (and one-element integer
    tensors) for their channel counts; so do every convolution family, the batch norms
    and the backbone, stored as Python ints. Bools and floats stay refused."""
    x = tl.SparseTensor(torch.randn(5, 3), torch.tensor([[0, i, 0, 0] for i in range(5)]).int())
    for make in (tl.nn.SubmConv3d, tl.nn.Conv3d, tl.nn.ConvTranspose3d,
                 tl.nn.GenerativeConvTranspose3d):  # fmt: skip
        conv = make(np.int64(3), torch.tensor(4), 1)
        assert (type(conv.in_channels), type(conv.out_channels)) == (int, int)
        assert conv.weight.shape == (1, 3, 4)
    assert tl.nn.SubmConv3d(np.int32(3), 4, 3)(x).feats.shape == (5, 4)
    for make in (tl.nn.BatchNorm, tl.nn.BatchNormReLU):
        bn = make(np.int64(3))
        assert type(bn.num_features) is int and bn(x).feats.shape == (5, 3)
    net = tl.backbones.SparseResUNet42(np.int64(3), np.int16(5), width=0.25)
    assert net.eval()(x).feats.shape == (5, 5)
    for bad in (True, np.bool_(True), 3.0, np.float64(3.0), "3", torch.tensor([3, 3])):
        with pytest.raises(ValueError, match="in_channels must be a positive int"):
            tl.nn.SubmConv3d(bad, 4, 3)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="num_features must be a positive int"):
            tl.nn.BatchNorm(bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="num_classes must be a positive int"):
        tl.backbones.SparseResUNet42(3, np.int64(0))


def test_a_bool_tensor_is_no_int() -> None:
    for kw in ({"kernel_size": (torch.tensor(True), 1, 1)}, {"stride": (torch.tensor(True), 1, 1)}):
        with pytest.raises(TypeError, match="must contain ints"):
            tl.nn.Conv3d(1, 1, **kw)  # type: ignore[arg-type]
    assert tl.nn.Conv3d(1, 1, kernel_size=(torch.tensor(2), 1, 1)).kernel_size == (2, 1, 1)


def test_subm_centring_padding_must_fit_int32() -> None:
    with pytest.raises(ValueError, match=r"dilation \* \(kernel_size - 1\) / 2 .* must fit int32"):
        tl.nn.SubmConv3d(1, 1, kernel_size=5, dilation=2**30)
    with pytest.raises(ValueError, match="must fit int32"):
        tl.nn.functional.subm_conv3d(
            tl.SparseTensor(torch.ones(1, 1), torch.zeros(1, 4, dtype=torch.int32)),
            torch.ones(125, 1, 1), kernel_size=5, dilation=2**30)
    tl.nn.SubmConv3d(1, 1, kernel_size=5, dilation=2**30 - 1)  # 2^31 - 2: fits


@pytest.mark.parametrize(
    ("kind", "cin", "kernel"),
    [("conv", 16, 3), ("subm", 16, 3), ("conv", 32, (3, 1, 2)), ("subm", 8, 5)],
)
def test_initialization_like_torch_conv3d(
    kind: str, cin: int, kernel: int | tuple[int, int, int]
) -> None:
    """torch.nn.Conv3d draws U(-1/sqrt(fan_in), 1/sqrt(fan_in)), fan_in = C_in*K."""
    torch.manual_seed(0)
    cout = 8
    conv = conv_of(kind, cin, cout, kernel_size=kernel, bias=True)
    bound = 1.0 / math.sqrt(cin * oracle.kernel_volume(kernel))
    w = conv.weight.detach()
    assert w.abs().max() <= bound * (1 + 1e-6)
    assert w.count_nonzero() > 0.99 * w.numel()
    # A uniform on [-bound, bound] has std bound/sqrt(3); thousands of draws pin it.
    assert abs(float(w.std()) - bound / math.sqrt(3)) < 0.1 * bound / math.sqrt(3)
    assert abs(float(w.mean())) < 0.1 * bound
    b = conv.bias.detach()
    assert b.abs().max() <= bound * (1 + 1e-6)
    assert b.count_nonzero() > 0


@pytest.mark.parametrize(
    "cls",
    [
        tl.nn.ConvTranspose3d,
        tl.nn.GenerativeConvTranspose3d,
        tl.nn.NormalizedConvTranspose3d,
        tl.nn.NormalizedGenerativeConvTranspose3d,
    ],
)
def test_transposed_initialization_like_torch_conv_transpose3d(cls: type) -> None:
    """torch.nn.ConvTranspose3d (and TorchSparse's transposed convolutions) take fan_in
    from the output channels: U(-b, b) with b = 1/sqrt(C_out*K), for weight and bias."""
    cin, cout, kernel = 64, 4, 3
    torch.manual_seed(0)
    ours = cls(cin, cout, kernel_size=kernel, stride=2, bias=True)
    torch.manual_seed(0)
    theirs = torch.nn.ConvTranspose3d(cin, cout, kernel, stride=2, bias=True)
    bound = 1.0 / math.sqrt(cout * kernel**3)
    for mine, ref in ((ours.weight, theirs.weight), (ours.bias, theirs.bias)):
        assert float(mine.abs().max()) <= bound * (1 + 1e-6)
        assert float(ref.abs().max()) <= bound * (1 + 1e-6)
        # drawn over the whole interval, as torch's: both near the bound
        assert float(mine.abs().max()) > 0.5 * bound
    w = ours.weight.detach()
    assert abs(float(w.std()) - bound / math.sqrt(3)) < 0.1 * bound / math.sqrt(3)


@pytest.mark.parametrize("kind", ["subm", "conv"])
def test_repr_names_class_channels_and_kernel(kind: str) -> None:
    conv = conv_of(kind, 5, 7, kernel_size=(3, 1, 5))
    text = repr(conv)
    assert type(conv).__name__ in text
    assert "5" in text and "7" in text
    assert re.search(r"3,\s*1,\s*5", text), text


# --------------------------------------------------------------------------------------
# gradcheck
# --------------------------------------------------------------------------------------


def _gradcheck_module(conv: torch.nn.Module, spatial_range: tuple[int, ...]) -> None:
    feats, coords = oracle.random_geometry(5, 2, spatial_range[1:], 0.2, 2)
    conv = conv.to(F64)
    x = tl.SparseTensor(feats, coords, spatial_range=spatial_range)
    assert conv(x).feats.shape[0] > 0
    ch.gradcheck_module(conv, x, rtol=1e-3)  # torch's default rtol


def test_gradcheck_subm() -> None:
    torch.manual_seed(1)
    _gradcheck_module(tl.nn.SubmConv3d(2, 2, kernel_size=3, bias=True), (2, 4, 4, 4))


def test_gradcheck_conv_generated_stride2() -> None:
    torch.manual_seed(2)
    conv = tl.nn.Conv3d(2, 3, kernel_size=2, stride=2, bias=True)
    _gradcheck_module(conv, (2, 4, 5, 4))


def test_gradcheck_conv_padded_stride2() -> None:
    torch.manual_seed(3)
    conv = tl.nn.Conv3d(2, 2, kernel_size=3, stride=2, padding=1, bias=True)
    _gradcheck_module(conv, (2, 5, 4, 4))


# --------------------------------------------------------------------------------------
# Argument validation
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("kernel", [2, 4, (3, 2, 3), (1, 1, 2)], ids=str)
def test_subm_even_kernel_rejected_at_construction(
    kernel: int | tuple[int, int, int],
) -> None:
    with pytest.raises(ValueError, match=r"kernel_size|odd"):
        tl.nn.SubmConv3d(2, 2, kernel_size=kernel)


CONV_BAD_ARGS = [
    ({"kernel_size": 0}, "kernel_size"),
    ({"kernel_size": -3}, "kernel_size"),
    ({"kernel_size": (3, 0, 3)}, "kernel_size"),
    ({"stride": 0}, "stride"),
    ({"stride": (1, 0, 1)}, "stride"),
    ({"stride": -1}, "stride"),
    ({"padding": -1}, "padding"),
    ({"padding": (0, -2, 0)}, "padding"),
    ({"dilation": 0}, "dilation"),
    ({"dilation": (1, 1, 0)}, "dilation"),
]


@pytest.mark.parametrize(("kwargs", "name"), CONV_BAD_ARGS, ids=str)
def test_conv3d_invalid_args(kwargs: dict[str, object], name: str) -> None:
    with pytest.raises(ValueError, match=name):
        tl.nn.Conv3d(2, 3, **kwargs)


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"kernel_size": 0}, "kernel_size"),
        ({"kernel_size": -3}, "kernel_size"),
        ({"dilation": 0}, "dilation"),
        ({"dilation": (1, -1, 1)}, "dilation"),
    ],
    ids=str,
)
def test_subm_invalid_args(kwargs: dict[str, object], name: str) -> None:
    with pytest.raises(ValueError, match=name):
        tl.nn.SubmConv3d(2, 3, **kwargs)


@pytest.mark.parametrize("kind", ["subm", "conv"])
@pytest.mark.parametrize(
    ("cin", "cout", "name"),
    [(0, 3, "in_channels"), (-2, 3, "in_channels"), (2, 0, "out_channels")],
)
def test_invalid_channels(kind: str, cin: int, cout: int, name: str) -> None:
    with pytest.raises(ValueError, match=name):
        conv_of(kind, cin, cout)


@pytest.mark.parametrize("kind", ["subm", "conv"])
def test_feats_channel_mismatch_raises(kind: str) -> None:
    feats, coords = oracle.random_geometry(9, 1, (5, 5, 5), 0.2, 4)
    conv = conv_of(kind, 3, 2).to(F64)
    with pytest.raises(ValueError, match=r"channels|feats"):
        conv(tl.SparseTensor(feats, coords))


@pytest.mark.parametrize("target_stride", [1, 4, (2, 2, 1)], ids=str)
def test_target_stride_mismatch_raises(target_stride: int | tuple[int, ...]) -> None:
    feats, coords = oracle.random_geometry(10, 1, (6, 6, 6), 0.2, 2)
    conv = tl.nn.Conv3d(2, 2, kernel_size=2, stride=2).to(F64)
    x = tl.SparseTensor(feats, coords)
    tgt_coords = torch.tensor([[0, 0, 0, 0], [0, 1, 2, 1]], dtype=torch.int32)
    target = tl.SparseTensor(torch.zeros(2, 1, dtype=F64), tgt_coords, stride=target_stride)
    with pytest.raises(ValueError, match="stride"):
        conv(x, coordinates=target)
    # The matching stride is accepted, so the error above is about the stride only.
    good = tl.SparseTensor(torch.zeros(2, 1, dtype=F64), tgt_coords, stride=2)
    assert conv(x, coordinates=good).feats.shape == (2, 2)


@pytest.mark.parametrize(
    "make",
    [
        lambda: tl.nn.SubmConv3d(3, 4, 3, bias=True),
        lambda: tl.nn.Conv3d(3, 4, (3, 1, 2), stride=2),
        lambda: tl.nn.ConvTranspose3d(3, 4, 2, stride=2),
        lambda: tl.nn.GenerativeConvTranspose3d(3, 4, 2, stride=2),
        lambda: tl.nn.NormalizedSubmConv3d(3, 4, 3),
    ],
    ids=["subm", "conv", "transpose", "generative", "normalized"],
)
def test_meta_module_materialized_with_to_empty_gets_its_kernel_positions(make) -> None:
    """torch's deferred initialization: build on the meta device, ``to_empty()``, then
    ``reset_parameters()``. ``kernel_positions`` was left as uninitialized memory, so the
    module's state_dict saved garbage rows that no module would load back."""
    reference = make()
    with torch.device("meta"):
        deferred = make()
    assert deferred.kernel_positions.device.type == "meta"
    deferred.to_empty(device="cpu")
    deferred.kernel_positions.fill_(-7)  # what to_empty's uninitialized memory may hold
    deferred.reset_parameters()
    assert deferred.kernel_positions.dtype == torch.int32
    assert torch.equal(deferred.kernel_positions, reference.kernel_positions)
    reference.load_state_dict(deferred.state_dict())  # strict: loads
    assert torch.equal(reference.weight, deferred.weight)


@pytest.mark.parametrize(
    "cls",
    [
        tl.nn.SubmConv3d,
        tl.nn.Conv3d,
        tl.nn.ConvTranspose3d,
        tl.nn.GenerativeConvTranspose3d,
        tl.nn.NormalizedSubmConv3d,
        tl.nn.NormalizedConvTranspose3d,
    ],
)
def test_device_and_dtype_arguments_as_in_torch_conv3d(cls: type) -> None:
    """``torch.nn.Conv3d(..., device=, dtype=)``: every convolution module takes them too
    (they were a TypeError), for its weight and bias; ``kernel_positions`` stays int32."""
    m = cls(3, 4, 3 if "Subm" in cls.__name__ else 2, bias=True, device="cpu", dtype=F64)
    assert m.weight.dtype == F64 and m.bias.dtype == F64
    assert m.kernel_positions.dtype == torch.int32
    plain = cls(3, 4, 3 if "Subm" in cls.__name__ else 2, bias=True)
    assert torch.equal(m.kernel_positions, plain.kernel_positions)
    assert float(m.weight.abs().max()) <= float(plain.weight.abs().max()) * 2  # same bound
    meta = cls(3, 4, 3 if "Subm" in cls.__name__ else 2, device="meta")
    assert meta.weight.device.type == "meta" and meta.kernel_positions.device.type == "meta"
    with pytest.raises(TypeError, match="dtype must be a floating"):
        cls(3, 4, 3 if "Subm" in cls.__name__ else 2, dtype=torch.int32)
