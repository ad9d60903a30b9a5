"""The library inside PyTorch's mixed precision and function transforms: under
``torch.autocast`` every convolution runs in the autocast dtype (as ``torch.nn.Conv3d``
does) with float32 gradients for float32 parameters; forward-mode AD, which the ops have
no rule for, raises instead of returning a zero tangent."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.func as tf
from torch.autograd import forward_ad

import torch_lattice as tl

HALVES = [torch.bfloat16, torch.float16]

# torch's forward AD loads its jvp decompositions through torch.jit.script, which warns
# that it is deprecated: torch's own doing, not this library's.
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated")


def _scene(dtype: torch.dtype = torch.float32, stride: int = 1) -> tl.SparseTensor:
    gen = torch.Generator().manual_seed(0)
    coords = torch.unique(torch.randint(0, 8, (400, 4), generator=gen)
                          % torch.tensor([2, 8, 8, 8]), dim=0)
    return tl.SparseTensor(torch.randn(len(coords), 4, generator=gen, dtype=dtype), coords,
                           stride=stride)


def _layers() -> dict[str, Callable[[tl.SparseTensor], tl.SparseTensor]]:
    torch.manual_seed(0)
    subm = tl.nn.SubmConv3d(4, 4, 3, bias=True)
    down = tl.nn.Conv3d(4, 4, 2, stride=2, bias=True)
    up = tl.nn.ConvTranspose3d(4, 4, 2, stride=2, bias=True)
    gen = tl.nn.GenerativeConvTranspose3d(4, 4, 2, stride=2)
    point = tl.nn.Conv3d(4, 4, 1)
    return {
        "submanifold": subm,
        "strided": down,
        "pointwise": point,
        "inverse transpose": lambda x: up(down(x)),
        "target transpose": lambda x: up(down(x), x),
        "generative": lambda x: gen(down(x)),
    }


@pytest.mark.parametrize("dtype", HALVES)
def test_convolutions_run_in_the_autocast_dtype(dtype: torch.dtype) -> None:
    x = _scene()
    tol = 3e-2 if dtype == torch.bfloat16 else 3e-3
    for name, layer in _layers().items():
        want = layer(x).feats.detach()
        with torch.autocast("cpu", dtype=dtype):
            y = layer(x)
        assert y.feats.dtype == dtype, name
        got = y.feats.detach().float()
        assert float((got - want).abs().max()) <= tol * float(want.abs().max()), name
        y.feats.float().sum().backward()
    for p in tl.nn.SubmConv3d(4, 4, 3).parameters():
        assert p.dtype == torch.float32


def test_float32_parameters_get_float32_gradients_under_autocast() -> None:
    x = _scene()
    conv = tl.nn.SubmConv3d(4, 4, 3, bias=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = conv(x)
    y.feats.float().square().sum().backward()
    assert conv.weight.grad is not None and conv.weight.grad.dtype == torch.float32
    assert conv.bias is not None and conv.bias.grad is not None
    assert conv.bias.grad.dtype == torch.float32


def test_a_layer_after_an_autocast_linear_takes_its_output() -> None:
    """The failure a user meets first: a point MLP under autocast feeds a convolution."""
    gen = torch.Generator().manual_seed(1)
    points, feats = torch.rand(500, 3, generator=gen) * 8, torch.randn(500, 4, generator=gen)
    mlp, conv = torch.nn.Linear(4, 4), tl.nn.SubmConv3d(4, 4, 3)
    norm = tl.nn.NormalizedSubmConv3d(4, 4, 3)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        v = tl.voxelize(points, mlp(feats))
        assert v.feats.dtype == torch.bfloat16
        assert conv(v).feats.dtype == torch.bfloat16
        norm(v).feats.float().sum().backward()
    assert norm.weight.grad is not None and norm.weight.grad.dtype == torch.float32
    with pytest.raises(TypeError, match="does not match weight dtype"):
        conv(v)  # outside autocast: mixed dtypes are still an error naming both


def test_float64_is_left_alone_by_autocast() -> None:
    x = _scene(torch.float64)
    conv = tl.nn.SubmConv3d(4, 4, 3).double()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = conv(x)
    assert y.feats.dtype == torch.float64
    torch.testing.assert_close(y.feats, conv(x).feats, rtol=0, atol=0)


def _jvp_cases() -> dict[str, Callable[[torch.Tensor], torch.Tensor]]:
    x = _scene(torch.float64)
    subm = tl.nn.SubmConv3d(4, 4, 3).double()
    down = tl.nn.Conv3d(4, 4, 2, stride=2).double()
    up = tl.nn.ConvTranspose3d(4, 4, 2, stride=2).double()
    coarse = down(x).detach()
    points = torch.rand(x.coords.shape[0], 3, dtype=torch.float64) * 5
    return {
        "convolution": lambda f: subm(x.replace(f)).feats,
        "target transpose": lambda f: up(coarse.replace(f[: coarse.coords.shape[0]]), x).feats,
        "max pooling": lambda f: tl.nn.MaxPool3d(2, 2)(x.replace(f)).feats,
        "avg pooling": lambda f: tl.nn.AvgPool3d(2, 2)(x.replace(f)).feats,
        "voxelize": lambda f: tl.voxelize(points, f).feats,
    }


@pytest.mark.parametrize("case", list(_jvp_cases()))
def test_differentiating_transforms_raise_instead_of_a_wrong_derivative(case: str) -> None:
    """jvp returned a zero tangent (silently wrong), grad / vjp an error about torch's
    setup_context that did not name the library."""
    fn = _jvp_cases()[case]
    f = _scene(torch.float64).feats
    match = "not supported by torch_lattice's ops"
    with pytest.raises(NotImplementedError, match=match):
        tf.jvp(fn, (f,), (torch.ones_like(f),))
    with forward_ad.dual_level(), pytest.raises(NotImplementedError, match=match):
        fn(forward_ad.make_dual(f, torch.ones_like(f)))
    for transform in (tf.grad, tf.jacrev):
        with pytest.raises(NotImplementedError, match=match):
            transform(lambda g: fn(g).sum())(f)
    fn(f)  # outside a transform: runs


def test_reverse_mode_autograd_and_vmap_still_work() -> None:
    x = _scene(torch.float64)
    conv = tl.nn.SubmConv3d(4, 4, 3).double()

    def fn(f: torch.Tensor) -> torch.Tensor:
        return conv(x.replace(f)).feats

    f = x.feats
    v = torch.ones_like(fn(f))
    _, (vjp,) = torch.autograd.functional.vjp(fn, (f,), v)
    leaf = f.clone().requires_grad_()
    (grad,) = torch.autograd.grad(fn(leaf), leaf, v)
    torch.testing.assert_close(vjp, grad, rtol=0, atol=0)
    batched = tf.vmap(fn)(torch.stack([f, 2 * f]))
    torch.testing.assert_close(batched[1], 2 * fn(f), rtol=0, atol=1e-12)


def test_what_a_transform_does_not_differentiate_runs() -> None:
    """Inside torch.func.grad / jvp, a detached operand or a no_grad call (a stop-gradient
    target, a frozen extractor) is no derivative of the op: it runs as outside."""
    x = _scene(torch.float64)
    conv = tl.nn.SubmConv3d(4, 4, 3).double()
    f = x.feats

    def loss(g: torch.Tensor) -> torch.Tensor:
        return ((g - conv(x.replace(g.detach())).feats) ** 2).sum()

    def loss_no_grad(g: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            target = conv(x.replace(g)).feats
        return ((g - target) ** 2).sum()

    target = conv(x).feats.detach()
    for fn in (loss, loss_no_grad):
        torch.testing.assert_close(tf.grad(fn)(f), 2 * (f - target))
    _, tangent = tf.jvp(loss, (f,), (torch.ones_like(f),))
    torch.testing.assert_close(tangent, (2 * (f - target)).sum())
    # no_grad does not stop forward-mode tangents: that one is still refused.
    with pytest.raises(NotImplementedError, match="not supported by torch_lattice's ops"):
        tf.jvp(loss_no_grad, (f,), (torch.ones_like(f),))


@pytest.mark.parametrize("scale", [0.0, 1e-3, 1.0])
def test_normalized_convolutions_under_float16_autocast_stay_finite(scale: float) -> None:
    """Their denominator conv(1, W^2) + eps is summed in float32: in float16 squared
    weights below 6e-8 vanished and eps rounded to 0 (NaN for zero weights)."""
    x = _scene()
    norm = tl.nn.NormalizedSubmConv3d(4, 4, 3)
    with torch.no_grad():
        norm.weight.mul_(scale)
    want = norm(x).feats.detach()
    with torch.autocast("cpu", dtype=torch.float16):
        got = norm(x).feats.detach()
    assert torch.isfinite(got).all()
    assert float((got.float() - want).abs().max()) <= 5e-3 * max(float(want.abs().max()), 1e-6)


def test_devoxelize_refuses_a_tangent_on_the_points() -> None:
    gen = torch.Generator().manual_seed(2)
    points = torch.rand(40, 3, generator=gen, dtype=torch.float64) * 4
    voxels = tl.voxelize(points, torch.randn(40, 2, generator=gen, dtype=torch.float64))
    with forward_ad.dual_level(), pytest.raises(NotImplementedError, match="devoxelize"):
        tl.devoxelize(forward_ad.make_dual(points, torch.ones_like(points)), voxels,
                      interpolation="trilinear")


def test_sparse_tensors_built_inside_a_transform() -> None:
    """A SparseTensor built inside torch.func.grad / jvp: its coordinate copy is a
    storage-less wrapper there, which the duplicate check could not read ("Cannot access
    data pointer"); now the convolution gives its own NotImplementedError, and what the
    transform does not differentiate (a call under no_grad inside grad) runs."""
    coords = torch.tensor([[0, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0], [0, 1, 1, 1]])
    conv = tl.nn.SubmConv3d(3, 2, 3)
    f = torch.randn(4, 3)
    with pytest.raises(NotImplementedError, match="not supported by torch_lattice's ops"):
        tf.grad(lambda f: conv(tl.SparseTensor(f, coords)).feats.sum())(f)
    with pytest.raises(NotImplementedError, match="not supported by torch_lattice's ops"):
        tf.jvp(lambda f: conv(tl.SparseTensor(f, coords)).feats, (f,), (torch.ones_like(f),))

    def loss(v: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            y = conv(tl.SparseTensor(torch.ones(4, 3), coords)).feats.sum()
        return (v * v).sum() + y

    v = torch.randn(5)
    torch.testing.assert_close(tf.grad(loss)(v), 2 * v)
