"""The ``lattice::batch_norm_*`` ops on their own: torch.library's opcheck (schema,
fake kernels) and their argument checks.  Their numbers are tested through
``nn.functional.batch_norm`` in tests/nn/test_batch_norm.py."""

from __future__ import annotations

import pytest
import torch

from torch_lattice.ops import norm as ops


def _args(dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(50, 6, generator=g).to(dtype)
    dy = torch.randn(50, 6, generator=g).to(dtype)
    scale, shift = torch.rand(6, generator=g) + 0.5, torch.randn(6, generator=g)
    return x, dy, scale, shift


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_opcheck(dtype: torch.dtype) -> None:
    x, dy, scale, shift = _args(dtype)
    mean = x.double().mean(0)
    torch.library.opcheck(ops.batch_norm_stats, (x,))
    torch.library.opcheck(ops.batch_norm_apply, (x, scale, shift, True))
    torch.library.opcheck(ops.batch_norm_backward_reduce, (dy, x, scale, shift, mean, True))
    torch.library.opcheck(
        ops.batch_norm_backward_apply, (dy, x, scale, shift, scale, shift, scale, False)
    )
    torch.library.opcheck(
        ops.batch_norm_backward_apply, (dy, x, scale, shift, scale, None, None, True)
    )


def test_the_passes_compute_their_formulas() -> None:
    x, dy, scale, shift = _args()
    mean, var = ops.batch_norm_stats(x)
    # float partial sums over 16 rows, then float64: float rounding of the sums
    sums = {"rtol": 1e-6, "atol": 1e-6}
    torch.testing.assert_close(mean, x.double().mean(0), **sums)
    torch.testing.assert_close(var, x.double().var(0, unbiased=False), **sums)
    pre = x * scale + shift
    torch.testing.assert_close(ops.batch_norm_apply(x, scale, shift, True), pre.clamp_min(0))
    g = torch.where(pre > 0, dy, 0.0).double()
    sum_g, sum_gx = ops.batch_norm_backward_reduce(dy, x, scale, shift, mean, True)
    torch.testing.assert_close(sum_g, g.sum(0), **sums)
    torch.testing.assert_close(sum_gx, (g * (x.double() - mean)).sum(0), **sums)
    a, b, k = scale, shift, scale * 2
    dx = ops.batch_norm_backward_apply(dy, x, scale, shift, a, b, k, True)
    torch.testing.assert_close(dx, g.float() * a + x * b + k)


@pytest.mark.parametrize("isa", ["avx512", "avx2", "baseline"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("c", [3, 24, 1024, 1100])
def test_half_passes_are_the_float32_passes_rounded(
    isa: str, dtype: torch.dtype, c: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # With AVX-512 half types are converted in registers; below, widened block by block
    # (4 KiB of floats in these passes, a row at a time from C = 1024 on) into the float32
    # loops. Either way: the float32 pass's values, rounded once.
    monkeypatch.setenv("TORCH_LATTICE_CPU_ISA", isa)
    g = torch.Generator().manual_seed(c)
    x = (torch.randn(1001, c, generator=g) * 3).to(dtype)
    dy = torch.randn(1001, c, generator=g).to(dtype)
    scale, shift, a, b, k = (torch.randn(c, generator=g) for _ in range(5))
    for relu in (False, True):
        got = ops.batch_norm_apply(x, scale, shift, relu)
        want = ops.batch_norm_apply(x.float(), scale, shift, relu).to(dtype)
        assert torch.equal(got.view(torch.int16), want.view(torch.int16))
        got = ops.batch_norm_backward_apply(dy, x, scale, shift, a, b, k, relu)
        want = ops.batch_norm_backward_apply(dy.float(), x.float(), scale, shift, a, b, k, relu)
        assert torch.equal(got.view(torch.int16), want.to(dtype).view(torch.int16))


def test_bad_arguments() -> None:
    x, dy, scale, shift = _args()
    with pytest.raises(ValueError, match=r"batch_norm_stats: features must be \(N, C\)"):
        ops.batch_norm_stats(x[0])
    with pytest.raises(TypeError, match="batch_norm_apply: features must be float32, bfloat16"):
        ops.batch_norm_apply(x.double(), scale, shift, False)
    with pytest.raises(ValueError, match="batch_norm_backward_reduce: gradient and features"):
        ops.batch_norm_backward_reduce(dy[:10], x, scale, shift, scale.double(), False)
    with pytest.raises(ValueError, match="batch_norm_stats: needs at least one row"):
        ops.batch_norm_stats(x[:0])
    with pytest.raises(ValueError, match="give both b and k, or neither"):
        ops.batch_norm_backward_apply(dy, x, scale, shift, scale, shift, None, False)


@pytest.mark.parametrize(
    ("call", "name"),
    [
        (lambda x, dy, s, t, v: ops.batch_norm_apply(x, v, t, False), "scale"),
        (lambda x, dy, s, t, v: ops.batch_norm_apply(x, s, v, True), "shift"),
        (lambda x, dy, s, t, v: ops.batch_norm_backward_reduce(dy, x, v, t, s.double(), True),
         "scale"),
        (lambda x, dy, s, t, v: ops.batch_norm_backward_reduce(dy, x, s, t, v, False), "mean"),
        (lambda x, dy, s, t, v: ops.batch_norm_backward_apply(dy, x, s, t, v, None, None, False),
         "a"),
        (lambda x, dy, s, t, v: ops.batch_norm_backward_apply(dy, x, s, t, s, v, t, False), "b"),
        (lambda x, dy, s, t, v: ops.batch_norm_backward_apply(dy, x, s, t, s, t, v, True), "k"),
    ],
)  # fmt: skip
def test_per_channel_coefficients_are_named_with_their_rule(call, name: str) -> None:
    # A wrong-sized coefficient raised "internal error: per-channel vector of shape ...";
    # a complex or integer one was cast (the imaginary part dropped with a warning).
    x, dy, scale, shift = _args()
    shape_rule = rf"batch_norm_\w+: {name} must have shape \(C,\) = \(6,\), one coefficient"
    with pytest.raises(ValueError, match=shape_rule):
        call(x, dy, scale, shift, scale[:5])
    for dtype in (torch.complex64, torch.int64, torch.bool):
        dtype_rule = rf"batch_norm_\w+: {name} must be a floating \(C,\) tensor .*got {dtype}"
        with pytest.raises(TypeError, match=dtype_rule):
            call(x, dy, scale, shift, torch.ones(6).to(dtype))
