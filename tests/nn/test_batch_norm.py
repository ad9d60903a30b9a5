"""Batch norm and its fused ReLU (``BatchNorm``, ``BatchNormReLU``,
``nn.functional.batch_norm``) against torch's ``BatchNorm1d`` (+ ``relu``) in float64:
outputs, running statistics, gradients of the input and the affine parameters, in
training and eval mode, for every feature dtype the C passes take and every CPU
instruction-set level."""

from __future__ import annotations

import pytest
import torch

import torch_lattice as tl
from torch_lattice import nn
from torch_lattice.nn import functional as F
from torch_lattice.nn.functional import norm as norm_functional

# float32 and the half types: the C passes; float64: torch's kernels.
DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float64]
# Error bounds relative to the largest value: two roundings of the dtype (float32: the
# cancellation of x * scale against shift when the mean is 150 standard deviations).
TOL = {torch.float32: 2e-5, torch.bfloat16: 8e-3, torch.float16: 1e-3, torch.float64: 1e-10}
# The input gradient in float32 cancels x * b against k the same way, with larger terms.
TOL_DX = {**TOL, torch.float32: 1e-4}
# Parameter gradients are float64 sums of exact products: float32 rounding of the result.
TOL_PARAM = {**{t: 1e-6 for t in TOL}, torch.float64: 1e-10}
# (rows, channels): two rows, an odd width, rows past one chunk of 64, a width past a
# 16 KiB block of half rows (4096 floats), more rows than 256 chunks of 64.
# Multiples of 32 take the passes' fixed-width loops (tl_norm_impl.h): 32 to 128 in one
# block of channels, 160 as 128 + 32, 448 as three blocks of 128 and one of 64.
# Widths of every kind of channel block (tl_norm_impl.h): run-time width (3, 37, 16),
# fixed (8, 24, 32, 48, 64, 96, 128), a multiple of 32 then a fixed rest (72 = 64 + 8,
# 80 = 32 + 48, 152 = 128 + 24, 200 = 128 + 64 + 8), blocks of 128 (160, 448).
SHAPES = [(2, 3), (65, 37), (300, 32), (1000, 64), (500, 96), (300, 128), (200, 160),
          (40, 448), (7, 4100), (20000, 8), (300, 16), (300, 24), (300, 48), (200, 72),
          (200, 80), (100, 152), (100, 200)]  # fmt: skip
ISAS = ["avx512", "avx2", "baseline"]


@pytest.fixture(autouse=True)
def _c_passes_at_every_size(monkeypatch: pytest.MonkeyPatch) -> None:
    """The tests' shapes are small: run them through the C passes, not torch's kernels."""
    monkeypatch.setattr(norm_functional, "C_PASSES_MIN_ELEMENTS", 0)


def _features(n: int, c: int, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    # A large common offset per channel: the variance must not cancel.
    return (torch.randn(n, c, generator=g) * 2 + torch.arange(c) % 7 * 50).to(dtype)


def _pair(c: int, relu: bool, **kwargs: object) -> tuple[torch.nn.Module, torch.nn.Module]:
    """(ours, torch's float64 twin with the same random parameters)."""
    ours = (nn.BatchNormReLU if relu else nn.BatchNorm)(c, **kwargs)  # type: ignore[arg-type]
    ref = torch.nn.BatchNorm1d(c, **kwargs).double()  # type: ignore[arg-type]
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        if ours.weight is not None:
            ours.weight.copy_(torch.rand(c, generator=g) + 0.5)
            ours.bias.copy_(torch.randn(c, generator=g))
            ref.weight.copy_(ours.weight)
            ref.bias.copy_(ours.bias)
    return ours, ref


def _sparse(feats: torch.Tensor) -> tl.SparseTensor:
    """``feats`` on a line of voxels (the layer ignores where they are)."""
    n = feats.shape[0]
    coords = torch.zeros(n, 4, dtype=torch.int32)
    coords[:, 1] = torch.arange(n, dtype=torch.int32)
    return tl.SparseTensor(feats, coords)


def _close(got: torch.Tensor, want: torch.Tensor, tol: float, what: str) -> None:
    scale = want.abs().max().clamp_min(1.0)
    err = (got.double() - want).abs().max() / scale
    assert err <= tol, f"{what}: relative error {float(err):.3g} > {tol}"


def _run(ours: torch.nn.Module, ref: torch.nn.Module, x: torch.Tensor, relu: bool):
    xs = _sparse(x.clone().requires_grad_())
    xr = x.double().requires_grad_()
    y = ours(xs).feats
    yr = ref(xr)
    dy = torch.randn(y.shape, generator=torch.Generator().manual_seed(2))
    if relu:
        # Where the pre-activation is within rounding of 0 the ReLU's cut may differ
        # between precisions (a whole dy either way): no gradient there.
        dy[yr.detach().abs() < 1e-3] = 0
        yr = torch.relu(yr)
    dy = dy.to(y.dtype)
    y.backward(dy)
    yr.backward(dy.double())
    return y, yr, xs.feats.grad, xr.grad


@pytest.mark.parametrize("relu", [False, True])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_training_matches_torch(dtype: torch.dtype, shape: tuple[int, int], relu: bool) -> None:
    n, c = shape
    ours, ref = _pair(c, relu)
    if dtype == torch.float64:
        ours.double()
    tol = TOL[dtype]
    for step in range(2):  # the second step starts from updated running statistics
        x = _features(n, c, dtype, seed=step)
        y, yr, dx, dxr = _run(ours, ref, x, relu)
        assert y.dtype == dtype and dx.dtype == dtype
        _close(y, yr, tol, "output")
        _close(dx, dxr, TOL_DX[dtype], "input gradient")
        for name in ("weight", "bias"):
            got, want = getattr(ours, name).grad, getattr(ref, name).grad
            _close(got, want, TOL_PARAM[dtype], f"{name} gradient")
            getattr(ours, name).grad = None
            getattr(ref, name).grad = None
        _close(ours.running_mean, ref.running_mean, 1e-6, "running_mean")
        _close(ours.running_var, ref.running_var, 1e-5, "running_var")
        assert int(ours.num_batches_tracked) == int(ref.num_batches_tracked) == step + 1


@pytest.mark.parametrize("relu", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
def test_eval_matches_torch(dtype: torch.dtype, relu: bool) -> None:
    n, c = 500, 24
    ours, ref = _pair(c, relu)
    with torch.no_grad():
        for m in (ours, ref):
            m.running_mean.copy_(torch.arange(c) * 10.0)
            m.running_var.copy_(torch.arange(c) + 0.5)
    ours.eval()
    ref.eval()
    if dtype == torch.float64:
        ours.double()
    before = ours.running_mean.clone(), ours.running_var.clone()
    y, yr, dx, dxr = _run(ours, ref, _features(n, c, dtype), relu)
    _close(y, yr, TOL[dtype], "output")
    _close(dx, dxr, TOL_DX[dtype], "input gradient")
    _close(ours.weight.grad, ref.weight.grad, TOL_PARAM[dtype], "weight gradient")
    _close(ours.bias.grad, ref.bias.grad, TOL_PARAM[dtype], "bias gradient")
    assert torch.equal(ours.running_mean, before[0]) and torch.equal(ours.running_var, before[1])


@pytest.mark.parametrize(
    "kwargs",
    [
        {"affine": False},
        {"momentum": None},
        {"momentum": 0.7, "eps": 1e-2},
        {"track_running_stats": False},
    ],
    ids=["no-affine", "cumulative", "momentum-eps", "no-running-stats"],
)
@pytest.mark.parametrize("training", [True, False])
def test_options_match_torch(kwargs: dict, training: bool) -> None:
    c = 9
    ours, ref = _pair(c, True, **kwargs)
    ours.train(training)
    ref.train(training)
    for step in range(3):
        x = _features(300, c, torch.float32, seed=step)
        y, yr, dx, dxr = _run(ours, ref, x, True)
        _close(y, yr, 2e-5, f"output, step {step}")
        _close(dx, dxr, 1e-4, f"input gradient, step {step}")
        if ours.running_mean is not None:
            _close(ours.running_mean, ref.running_mean, 1e-6, "running_mean")
            _close(ours.running_var, ref.running_var, 1e-5, "running_var")
        else:
            assert ref.running_mean is None


@pytest.mark.parametrize("isa", ISAS)
def test_every_instruction_set(isa: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCH_LATTICE_CPU_ISA", isa)
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        for c in (37, 32, 48, 72):
            ours, ref = _pair(c, True)
            y, yr, dx, dxr = _run(ours, ref, _features(1000, c, dtype), True)
            _close(y, yr, TOL[dtype], f"{isa} {dtype} C={c} output")
            _close(dx, dxr, TOL_DX[dtype], f"{isa} {dtype} C={c} input gradient")


def test_results_do_not_depend_on_threads() -> None:
    saved = torch.get_num_threads()
    results = []
    try:
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            ours, _ = _pair(64, True)
            x = _features(50000, 64, torch.float32).requires_grad_()
            y = ours(_sparse(x)).feats
            y.backward(torch.ones_like(y))
            results.append((y, x.grad, ours.weight.grad, ours.running_var))
    finally:
        torch.set_num_threads(saved)
    for other in results[1:]:
        for a, b in zip(results[0], other, strict=True):
            assert torch.equal(a, b)


def test_relu_keeps_nan_and_cuts_the_gradient_where_it_cut() -> None:
    c = 4
    x = torch.randn(10, c)
    x[3, 1] = float("nan")
    w, b = torch.ones(c, requires_grad=True), torch.zeros(c, requires_grad=True)
    rm, rv = torch.zeros(c), torch.ones(c)
    xr = x.clone().requires_grad_()
    y = F.batch_norm(xr, rm, rv, w, b, training=False, eps=0.0, relu=True)
    assert torch.isnan(y[3, 1])
    assert torch.equal(y[~torch.isnan(x)], torch.relu(x)[~torch.isnan(x)])
    y.backward(torch.ones_like(y))
    want = (x > 0).float()
    assert torch.equal(xr.grad, want)


def test_double_backward_matches_torch() -> None:
    c = 5
    x = _features(40, c, torch.float32).requires_grad_()
    xr = x.detach().double().requires_grad_()
    w = (torch.rand(c) + 0.5).requires_grad_()
    wr = w.detach().double().requires_grad_()
    y = F.batch_norm(x, None, None, w, None, training=True, relu=True)
    yr = torch.relu(torch.nn.functional.batch_norm(xr, None, None, wr, None, True))
    dy = torch.randn(40, c)
    (gx,) = torch.autograd.grad(y, x, dy, create_graph=True)
    (gxr,) = torch.autograd.grad(yr, xr, dy.double(), create_graph=True)
    gw = torch.autograd.grad(gx.pow(2).sum(), w)[0]
    gwr = torch.autograd.grad(gxr.pow(2).sum(), wr)[0]
    _close(gx, gxr.detach(), 1e-4, "gradient")
    _close(gw, gwr, 1e-3, "gradient of the gradient")


def test_features_modified_in_place_after_forward_are_caught() -> None:
    x = _features(20, 3, torch.float32).requires_grad_()
    h = x * 1.0
    y = F.batch_norm(h, None, None, training=True, relu=True)
    h.add_(1.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()


def test_non_contiguous_features() -> None:
    x = _features(64, 30, torch.float32).t().contiguous().t()  # (30, 64) columns view
    assert not x.is_contiguous()
    y = F.batch_norm(x, None, None, training=True)
    want = torch.nn.functional.batch_norm(x.double(), None, None, training=True)
    _close(y, want, 2e-5, "output")


def test_batch_norm_relu_loads_a_batch_norm_then_relu_checkpoint() -> None:
    old = torch.nn.Sequential(nn.SubmConv3d(4, 8, 3), nn.BatchNorm(8), nn.ReLU())
    new = torch.nn.Sequential(nn.SubmConv3d(4, 8, 3), nn.BatchNormReLU(8))
    with torch.no_grad():
        old[1].running_mean.uniform_()
        old[1].weight.uniform_()
    new.load_state_dict(old.state_dict(), strict=True)
    coords = torch.randint(0, 6, (200, 3), dtype=torch.int32)
    coords = torch.unique(coords, dim=0)
    st = tl.SparseTensor(
        torch.randn(coords.shape[0], 4),
        torch.cat([torch.zeros(coords.shape[0], 1, dtype=torch.int32), coords], 1),
    )
    for mode in (True, False):
        old.train(mode)
        new.train(mode)
        torch.testing.assert_close(new(st).feats, old(st).feats)


def test_fold_leaves_the_relu_of_batch_norm_relu() -> None:
    model = torch.nn.Sequential(nn.SubmConv3d(4, 8, 3), nn.BatchNormReLU(8)).eval()
    with torch.no_grad():
        model[1].running_mean.uniform_(-1, 1)
        model[1].bias.uniform_(-1, 1)
    folded = nn.fold_batch_norm(model)
    assert isinstance(folded[1], nn.ReLU)
    coords = torch.unique(torch.randint(0, 6, (200, 3), dtype=torch.int32), dim=0)
    st = tl.SparseTensor(
        torch.randn(coords.shape[0], 4),
        torch.cat([torch.zeros(coords.shape[0], 1, dtype=torch.int32), coords], 1),
    )
    want = model(st).feats
    assert (want == 0).any()  # the ReLU cut something
    torch.testing.assert_close(folded(st).feats, want, rtol=1e-5, atol=1e-5)


def _lattice_ops_run(fn) -> set[str]:
    with torch.profiler.profile() as prof:
        fn()
    return {e.key for e in prof.key_averages() if e.key.startswith("lattice::batch_norm")}


def test_small_inputs_run_torch_kernels_and_large_ones_the_c_passes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(norm_functional, "C_PASSES_MIN_ELEMENTS", 1 << 18)
    w, b = torch.ones(64, requires_grad=True), torch.zeros(64, requires_grad=True)
    for n, c_passes in ((4095, False), (4096, True)):
        x = _features(n, 64, torch.float32).requires_grad_()
        ops = _lattice_ops_run(lambda x=x: F.batch_norm(x, None, None, w, b, True, relu=True))
        assert ("lattice::batch_norm_stats" in ops) == c_passes, (n, ops)
        y = F.batch_norm(x, None, None, w, b, True, relu=True)
        w64, b64 = w.double(), b.double()
        want_y = torch.relu(torch.nn.functional.batch_norm(x.double(), None, None, w64, b64, True))
        _close(y.detach(), want_y.detach(), 1e-4, f"output at {n} rows")  # torch: 2.4e-5


def test_bad_momentum_and_eps() -> None:
    x = _features(10, 3, torch.float32)
    with pytest.raises(TypeError, match="batch_norm: momentum must be a number, got NoneType"):
        F.batch_norm(x, torch.zeros(3), torch.ones(3), training=True, momentum=None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="batch_norm: eps must be non-negative, got -1"):
        F.batch_norm(x, None, None, training=True, eps=-1.0)


def test_convert_sync_batchnorm_gives_a_model_that_names_why_it_fails() -> None:
    # BatchNorm subclasses torch's BatchNorm1d (its state dict), so torch's conversion
    # replaces it with a dense SyncBatchNorm, which cannot take a SparseTensor: the
    # first forward names the conversion (it raised a bare "no attribute 'dim'").
    model = torch.nn.Sequential(nn.BatchNorm(3), nn.BatchNormReLU(3))
    converted = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)
    assert all(type(m) is torch.nn.SyncBatchNorm for m in converted)
    x = _sparse(_features(5, 3, torch.float32))
    with pytest.raises(AttributeError, match=r"no attribute 'dim': a SparseTensor is not a "
                       r"torch\.Tensor.*convert_sync_batchnorm .*does not apply") as info:
        converted(x)
    assert info.value.name == "dim"
    # Attributes a torch.Tensor has not either keep the plain message.
    with pytest.raises(AttributeError, match=r"^'SparseTensor' object has no attribute 'featz'$"):
        x.featz  # noqa: B018
    assert not hasattr(x, "dim")
