"""Per-op semantics of the artifact replay executors against the contract's definitions.

Each expected value is computed here with plain torch/Python math written from the
contract's definition of the op (lattice-contract 0.6 / MLX Lattice's lowering), not by
calling the library function the executor uses. Executors are called directly with a
hand-built :class:`Operation`, so every enum value and attribute meaning is exercised
without writing a whole artifact.
"""

from __future__ import annotations

import math
from itertools import product
from typing import Any

import pytest
import torch

from torch_lattice.artifact import schema
from torch_lattice.artifact.mlir_parse import Operation, Packing
from torch_lattice.artifact.replay_ops import EXECUTORS, ReplayContext
from torch_lattice.artifact.replay_weights import WeightValue
from torch_lattice.tensor import SparseTensor

CTX = ReplayContext(weights={}, logical=True)
PHYS = ReplayContext(weights={}, logical=False)


def _op(name: str, **attrs: Any) -> Operation:
    spec = schema.OPS[name]
    operands = tuple(f"v{i}" for i in range(len(spec.operands)))
    return Operation(line=1, spec=spec, results=("r",), operands=operands, attributes=attrs,
                     result_types=())


def _run(name: str, args: list[Any], ctx: ReplayContext = CTX, **attrs: Any) -> Any:
    out = EXECUTORS[name](ctx, _op(name, **attrs), args)
    return out[0] if len(out) == 1 else out


def _w(t: torch.Tensor, family: str) -> WeightValue:
    return WeightValue("k", family, schema.WEIGHT_FAMILY_LAYOUTS[family], Packing("dense"),
                       (t.to(torch.float32),))


def _sp(rows: dict[tuple[int, int, int, int], list[float]],
        stride: tuple[int, int, int] = (1, 1, 1)) -> SparseTensor:
    coords = torch.tensor(list(rows), dtype=torch.int32).reshape(-1, 4)
    feats = torch.tensor(list(rows.values()), dtype=torch.float32)
    return SparseTensor(feats, coords, stride=stride)


def _rows(x: SparseTensor) -> dict[tuple[int, ...], list[float]]:
    return {tuple(c): f for c, f in zip(x.coords.tolist(), x.feats.tolist(), strict=True)}


def _same(x: SparseTensor, expected: dict[tuple[int, ...], list[float]],
          stride: tuple[int, int, int] | None = None) -> None:
    got = _rows(x)
    assert set(got) == set(expected)
    for c, f in expected.items():
        assert got[c] == pytest.approx(f, rel=1e-5, abs=1e-6), c
    if stride is not None:
        assert x.stride == stride


X = torch.tensor([[-3.0, -1.0, -0.25, 0.0], [0.5, 1.0, 2.0, 30.0]])


# --- activation -----------------------------------------------------------------------


def _act(kind: str, approximate: str = "none", alpha: float = 0.01, beta: float = 1.0,
         threshold: float = 20.0) -> torch.Tensor:
    return _run("activation", [X], kind=kind, approximate=approximate, alpha=alpha, beta=beta,
                threshold=threshold)


def _map(fn: Any) -> torch.Tensor:
    return torch.tensor([[fn(v) for v in row] for row in X.tolist()])


def test_activation_plain_kinds() -> None:
    sig = lambda v: 1.0 / (1.0 + math.exp(-v))  # noqa: E731
    cases = {"relu": lambda v: max(v, 0.0), "sigmoid": sig, "silu": lambda v: v * sig(v),
             "tanh": math.tanh}
    for kind, fn in cases.items():
        torch.testing.assert_close(_act(kind), _map(fn))


def test_activation_leaky_relu_alpha_is_the_negative_slope() -> None:
    torch.testing.assert_close(_act("leaky_relu", alpha=0.2),
                               _map(lambda v: v if v >= 0 else 0.2 * v))


@pytest.mark.parametrize("beta,threshold", [(1.0, 20.0), (2.0, 3.0), (0.5, 0.4)])
def test_activation_softplus_beta_and_threshold(beta: float, threshold: float) -> None:
    # x when beta * x > threshold, else log(1 + exp(beta * x)) / beta
    def fn(v: float) -> float:
        return v if beta * v > threshold else math.log1p(math.exp(beta * v)) / beta

    torch.testing.assert_close(_act("softplus", beta=beta, threshold=threshold), _map(fn))


def test_activation_softplus_refuses_non_positive_beta() -> None:
    with pytest.raises(ValueError, match="beta"):
        _act("softplus", beta=0.0)


@pytest.mark.parametrize("approximate", ["none", "precise", "tanh", "fast"])
def test_activation_gelu_approximations(approximate: str) -> None:
    def fn(v: float) -> float:
        if approximate in ("none", "precise"):
            return 0.5 * v * (1.0 + math.erf(v / math.sqrt(2.0)))
        if approximate == "tanh":
            inner = math.sqrt(2.0 / math.pi) * (v + 0.044715 * v**3)
            return 0.5 * v * (1.0 + math.tanh(inner))
        return v / (1.0 + math.exp(-1.702 * v))

    torch.testing.assert_close(_act("gelu", approximate=approximate), _map(fn))


# --- elementwise, softmax ------------------------------------------------------------


def test_elementwise_exp_and_round_half_to_even() -> None:
    v = torch.tensor([[-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 0.49, -0.51, 3.7]])
    torch.testing.assert_close(_run("elementwise", [v], kind="exp"), _map_v(v, math.exp))
    want = torch.tensor([[-2.0, -2.0, -0.0, 0.0, 2.0, 2.0, 0.0, -1.0, 4.0]])
    torch.testing.assert_close(_run("elementwise", [v], kind="round"), want)
    with pytest.raises(ValueError, match="kind"):
        _run("elementwise", [v], kind="floor")


def _map_v(v: torch.Tensor, fn: Any) -> torch.Tensor:
    return torch.tensor([[fn(a) for a in row] for row in v.tolist()])


def test_softmax_last_axis_only() -> None:
    def ref(row: list[float]) -> list[float]:
        m = max(row)
        e = [math.exp(a - m) for a in row]
        return [a / sum(e) for a in e]

    want = torch.tensor([ref(r) for r in X.tolist()])
    torch.testing.assert_close(_run("softmax", [X], axis=-1), want)
    torch.testing.assert_close(_run("softmax", [X], axis=1), want)
    with pytest.raises(ValueError, match="axis"):
        _run("softmax", [X], axis=0)


# --- norms, linear, embedding ---------------------------------------------------------


def test_batch_norm_uses_frozen_stats_and_eps() -> None:
    scale, bias = torch.tensor([1.0, 2.0, -1.0, 0.5]), torch.tensor([0.1, 0.0, 0.3, -2.0])
    mean, var = torch.tensor([0.0, 1.0, -1.0, 2.0]), torch.tensor([1.0, 4.0, 0.25, 0.0])
    eps = 0.5
    got = _run("batch_norm", [X, *(_w(t, "channel") for t in (scale, bias, mean, var))], eps=eps)
    want = torch.tensor([[(X[r, c].item() - mean[c].item()) / math.sqrt(var[c].item() + eps)
                          * scale[c].item() + bias[c].item() for c in range(4)]
                         for r in range(2)])
    torch.testing.assert_close(got, want)


def test_layer_norm_and_rms_norm_per_row() -> None:
    scale, bias, eps = torch.tensor([1.0, 2.0, -1.0, 0.5]), torch.tensor([0.1, 0.0, 0.3, -2.0]), 0.1
    ln = _run("layer_norm", [X, _w(scale, "channel"), _w(bias, "channel")], eps=eps)
    rms = _run("rms_norm", [X, _w(scale, "channel")], eps=eps)
    for r, row in enumerate(X.tolist()):
        mu = sum(row) / 4
        var = sum((a - mu) ** 2 for a in row) / 4  # biased, as layer norm
        ms = sum(a * a for a in row) / 4
        for c in range(4):
            want_ln = (row[c] - mu) / math.sqrt(var + eps) * scale[c].item() + bias[c].item()
            want_rms = row[c] / math.sqrt(ms + eps) * scale[c].item()
            assert ln[r, c].item() == pytest.approx(want_ln, rel=1e-5, abs=1e-6)
            assert rms[r, c].item() == pytest.approx(want_rms, rel=1e-5, abs=1e-6)


@pytest.mark.parametrize("eps", [0.0, -1e-5])
def test_norms_refuse_non_positive_eps(eps: float) -> None:
    c = _w(torch.ones(4), "channel")
    for name, args in (("batch_norm", [X, c, c, c, c]), ("layer_norm", [X, c, c]),
                       ("rms_norm", [X, c])):
        with pytest.raises(ValueError, match="eps"):
            _run(name, args, eps=eps)


def test_linear_is_x_times_w_transposed_plus_bias() -> None:
    w = torch.tensor([[1.0, 0.0, -1.0, 2.0], [0.5, 0.5, 0.5, 0.5], [0.0, 3.0, 0.0, 0.0]])
    b = torch.tensor([1.0, -1.0, 0.0])
    got = _run("linear", [X, _w(w, "linear"), _w(b, "bias")])
    want = [[sum(X[r, i].item() * w[o, i].item() for i in range(4)) + b[o].item()
             for o in range(3)] for r in range(2)]
    torch.testing.assert_close(got, torch.tensor(want))
    torch.testing.assert_close(_run("linear", [X, _w(w, "linear")]), torch.tensor(want) - b)


def test_embedding_lookup_gathers_rows() -> None:
    table = torch.arange(12, dtype=torch.float32).reshape(4, 3)
    idx = torch.tensor([3, 0, 0, 2], dtype=torch.int32)
    got = _run("embedding_lookup", [idx, _w(table, "embedding")])
    torch.testing.assert_close(got, torch.tensor([table[i].tolist() for i in (3, 0, 0, 2)]))


# --- global_pool ------------------------------------------------------------------------


GP = {(0, 0, 0, 0): [1.0, -4.0], (0, 1, 0, 0): [3.0, 2.0], (2, 5, 5, 5): [-1.0, 7.0]}


@pytest.mark.parametrize("batch_size", [-1, 3, 5])
def test_global_pool_modes_and_empty_batches(batch_size: int) -> None:
    x = _sp(GP)
    rows = 3 if batch_size < 0 else batch_size  # negative: max(batch) + 1
    per: dict[int, list[list[float]]] = {b: [] for b in range(rows)}
    for c, f in GP.items():
        per[c[0]].append(f)
    sums = [[sum(col) for col in zip(*per[b], strict=True)] if per[b] else [0.0, 0.0]
            for b in range(rows)]
    avgs = [[s / len(per[b]) for s in sums[b]] if per[b] else [0.0, 0.0] for b in range(rows)]
    torch.testing.assert_close(_run("global_pool", [x], mode="sum", batch_size=batch_size),
                               torch.tensor(sums))
    torch.testing.assert_close(_run("global_pool", [x], mode="avg", batch_size=batch_size),
                               torch.tensor(avgs))
    # max has no neutral value: an empty batch (batch 1 here) is refused.
    with pytest.raises(ValueError):
        _run("global_pool", [x], mode="max", batch_size=batch_size)


def test_global_pool_max_without_empty_batches() -> None:
    x = _sp({k: v for k, v in GP.items() if k[0] == 0})
    got = _run("global_pool", [x], mode="max", batch_size=-1)
    torch.testing.assert_close(got, torch.tensor([[3.0, 2.0]]))


# --- coordinate-aligned algebra --------------------------------------------------------


L = {(0, 0, 0, 0): [1.0, 2.0], (0, 1, 0, 0): [3.0, -4.0], (1, 0, 0, 1): [5.0, 6.0]}
R = {(0, 1, 0, 0): [10.0, 20.0], (1, 0, 0, 1): [-1.0, 1.0], (1, 2, 2, 2): [7.0, 8.0]}
JOIN_KEYS = {"inner": set(L) & set(R), "left": set(L), "right": set(R), "outer": set(L) | set(R)}
BINARY = {"add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
          "maximum": max, "minimum": min}


@pytest.mark.parametrize("join", list(JOIN_KEYS))
@pytest.mark.parametrize("kind", list(BINARY))
def test_sparse_binary_joins_and_fills(kind: str, join: str) -> None:
    lf, rf = -2.5, 0.75
    got = _run("sparse.binary", [_sp(L), _sp(R)], op=kind, join=join, lhs_fill=lf, rhs_fill=rf)
    want = {c: [BINARY[kind](a, b) for a, b in zip(L.get(c, [lf, lf]), R.get(c, [rf, rf]),
                                                    strict=True)]
            for c in JOIN_KEYS[join]}
    _same(got, want)


@pytest.mark.parametrize("join", list(JOIN_KEYS))
def test_sparse_cat_joins_fill_zero(join: str) -> None:
    got = _run("sparse.cat", [_sp(L), _sp(R)], join=join)
    _same(got, {c: L.get(c, [0.0, 0.0]) + R.get(c, [0.0, 0.0]) for c in JOIN_KEYS[join]})


def test_sparse_reindex_onto_target_with_fill() -> None:
    got = _run("sparse.reindex", [_sp(L), _sp(R)], fill=-9.0)
    assert got.coords.tolist() == [list(c) for c in R]  # the target's rows, in its order
    _same(got, {c: L.get(c, [-9.0, -9.0]) for c in R})


def test_with_features_keeps_support() -> None:
    x = _sp(L, stride=(2, 2, 2))
    f = torch.tensor([[1.0], [2.0], [3.0]])
    got = _run("sparse.with_features", [x, f])
    assert got.coords.tolist() == x.coords.tolist() and got.stride == (2, 2, 2)
    torch.testing.assert_close(got.feats, f)


def test_make_and_decompose_physical_and_logical_stride() -> None:
    coords = torch.tensor([[0, 2, 4, 6], [1, 0, 2, 8], [0, 9, 9, 9]], dtype=torch.int32)
    feats = torch.tensor([[1.0], [2.0], [3.0]])
    active = torch.tensor([2], dtype=torch.int32)
    x = _run("sparse.make", [coords, feats, active], PHYS, stride=(2, 2, 2),
             coord_order="batch_x_y_z")
    _same(x, {(0, 1, 2, 3): [1.0], (1, 0, 1, 4): [2.0]}, stride=(2, 2, 2))
    c, f, a = _run("sparse.decompose", [x], PHYS)
    assert c.tolist() == coords[:2].tolist() and a.tolist() == [2]
    torch.testing.assert_close(f, feats[:2])
    y = _run("sparse.make", [coords, feats, active], CTX, stride=(2, 2, 2),
             coord_order="batch_x_y_z")
    _same(y, {(0, 2, 4, 6): [1.0], (1, 0, 2, 8): [2.0]}, stride=(2, 2, 2))
    with pytest.raises(ValueError, match="divisible"):
        _run("sparse.make", [coords, feats, torch.tensor([3], dtype=torch.int32)], PHYS,
             stride=(2, 2, 2), coord_order="batch_x_y_z")


# --- points ------------------------------------------------------------------------------


PTS = torch.tensor([[0.1, 0.2, 0.3], [0.9, 0.4, 0.1], [1.2, -0.3, 2.6], [5.0, 5.0, 5.0],
                    [1.4, -0.1, 2.9]])
PF = torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0], [7.0, 8.0], [9.0, 10.0]])
PB = torch.tensor([0, 0, 1, 1, 1], dtype=torch.int32)
VS, ORG = (0.5, 1.0, 2.0), (0.0, -1.0, -0.5)


def _cell(p: list[float]) -> tuple[int, int, int]:
    return tuple(math.floor((p[a] - ORG[a]) / VS[a]) for a in range(3))  # type: ignore[return-value]


@pytest.mark.parametrize("reduction", ["sum", "mean"])
@pytest.mark.parametrize("stride", [(1, 1, 1), (2, 1, 4)])
def test_voxelize_reductions_and_stride(reduction: str, stride: tuple[int, int, int]) -> None:
    active = torch.tensor([4], dtype=torch.int32)  # the last point is not active
    got = _run("voxelize", [PTS, PF, PB, active], voxel_size=VS, origin=ORG,
               reduction=reduction, stride=stride)
    groups: dict[tuple[int, ...], list[list[float]]] = {}
    for p, f, b in zip(PTS[:4].tolist(), PF[:4].tolist(), PB[:4].tolist(), strict=True):
        groups.setdefault((b, *_cell(p)), []).append(f)
    want = {c: [sum(col) / (len(fs) if reduction == "mean" else 1) for col in zip(*fs, strict=True)]
            for c, fs in groups.items()}
    # voxel coordinates are the quantized cells, carried as logical coordinates of `stride`
    _same(got, want, stride=stride)


VOX = {(0, 0, 1, 0): [1.0, 10.0], (0, 1, 1, 0): [2.0, 20.0], (0, 0, 2, 0): [4.0, 40.0],
       (0, 0, 1, 1): [8.0, 80.0], (1, 2, 1, 1): [16.0, 160.0], (1, 3, 1, 2): [32.0, 320.0]}


@pytest.mark.parametrize("interpolation", ["nearest", "linear"])
def test_devoxelize_nearest_and_linear(interpolation: str) -> None:
    pts = torch.tensor([[0.2, 0.3, -0.2], [0.3, 0.5, -0.9], [1.1, 0.1, 2.4], [9.0, 9.0, 9.0]])
    b = torch.tensor([0, 0, 1, 0], dtype=torch.int32)
    active = torch.tensor([3], dtype=torch.int32)
    got = _run("devoxelize", [pts, _sp(VOX), b, active], voxel_size=VS, origin=ORG,
               interpolation=interpolation)
    want = []
    for p, bi in zip(pts[:3].tolist(), b[:3].tolist(), strict=True):
        u = [(p[a] - ORG[a]) / VS[a] for a in range(3)]
        if interpolation == "nearest":
            c = (bi, *(math.floor(v + 0.5) for v in u))
            want.append(VOX.get(c, [0.0, 0.0]))
            continue
        acc = [0.0, 0.0]
        lo = [math.floor(v) for v in u]
        for d in product((0, 1), repeat=3):
            w = math.prod(u[a] - lo[a] if d[a] else 1 - (u[a] - lo[a]) for a in range(3))
            f = VOX.get((bi, lo[0] + d[0], lo[1] + d[1], lo[2] + d[2]))
            if f is not None:  # absent voxels add nothing; no renormalization
                acc = [acc[i] + w * f[i] for i in range(2)]
        want.append(acc)
    torch.testing.assert_close(got, torch.tensor(want), rtol=1e-5, atol=1e-5)


# --- pooling and resampling --------------------------------------------------------------


PL = {(0, 0, 0, 0): [1.0], (0, 1, 0, 1): [-3.0], (0, 1, 1, 1): [2.0], (0, 2, 0, 0): [5.0],
      (1, 3, 3, 3): [4.0]}


# The contract's forward relation without a target: output rows unique(floor(c / s)) over
# the input rows (kernel, padding and dilation do not change them); output o reads the input
# rows o * s + off(r) * d - p, off(r) = r - k // 2 on odd kernel axes (centred), r on even.
FORWARD_GEOMETRIES = [((2, 2, 2), (2, 2, 2), (0, 0, 0), (1, 1, 1)),
                      ((3, 3, 3), (2, 2, 2), (1, 1, 1), (1, 1, 1)),
                      ((3, 3, 3), (1, 1, 1), (0, 0, 0), (1, 1, 1)),
                      ((3, 1, 3), (1, 1, 1), (1, 0, 1), (2, 1, 1)),
                      ((2, 2, 2), (2, 2, 2), (1, 1, 1), (1, 1, 1)),
                      ((2, 2, 2), (3, 2, 1), (0, 0, 0), (1, 1, 1))]


def _forward_out(x: dict[tuple[int, ...], Any], stride: tuple[int, int, int]
                 ) -> list[tuple[int, ...]]:
    return sorted({(c[0], *(c[a + 1] // stride[a] for a in range(3))) for c in x})


def _forward_src(ks: tuple[int, ...], stride: tuple[int, ...], padding: tuple[int, ...],
                 dilation: tuple[int, ...]) -> Any:
    def off(r: int, a: int) -> int:
        return r - ks[a] // 2 if ks[a] % 2 else r

    def src(o: tuple[int, ...], k: tuple[int, ...]) -> tuple[int, ...]:
        return (o[0], *(o[a + 1] * stride[a] + off(k[a], a) * dilation[a] - padding[a]
                        for a in range(3)))

    return src


@pytest.mark.parametrize("mode", ["sum", "max", "avg"])
@pytest.mark.parametrize("ks,stride,padding,dilation", FORWARD_GEOMETRIES)
def test_pool3d_modes_over_contributing_rows(mode: str, ks: tuple[int, int, int],
                                             stride: tuple[int, int, int],
                                             padding: tuple[int, int, int],
                                             dilation: tuple[int, int, int]) -> None:
    got = _run("pool3d", [_sp(PL)], mode=mode, kernel_size=ks, stride=stride, padding=padding,
               dilation=dilation)
    src = _forward_src(ks, stride, padding, dilation)
    red = {"sum": sum, "max": max, "avg": lambda v: sum(v) / len(v)}[mode]  # avg: row count
    nothing = float("-inf") if mode == "max" else 0.0  # the consumer's max over no row
    want = {}
    for o in _forward_out(PL, stride):
        vals = [PL[s][0] for k in product(*(range(n) for n in ks)) if (s := src(o, k)) in PL]
        want[o] = [red(vals) if vals else nothing]
    _same(got, want, stride=stride)


def test_pool_transpose3d_averages_onto_target() -> None:
    coarse = _sp({(0, 0, 0, 0): [2.0], (0, 1, 0, 0): [6.0]}, stride=(2, 2, 2))
    fine = {(0, 1, 1, 0): [0.0], (0, 2, 0, 1): [0.0], (0, 5, 0, 0): [0.0]}
    got = _run("pool_transpose3d", [coarse, _sp(fine)], kernel_size=(2, 2, 2),
               stride=(2, 2, 2), padding=(0, 0, 0), dilation=(1, 1, 1))
    # fine f = 2c + k: the one coarse parent floor(f / 2); none -> 0
    _same(got, {(0, 1, 1, 0): [2.0], (0, 2, 0, 1): [6.0], (0, 5, 0, 0): [0.0]})


def test_pool_transpose3d_without_target_generates_and_averages() -> None:
    coarse = {(0, 1, 1, 1): [2.0], (0, 2, 1, 1): [6.0], (1, 1, 2, 1): [-4.0]}
    ks, st, pad = (3, 1, 2), (2, 1, 2), (1, 0, 1)
    got = _run("pool_transpose3d", [_sp(coarse, stride=(2, 2, 2))], kernel_size=ks, stride=st,
               padding=pad, dilation=(1, 1, 1))
    # rows unique{c * s + k - p}; each the mean of the coarse rows that generate it
    acc: dict[tuple[int, ...], list[float]] = {}
    for c, v in coarse.items():
        for k in product(*(range(n) for n in ks)):
            acc.setdefault((c[0], *(c[a + 1] * st[a] + k[a] - pad[a] for a in range(3))),
                           []).append(v[0])
    _same(got, {o: [sum(v) / len(v)] for o, v in acc.items()}, stride=(1, 2, 1))


def test_trilinear_upsample_normalized_weights() -> None:
    cz = {(0, 0, 0, 0): [1.0], (0, 1, 0, 0): [3.0], (0, 1, 1, 1): [10.0]}
    fine = [(0, 0, 0, 0), (0, 1, 0, 0), (0, 2, 1, 1), (0, 3, 2, 2), (0, 7, 7, 7)]
    got = _run("trilinear_upsample3d", [_sp(cz, stride=(2, 2, 2)), _sp({c: [0.0] for c in fine})],
               stride=(2, 2, 2))
    # fine f = 2c - 1 + k (k in 0..2) with weight prod(1 - |k - 1| / 2), divided by the
    # summed weight of the coarse rows present; 0 where none is.
    want = {}
    for f in fine:
        num, den = 0.0, 0.0
        for c, v in cz.items():
            ks = [f[a + 1] - 2 * c[a + 1] + 1 for a in range(3)]
            if c[0] == f[0] and all(0 <= k <= 2 for k in ks):
                w = math.prod(1 - abs(k - 1) / 2 for k in ks)
                num, den = num + w * v[0], den + w
        want[f] = [num / den if den > 0 else 0.0]
    _same(got, want)


@pytest.mark.parametrize("stride", [(2, 2, 2), (3, 1, 2)])
def test_trilinear_upsample_without_target_generates_fine_rows(stride: tuple[int, int, int]
                                                               ) -> None:
    cz = {(0, 1, 1, 1): [1.0], (0, 2, 1, 1): [3.0], (0, 2, 2, 2): [10.0], (1, 3, 1, 2): [-2.0]}
    got = _run("trilinear_upsample3d", [_sp(cz, stride=(6, 2, 2))], stride=stride)
    # a transposed relation with kernel 2s - 1, padding s - 1: rows unique{c s + k - (s - 1)},
    # weights prod(1 - |k - (s - 1)| / s), divided by the summed weight of the rows present
    want: dict[tuple[int, ...], list[float]] = {}
    num: dict[tuple[int, ...], float] = {}
    den: dict[tuple[int, ...], float] = {}
    for c, v in cz.items():
        for k in product(*(range(2 * s - 1) for s in stride)):
            o = (c[0], *(c[a + 1] * stride[a] + k[a] - (stride[a] - 1) for a in range(3)))
            w = math.prod(1 - abs(k[a] - (stride[a] - 1)) / stride[a] for a in range(3))
            num[o] = num.get(o, 0.0) + w * v[0]
            den[o] = den.get(o, 0.0) + w
    for o in num:
        want[o] = [num[o] / den[o] if den[o] > 0 else 0.0]
    out_stride = tuple(a // b for a, b in zip((6, 2, 2), stride, strict=True))
    _same(got, want, stride=out_stride)  # type: ignore[arg-type]


# --- convolutions ------------------------------------------------------------------------


CX = {(0, 0, 0, 0): [1.0, 2.0], (0, 1, 0, 0): [-1.0, 0.5], (0, 1, 1, 0): [3.0, -2.0],
      (1, 2, 2, 2): [0.25, 4.0]}


def _kernel(ks: tuple[int, int, int], cin: int = 2, cout: int = 3, seed: int = 0
            ) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(cout, *ks, cin, generator=g)  # conv3d_o_xyz_i


def _brute(x: dict[tuple[int, ...], list[float]], w: torch.Tensor, out: list[tuple[int, ...]],
           src_of: Any, bias: torch.Tensor | None, eps: float | None
           ) -> dict[tuple[int, ...], list[float]]:
    """Sum over (input row, kernel offset) pairs src_of(out, k) names; normalized if eps."""
    cout, kx, ky, kz, cin = w.shape
    res = {}
    for o in out:
        num = [0.0] * cout
        den = [0.0] * cout
        for k in product(range(kx), range(ky), range(kz)):
            s = src_of(o, k)
            if s not in x:
                continue
            for co in range(cout):
                for ci in range(cin):
                    wv = w[co, k[0], k[1], k[2], ci].item()
                    num[co] += x[s][ci] * wv
                    den[co] += wv * wv
        y = num if eps is None else [n / math.sqrt(d + eps) for n, d in zip(num, den, strict=True)]
        res[o] = [v + (0.0 if bias is None else bias[i].item()) for i, v in enumerate(y)]
    return res


def _conv_args(ks: tuple[int, int, int], seed: int = 0, cin: int = 2
               ) -> tuple[torch.Tensor, torch.Tensor, list[Any]]:
    w = _kernel(ks, cin=cin, seed=seed)
    b = torch.tensor([0.5, -1.0, 2.0])
    return w, b, [_w(w, "conv3d"), _w(b, "bias")]


@pytest.mark.parametrize("normalized", [False, True])
@pytest.mark.parametrize("ks,dilation", [((3, 3, 3), (1, 1, 1)), ((1, 1, 1), (1, 1, 1)),
                                         ((3, 1, 3), (2, 1, 1))])
def test_subm_conv3d_centered_and_normalized(normalized: bool, ks: tuple[int, int, int],
                                             dilation: tuple[int, int, int]) -> None:
    w, b, wargs = _conv_args(ks)
    name = "normalized_subm_conv3d" if normalized else "subm_conv3d"
    attrs: dict[str, Any] = {"kernel_size": ks, "dilation": dilation,
                             "accumulation": "canonical_f32"}
    if normalized:
        attrs["eps"] = 0.01
    got = _run(name, [_sp(CX), *wargs], **attrs)
    half = [k // 2 for k in ks]

    def src(o: tuple[int, ...], k: tuple[int, ...]) -> tuple[int, ...]:
        return (o[0], *(o[a + 1] + (k[a] - half[a]) * dilation[a] for a in range(3)))

    # The contract's normalized_subm_conv3d uses the plain product for pointwise kernels.
    eps = 0.01 if normalized and ks != (1, 1, 1) else None
    _same(got, _brute(CX, w, list(CX), src, b, eps))


# CX moved off the origin: a padded transpose would generate negative coordinates, which
# the library refuses everywhere.
CX1 = {(c[0], c[1] + 1, c[2] + 1, c[3] + 1): f for c, f in CX.items()}
TRANSPOSE_NAMES = ["conv_transpose3d", "normalized_conv_transpose3d"]


@pytest.mark.parametrize("name", TRANSPOSE_NAMES)
@pytest.mark.parametrize("ks,stride,padding", [((2, 2, 2), (2, 2, 2), (0, 0, 0)),
                                               ((3, 1, 3), (2, 1, 1), (1, 0, 1)),
                                               ((1, 1, 1), (2, 2, 2), (0, 0, 0))])
def test_conv_transpose3d_generated_support(name: str, ks: tuple[int, int, int],
                                            stride: tuple[int, int, int],
                                            padding: tuple[int, int, int]) -> None:
    w, b, wargs = _conv_args(ks, seed=1)
    x = _sp(CX1, stride=(2, 2, 2))
    attrs: dict[str, Any] = {"kernel_size": ks, "stride": stride, "padding": padding,
                             "dilation": (1, 1, 1), "accumulation": "canonical_f32"}
    normalized = name.startswith("normalized")
    if normalized:
        attrs["eps"] = 0.01
    got = _run(name, [x, *wargs], **attrs)
    # support: unique{c * s + k - p}; row o gets input c where o = c * s + k - p
    out = sorted({(c[0], *(c[a + 1] * stride[a] + k[a] - padding[a] for a in range(3)))
                  for c in CX1 for k in product(*(range(n) for n in ks))})

    def src(o: tuple[int, ...], k: tuple[int, ...]) -> tuple[int, ...] | None:
        q = [o[a + 1] + padding[a] - k[a] for a in range(3)]
        if any(v % s for v, s in zip(q, stride, strict=True)):
            return None
        return (o[0], *(v // s for v, s in zip(q, stride, strict=True)))

    # normalized transposes normalize for every kernel size, pointwise included
    want = _brute(CX1, w, out, src, b, 0.01 if normalized else None)
    out_stride = tuple(2 // s for s in stride)
    _same(got, want, stride=out_stride)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ["target_conv_transpose3d",
                                  "target_normalized_conv_transpose3d"])
@pytest.mark.parametrize("ks", [(2, 2, 2), (1, 1, 1)])
def test_target_conv_transpose3d_runs_on_target(name: str, ks: tuple[int, int, int]) -> None:
    w, b, wargs = _conv_args(ks, seed=2)
    x = _sp(CX, stride=(2, 2, 2))
    tgt = [(0, 0, 0, 0), (0, 1, 1, 0), (0, 2, 0, 1), (0, 9, 9, 9), (1, 5, 5, 5)]
    attrs: dict[str, Any] = {"kernel_size": ks, "stride": (2, 2, 2), "padding": (0, 0, 0),
                             "dilation": (1, 1, 1), "accumulation": "canonical_f32"}
    normalized = "normalized" in name
    if normalized:
        attrs["eps"] = 0.01
    got = _run(name, [x, _sp({t: [0.0] for t in tgt}), *wargs], **attrs)

    def src(o: tuple[int, ...], k: tuple[int, ...]) -> tuple[int, ...] | None:
        q = [o[a + 1] - k[a] for a in range(3)]
        return None if any(v % 2 for v in q) else (o[0], *(v // 2 for v in q))

    _same(got, _brute(CX, w, tgt, src, b, 0.01 if normalized else None))


@pytest.mark.parametrize("normalized", [False, True])
@pytest.mark.parametrize("ks,stride", [((2, 2, 2), (2, 2, 2)), ((3, 1, 2), (1, 1, 2)),
                                       ((1, 1, 1), (1, 1, 1))])
def test_generative_conv_transpose3d(normalized: bool, ks: tuple[int, int, int],
                                     stride: tuple[int, int, int]) -> None:
    w, b, wargs = _conv_args(ks, seed=3)
    x = _sp(CX, stride=(2, 2, 2))
    attrs: dict[str, Any] = {"kernel_size": ks, "stride": stride,
                             "accumulation": "canonical_f32"}
    name = "generative_conv_transpose3d"
    if normalized:
        attrs["eps"] = 0.01
        name = "normalized_" + name
    got = _run(name, [x, *wargs], **attrs)
    # support: s * stride + k for every canonical kernel position (z fastest)
    pairs: dict[tuple[int, ...], list[tuple[tuple[int, ...], tuple[int, ...]]]] = {}
    for c in CX:
        for k in product(*(range(n) for n in ks)):
            o = (c[0], *(c[a + 1] * stride[a] + k[a] for a in range(3)))
            pairs.setdefault(o, []).append((c, k))

    def src(o: tuple[int, ...], k: tuple[int, ...]) -> tuple[int, ...] | None:
        return next((c for c, kk in pairs[o] if kk == k), None)

    _same(got, _brute(CX, w, list(pairs), src, b, 0.01 if normalized else None),
          stride=tuple(2 // s for s in stride))  # type: ignore[arg-type]


@pytest.mark.parametrize("ks,stride,padding", [((2, 2, 2), (2, 2, 2), (0, 0, 0)),
                                               ((3, 3, 3), (1, 1, 1), (1, 1, 1))])
def test_target_conv3d_on_target(ks: tuple[int, int, int], stride: tuple[int, int, int],
                                 padding: tuple[int, int, int]) -> None:
    w, b, wargs = _conv_args(ks, seed=4)
    tgt = [(0, 0, 0, 0), (0, 1, 1, 1), (1, 1, 1, 1), (0, 4, 4, 4)]
    got = _run("target_conv3d", [_sp(CX), _sp({t: [0.0] for t in tgt}, stride=stride), *wargs],
               kernel_size=ks, stride=stride, padding=padding, dilation=(1, 1, 1),
               accumulation="canonical_f32")

    src = _forward_src(ks, stride, padding, (1, 1, 1))  # centred on odd axes
    _same(got, _brute(CX, w, tgt, src, b, None), stride=stride)


@pytest.mark.parametrize("ks,stride,padding,dilation", FORWARD_GEOMETRIES)
def test_conv3d_generates_floor_support(ks: tuple[int, int, int], stride: tuple[int, int, int],
                                        padding: tuple[int, int, int],
                                        dilation: tuple[int, int, int]) -> None:
    w, b, wargs = _conv_args(ks, seed=5)
    got = _run("conv3d", [_sp(CX), *wargs], kernel_size=ks, stride=stride, padding=padding,
               dilation=dilation, accumulation="canonical_f32")
    want = _brute(CX, w, _forward_out(CX, stride), _forward_src(ks, stride, padding, dilation), b,
                  None)
    _same(got, want, stride=stride)
