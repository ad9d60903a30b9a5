"""Every lattice op replayed from a small artifact, against dense references or our functions.

Convolution weights are written in the contract's ``conv3d_o_xyz_i`` layout straight
from a dense ``torch.nn.functional.conv3d`` weight (``w[o, i, x, y, z]`` ->
``(O, Kx, Ky, Kz, I)``), so the kernel-row order is checked against torch itself.
"""

from __future__ import annotations

from itertools import product
from pathlib import Path

import pytest
import torch

import torch_lattice as tl
from torch_lattice.artifact import SparseOutput, load_lattice_program
from torch_lattice.artifact.packing import pack_weight, unpack_weight
from torch_lattice.nn import functional as F
from torch_lattice.tensor import SparseTensor

try:
    import artifact_replay_helpers as h
    import dense_oracle as oracle
except ImportError:  # tests/ may become a package
    from tests import artifact_replay_helpers as h
    from tests import dense_oracle as oracle

WC, WB, WL = h.weight_type("conv3d"), h.weight_type("bias"), h.weight_type("linear")
ACC = 'accumulation = "canonical_f32"'


def _geom(ks: tuple[int, int, int], stride: tuple[int, int, int] = (1, 1, 1),
          padding: tuple[int, int, int] = (0, 0, 0), dilation: tuple[int, int, int] = (1, 1, 1)
          ) -> str:
    return (f"{h.triple('kernel_size', ks)}, {h.triple('stride', stride)}, "
            f"{h.triple('padding', padding)}, {h.triple('dilation', dilation)}")


def _run(tmp_path: Path, g: h.Graph, weights: dict[str, torch.Tensor],
         inputs: dict[str, torch.Tensor], **kw: object) -> dict[str, object]:
    art = h.write_artifact(tmp_path / "a", g, weights)
    return load_lattice_program(art, **kw)(**inputs)  # type: ignore[arg-type]


def _dense_at(x: SparseTensor, wd: torch.Tensor, out: torch.Tensor, stride: tuple[int, ...],
              padding: tuple[int, ...], dilation: tuple[int, ...], transposed: bool = False
              ) -> torch.Tensor:
    """Dense torch conv (``wd`` is torch's own weight) of ``x``, read at ``out`` rows."""
    hi = torch.cat([x.coords, out]).amax(0).tolist()
    ext = [hi[a + 1] + 2 * max(padding[a], 1) + wd.shape[2 + a] * dilation[a] + 2 for a in range(3)]
    grid = oracle.scatter_dense(x.feats.double(), x.coords, hi[0] + 1, ext)
    fn = torch.nn.functional.conv_transpose3d if transposed else torch.nn.functional.conv3d
    y = fn(grid, wd.double(), stride=stride, padding=padding, dilation=dilation)
    o = out.long()
    return y.permute(0, 2, 3, 4, 1)[o[:, 0], o[:, 1], o[:, 2], o[:, 3]].float()


def _sparse_x(n: int = 40, c: int = 3, extent: int = 6, seed: int = 0
              ) -> tuple[SparseTensor, dict[str, torch.Tensor]]:
    coords = h.random_coords(n, extent, seed=seed)
    feats = torch.randn(n, c, generator=torch.Generator().manual_seed(seed + 1))
    return SparseTensor(feats, coords), h.sparse_inputs("x", coords, feats)


def test_subm_conv3d_noncubic_matches_dense_torch(tmp_path: Path) -> None:
    ks, dil = (3, 1, 5), (1, 1, 2)
    x, inputs = _sparse_x()
    wd = torch.randn(4, 3, *ks)  # torch's (C_out, C_in, Kx, Ky, Kz)
    g = h.Graph()
    g.sparse_input("x", 3)
    g.weight("w", "conv.weight", "conv3d")
    g.op("y", "subm_conv3d", ["x", "w"], [h.SP, WC],
         f"{h.triple('kernel_size', ks)}, {h.triple('dilation', dil)}, {ACC}", h.SP)
    g.output("y", h.SP)
    out = _run(tmp_path, g, {"conv.weight": wd.permute(0, 2, 3, 4, 1)}, inputs)["output"]
    assert isinstance(out, SparseOutput) and torch.equal(out.coords, x.coords)
    pad = tuple(dil[a] * (ks[a] - 1) // 2 for a in range(3))
    ref = _dense_at(x, wd, x.coords, (1, 1, 1), pad, dil)
    torch.testing.assert_close(out.features, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("target", [False, True])
def test_conv3d_and_target_conv3d_match_dense_torch(tmp_path: Path, target: bool) -> None:
    ks, st, pad = (3, 2, 3), (2, 2, 1), (1, 0, 1)
    x, inputs = _sparse_x()
    wd, bias = torch.randn(2, 3, *ks), torch.randn(2)
    g = h.Graph()
    g.sparse_input("x", 3)
    operands, types = ["x"], [h.SP]
    tgt = h.random_coords(12, 3, seed=5)
    if target:
        g.sparse_input("t", 1, st)
        operands, types = ["x", "t"], [h.SP, h.SP]
        inputs.update(h.sparse_inputs("t", tgt * torch.tensor([1, *st], dtype=torch.int32),
                                      torch.zeros(12, 1)))
    g.weight("w", "conv.weight", "conv3d")
    g.weight("b", "conv.bias", "bias")
    g.op("y", "target_conv3d" if target else "conv3d", [*operands, "w", "b"], [*types, WC, WB],
         f"{_geom(ks, st, pad)}, {ACC}", h.SP)
    g.output("y", h.SP)
    out = _run(tmp_path, g, {"conv.weight": wd.permute(0, 2, 3, 4, 1), "conv.bias": bias},
               inputs)["output"]  # physical boundary coordinates
    assert isinstance(out, SparseOutput)
    logical = out.coords // torch.tensor([1, *st], dtype=torch.int32)
    assert torch.equal(logical * torch.tensor([1, *st], dtype=torch.int32), out.coords)
    if target:
        assert torch.equal(logical, tgt)
    else:
        # the contract's forward support: unique(floor(c / stride)) over the input rows
        cells = x.coords // torch.tensor([1, *st], dtype=x.coords.dtype)
        assert torch.equal(logical.to(cells.dtype), torch.unique(cells, dim=0))
    # the contract centres odd kernel axes: dense padding p + k // 2 there
    dense_pad = tuple(pad[a] + (ks[a] // 2 if ks[a] % 2 else 0) for a in range(3))
    ref = _dense_at(x, wd, logical, st, dense_pad, (1, 1, 1)) + bias
    torch.testing.assert_close(out.features, ref, rtol=1e-5, atol=1e-5)


def _generated(coords: torch.Tensor, ks: tuple[int, int, int], st: tuple[int, int, int],
               pad: tuple[int, int, int] = (0, 0, 0)) -> torch.Tensor:
    """``unique{c*s + r - p}`` sorted by (b, x, y, z), by enumeration."""
    rows = set()
    for b, *c in coords.tolist():
        for r in product(*(range(k) for k in ks)):
            rows.add((b, *(c[a] * st[a] + r[a] - pad[a] for a in range(3))))
    return torch.tensor(sorted(rows), dtype=torch.int32)


def test_transpose_family_matches_dense_and_library(tmp_path: Path) -> None:
    """conv3d down, then conv_transpose3d without a target (the contract generates the
    fine support from the coarse rows) and target_conv_transpose3d onto the input."""
    ks, st = (2, 3, 2), (2, 1, 2)
    x, inputs = _sparse_x()
    wdown, wup = torch.randn(4, 3, *ks), torch.randn(5, 4, *ks)  # wup: (C_out, C_in, k)
    g = h.Graph()
    g.sparse_input("x", 3)
    g.weight("wd", "down.weight", "conv3d")
    g.weight("wu", "up.weight", "conv3d")
    g.op("d", "conv3d", ["x", "wd"], [h.SP, WC], f"{_geom(ks, st)}, {ACC}", h.SP)
    g.op("u", "conv_transpose3d", ["d", "wu"], [h.SP, WC], f"{_geom(ks, st)}, {ACC}", h.SP)
    g.op("t", "target_conv_transpose3d", ["d", "x", "wu"], [h.SP, h.SP, WC],
         f"{_geom(ks, st)}, {ACC}", h.SP)
    g.output("u", h.SP, "up")
    g.output("t", h.SP, "onto_x")
    outs = _run(tmp_path, g, {"down.weight": wdown.permute(0, 2, 3, 4, 1),
                              "up.weight": wup.permute(0, 2, 3, 4, 1)}, inputs)
    # the contract's no-target conv3d rows: unique(floor(c / stride)) over x's rows
    cells = torch.unique(x.coords // torch.tensor([1, *st], dtype=x.coords.dtype), dim=0)
    floor_rows = SparseTensor(torch.zeros(cells.shape[0], 1), cells, stride=st)
    # the odd middle axis (k = 3) is centred in the contract: library padding 1 there
    down = F.conv3d(x, oracle_canonical(wdown), None, ks, st, (0, 1, 0), coordinates=floor_rows)
    generated = _generated(down.coords, ks, st)
    assert generated.shape[0] > x.coords.shape[0]  # not the support x had
    for name, support in (("up", generated), ("onto_x", x.coords)):
        out = outs[name]
        assert isinstance(out, SparseOutput) and torch.equal(out.coords, support)
        ref = _dense_at(down, wup.transpose(0, 1), support, st, (0, 0, 0), (1, 1, 1),
                        transposed=True)
        torch.testing.assert_close(out.features, ref, rtol=1e-4, atol=1e-4)


def oracle_canonical(wd: torch.Tensor) -> torch.Tensor:
    """torch ``(O, I, Kx, Ky, Kz)`` -> canonical ``(K, I, O)`` by API.md's row formula."""
    o, i, kx, ky, kz = wd.shape
    w = torch.empty(kx * ky * kz, i, o)
    for rx in range(kx):
        for ry in range(ky):
            for rz in range(kz):
                w[(rx * ky + ry) * kz + rz] = wd[:, :, rx, ry, rz].T
    return w


@pytest.mark.parametrize("op", ["generative_conv_transpose3d",
                                "normalized_generative_conv_transpose3d",
                                "normalized_subm_conv3d", "normalized_conv_transpose3d",
                                "target_normalized_conv_transpose3d"])
def test_generative_and_normalized_match_library(tmp_path: Path, op: str) -> None:
    ks, st = (3, 1, 3), (2, 1, 2)
    coarse = h.random_coords(10, 3, seed=3)
    feats = torch.randn(10, 2)
    w, b = torch.randn(9, 2, 3), torch.randn(3)
    src = SparseTensor(feats, coarse, stride=st)
    g = h.Graph()
    inputs = h.sparse_inputs("x", coarse, feats)
    g.sparse_input("x", 2, st)
    g.weight("w", "w.weight", "conv3d")
    g.weight("b", "w.bias", "bias")
    fine = F.generative_conv_transpose3d(src, w, None, ks, st)  # a fine support to aim at
    eps = 1e-6
    if op.startswith("target_"):
        g.sparse_input("t", 1)
        inputs.update(h.sparse_inputs("t", fine.coords, torch.zeros(len(fine.coords), 1)))
        g.op("y", op, ["x", "t", "w", "b"], [h.SP, h.SP, WC, WB],
             f"{_geom(ks, st, (1, 0, 1))}, eps = 1.0e-06 : f32, {ACC}", h.SP)
        ref = F.normalized(lambda s, k: F.conv_transpose3d(s, k, None, ks, st, (1, 0, 1),
                                                           coordinates=fine), src, w, b, eps)
    elif op == "normalized_conv_transpose3d":  # no target: the generated fine support
        g.op("y", op, ["x", "w", "b"], [h.SP, WC, WB],
             f"{_geom(ks, st)}, {ACC}, eps = 1.0e-06 : f32", h.SP)
        gen = _generated(coarse, ks, st)
        ref = F.normalized(lambda s, k: F.conv_transpose3d(s, k, None, ks, st, coordinates=gen),
                           src, w, b, eps)
        assert torch.equal(ref.coords, gen)
    elif "generative" in op:
        eps_attr = ", eps = 1.0e-06 : f32" if "normalized" in op else ""
        g.op("y", op, ["x", "w", "b"], [h.SP, WC, WB],
             f"{h.triple('kernel_size', ks)}, {h.triple('stride', st)}{eps_attr}, {ACC}", h.SP)
        conv = lambda s, k: F.generative_conv_transpose3d(s, k, None, ks, st)  # noqa: E731
        ref = F.normalized(conv, src, w, b, eps) if "normalized" in op else conv(src, w)
        if "normalized" not in op:
            ref = ref.replace(ref.feats + b)
    else:
        g.op("y", op, ["x", "w", "b"], [h.SP, WC, WB],
             f"{h.triple('kernel_size', ks)}, {h.triple('dilation', (1, 1, 1))}, "
             f"eps = 1.0e-06 : f32, {ACC}", h.SP)
        src = SparseTensor(feats, coarse)
        ref = F.normalized(lambda s, k: F.subm_conv3d(s, k, None, ks), src, w, b, eps)
    g.output("y", h.SP)
    weights = {"w.weight": h.artifact_weight(w, ks), "w.bias": b}
    out = _run(tmp_path, g, weights, inputs, coordinates="logical")["output"]
    assert isinstance(out, SparseOutput) and torch.equal(out.coords, ref.coords)
    torch.testing.assert_close(out.features, ref.feats, rtol=1e-5, atol=1e-5)


def _one_sparse_op(tmp_path: Path, name: str, attrs: str,
                   x_stride: tuple[int, int, int] = (1, 1, 1),
                   target: SparseTensor | None = None, result: str = h.SP,
                   x: SparseTensor | None = None) -> object:
    x = x or _sparse_x()[0]
    g = h.Graph()
    g.sparse_input("x", x.feats.shape[1], x_stride)
    inputs = h.sparse_inputs("x", x.coords, x.feats)
    operands, types = ["x"], [h.SP]
    if target is not None:
        g.sparse_input("t", target.feats.shape[1], target.stride)
        inputs.update(h.sparse_inputs("t", target.coords, target.feats))
        operands, types = ["x", "t"], [h.SP, h.SP]
    g.op("y", name, operands, types, attrs, result)
    g.output("y", result)
    return _run(tmp_path, g, {}, inputs, coordinates="logical")["output"]


def _assert_sparse(out: object, ref: SparseTensor) -> None:
    assert isinstance(out, SparseOutput)
    assert torch.equal(out.coords, ref.coords)
    torch.testing.assert_close(out.features, ref.feats, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("mode", ["max", "avg", "sum"])
def test_pool3d(tmp_path: Path, mode: str) -> None:
    # kernel_size == stride, no padding, on an even range: the one geometry where the
    # library's generated rows are the contract's unique(floor(c / stride)); the others
    # are checked against the contract in test_artifact_replay_semantics.py.
    x = _sparse_x(extent=6)[0]
    geometry = _geom((2, 1, 2), (2, 1, 2))
    out = _one_sparse_op(tmp_path, "pool3d", f"mode = #lattice.pool_mode<{mode}>, {geometry}",
                         x=x)
    fn = {"max": F.max_pool3d, "avg": F.avg_pool3d, "sum": F.sum_pool3d}[mode]
    _assert_sparse(out, fn(x, (2, 1, 2), (2, 1, 2)))


def test_pool_transpose_and_trilinear_with_target(tmp_path: Path) -> None:
    # coarse rows away from 0: a generated fine support may not go negative
    shift = torch.tensor([0, 1, 1, 1], dtype=torch.int32)
    coarse = SparseTensor(torch.randn(8, 2), h.random_coords(8, 3, seed=2) + shift, stride=2)
    fine = SparseTensor(torch.zeros(15, 1), h.random_coords(15, 6, seed=4))
    out = _one_sparse_op(tmp_path / "p", "pool_transpose3d", _geom((3, 3, 3), (2, 2, 2),
                                                                   (1, 1, 1)),
                         (2, 2, 2), fine, x=coarse)
    _assert_sparse(out, F.pool_transpose3d(coarse, 3, 2, 1, target=fine))
    out = _one_sparse_op(tmp_path / "t", "trilinear_upsample3d", h.triple("stride", (2, 2, 2)),
                         (2, 2, 2), fine, x=coarse)
    _assert_sparse(out, F.trilinear_upsample3d(coarse, 2, target=fine))
    out = _one_sparse_op(tmp_path / "g", "trilinear_upsample3d", h.triple("stride", (2, 2, 2)),
                         (2, 2, 2), x=coarse)
    _assert_sparse(out, F.trilinear_upsample3d(coarse, 2))


@pytest.mark.parametrize(("mode", "batch"), [("avg", 3), ("max", -1), ("sum", 2)])
def test_global_pool(tmp_path: Path, mode: str, batch: int) -> None:
    x = _sparse_x()[0]
    out = _one_sparse_op(tmp_path, "global_pool",
                         f"mode = #lattice.pool_mode<{mode}>, batch_size = {batch}",
                         result="tensor<?x3xf32>", x=x)
    ref = F.global_pool(x, mode=mode, batch_size=None if batch < 0 else batch)
    assert isinstance(out, torch.Tensor)
    torch.testing.assert_close(out, ref)


@pytest.mark.parametrize("join", ["inner", "left", "right", "outer"])
def test_sparse_algebra_joins(tmp_path: Path, join: str) -> None:
    a = SparseTensor(torch.randn(20, 3), h.random_coords(20, 4, seed=1))
    b = SparseTensor(torch.randn(25, 3), h.random_coords(25, 4, seed=2))
    out = _one_sparse_op(tmp_path / "c", "sparse.cat", f"join = #lattice.join<{join}>",
                         target=b, x=a)
    _assert_sparse(out, tl.sparse_cat([a, b], join=join))
    out = _one_sparse_op(tmp_path / "b", "sparse.binary",
                         f"op = #lattice.binary_op<sub>, join = #lattice.join<{join}>, "
                         "lhs_fill = 0.5 : f32, rhs_fill = -2.0 : f32", target=b, x=a)
    _assert_sparse(out, tl.sparse_binary(a, b, "sub", join=join, lhs_fill=0.5, rhs_fill=-2.0))
    out = _one_sparse_op(tmp_path / "r", "sparse.reindex", "fill = -0.75 : f32", target=b, x=a)
    _assert_sparse(out, tl.reindex_sparse(a, b, fill=-0.75))


def _feature_graph(channels: int, body: list[tuple[str, str, list[str], str]],
                   weights: list[tuple[str, str, str]]) -> h.Graph:
    """x -> decompose -> ops on features (name, op, operands, attrs) -> with_features."""
    g = h.Graph()
    g.sparse_input("x", channels)
    ft = f"tensor<?x{channels}xf32>"
    g.body.append(f"%xc, %xf, %xa = lattice.sparse.decompose %x : {h.SP} -> "
                  f"(tensor<?x4xi32>, {ft}, tensor<1xi32>)")
    for sym, key, family in weights:
        g.weight(sym, key, family)
    last = "xf"
    for result, op, operands, attrs in body:
        types = [ft if o in ("xf", last) else h.weight_type(_family(o, weights))
                 for o in operands]
        g.op(result, op, operands, types, attrs, ft)
        last = result
    g.body.append(f"%y = lattice.sparse.with_features %x, %{last}  : ({h.SP}, {ft}) -> {h.SP}")
    g.output("y", h.SP)
    return g


def _family(sym: str, weights: list[tuple[str, str, str]]) -> str:
    return next(f for s, _, f in weights if s == sym)


ACT = "approximate = #lattice.gelu_approx<{a}>, alpha = 0.2 : f32, beta = 2.0 : f32, " \
      "threshold = 3.0 : f32"


@pytest.mark.parametrize(
    ("kind", "approx", "ref"),
    [
        ("relu", "none", torch.relu),
        ("sigmoid", "none", torch.sigmoid),
        ("silu", "none", lambda v: v * torch.sigmoid(v)),
        ("tanh", "none", torch.tanh),
        ("leaky_relu", "none", lambda v: torch.where(v >= 0, v, 0.2 * v)),
        ("softplus", "none",
         lambda v: torch.where(2 * v > 3, v, torch.log1p(torch.exp(2 * v)) / 2)),
        ("gelu", "none", lambda v: 0.5 * v * (1 + torch.erf(v / 2**0.5))),
        ("gelu", "precise", lambda v: 0.5 * v * (1 + torch.erf(v / 2**0.5))),
        ("gelu", "tanh",
         lambda v: 0.5 * v * (1 + torch.tanh(0.7978845608 * (v + 0.044715 * v**3)))),
        ("gelu", "fast", lambda v: v * torch.sigmoid(1.702 * v)),
    ],
)
def test_activation_kinds(tmp_path: Path, kind: str, approx: str, ref: object) -> None:
    x, inputs = _sparse_x()
    x = x.replace(x.feats * 3)
    inputs["x_features"] = x.feats
    g = _feature_graph(3, [("a", "activation", ["xf"],
                            f"kind = #lattice.activation<{kind}>, " + ACT.format(a=approx))], [])
    out = _run(tmp_path, g, {}, inputs)["output"]
    assert isinstance(out, SparseOutput) and torch.equal(out.coords, x.coords)
    torch.testing.assert_close(out.features, ref(x.feats), rtol=1e-5, atol=1e-5)  # type: ignore[operator]


def test_norms_and_dense_feature_ops(tmp_path: Path) -> None:
    x, inputs = _sparse_x()
    c = 3
    vals = {k: torch.rand(c) + 0.5 for k in ("s", "b", "m", "v")}
    weights = [("s", "n.weight", "channel"), ("b", "n.bias", "bias"),
               ("m", "n.running_mean", "channel"), ("v", "n.running_var", "channel")]
    body = [
        ("bn", "batch_norm", ["xf", "s", "b", "m", "v"], "eps = 0.001 : f32"),
        ("ln", "layer_norm", ["bn", "s", "b"], "eps = 0.00001 : f32"),
        ("rn", "rms_norm", ["ln", "s"], "eps = 0.00001 : f32"),
        ("ex", "elementwise", ["rn"], 'kind = "exp"'),
        ("sm", "softmax", ["ex"], "axis = -1"),
        ("ro", "elementwise", ["sm"], 'kind = "round"'),
    ]
    g = _feature_graph(c, body, weights)
    stored = {"n.weight": vals["s"], "n.bias": vals["b"], "n.running_mean": vals["m"],
              "n.running_var": vals["v"]}
    out = _run(tmp_path, g, stored, inputs)["output"]
    nn = torch.nn.functional
    r = nn.batch_norm(x.feats, vals["m"], vals["v"], vals["s"], vals["b"], False, 0.0, 1e-3)
    r = nn.layer_norm(r, (c,), vals["s"], vals["b"], 1e-5)
    r = r / torch.sqrt(r.pow(2).mean(1, keepdim=True) + 1e-5) * vals["s"]
    r = torch.round(torch.softmax(torch.exp(r), dim=1))
    assert isinstance(out, SparseOutput)
    torch.testing.assert_close(out.features, r, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("bits", [None, 8, 4])
def test_linear_and_packed_conv(tmp_path: Path, bits: int | None) -> None:
    x, inputs = _sparse_x(c=40)
    wl, bl = torch.randn(5, 40), torch.randn(5)
    wc = torch.randn(6, 2, 1, 2, 40)  # conv3d_o_xyz_i, kernel (2, 1, 2) on 40 channels
    packing = "#lattice.packing<dense>"
    stored: dict[str, torch.Tensor] = {"lin.bias": bl}
    if bits is None:
        stored.update({"lin.weight": wl, "conv.weight": wc})
        wl_eff, wc_eff = wl, wc
    else:
        packing = (f"#lattice.packing<int{bits}, group_size = 32, scale_dtype = f16, "
                   "mode = affine>")
        for key, w in (("lin.weight", wl), ("conv.weight", wc)):
            stored.update(pack_weight(w, bits=bits, group_size=32,
                                      scale_dtype=torch.float16).tensors(key))
        pl = pack_weight(wl, bits=bits, group_size=32, scale_dtype=torch.float16)
        pc = pack_weight(wc, bits=bits, group_size=32, scale_dtype=torch.float16)
        wl_eff = unpack_weight(*pl.astuple(), bits=bits, in_channels=40)
        wc_eff = unpack_weight(*pc.astuple(), bits=bits, in_channels=40, kernel_size=(2, 1, 2))
    g = h.Graph()
    g.sparse_input("x", 40)
    g.weight("wc", "conv.weight", "conv3d", packing)
    g.op("y", "conv3d", ["x", "wc"], [h.SP, WC], f"{_geom((2, 1, 2), (2, 1, 2))}, {ACC}", h.SP)
    g.body.append(f"%yc, %yf, %ya = lattice.sparse.decompose %y : {h.SP} -> "
                  "(tensor<?x4xi32>, tensor<?x6xf32>, tensor<1xi32>)")
    g.body.append(f"%lin_in, %xf, %xa = lattice.sparse.decompose %x : {h.SP} -> "
                  "(tensor<?x4xi32>, tensor<?x40xf32>, tensor<1xi32>)")
    g.weight("wl", "lin.weight", "linear", packing)
    g.weight("bl", "lin.bias", "bias")
    g.op("lin", "linear", ["xf", "wl", "bl"], ["tensor<?x40xf32>", WL, WB], "",
         "tensor<?x5xf32>")
    g.output("lin", "tensor<?x5xf32>", "linear")
    g.output("yf", "tensor<?x6xf32>", "conv_features")
    g.output("yc", "tensor<?x4xi32>", "conv_coords")
    outs = _run(tmp_path, g, stored, inputs)
    torch.testing.assert_close(outs["linear"], x.feats @ wl_eff.T + bl, rtol=1e-5, atol=1e-5)
    canonical = wc_eff.permute(1, 2, 3, 4, 0).reshape(4, 40, 6)
    ref = F.conv3d(x, canonical, None, (2, 1, 2), (2, 1, 2))
    torch.testing.assert_close(outs["conv_features"], ref.feats, rtol=1e-4, atol=1e-4)
    # decomposed coordinates are physical: logical x stride (2, 1, 2)
    assert torch.equal(outs["conv_coords"], ref.coords * torch.tensor([1, 2, 1, 2]))
    if bits is not None:
        assert not torch.equal(wl_eff, wl)  # the replay really used the quantized weight


def test_embedding_lookup(tmp_path: Path) -> None:
    table = torch.randn(7, 4)
    g = h.Graph()
    g.tensor_input("ids", "tensor<?xi32>")
    g.weight("e", "emb.weight", "embedding")
    g.op("y", "embedding_lookup", ["ids", "e"], ["tensor<?xi32>", h.weight_type("embedding")],
         "", "tensor<?x4xf32>")
    g.output("y", "tensor<?x4xf32>")
    ids = torch.tensor([3, 0, 6, 3], dtype=torch.int32)
    out = _run(tmp_path, g, {"emb.weight": table}, {"ids": ids})["output"]
    torch.testing.assert_close(out, table[ids.long()])
    with pytest.raises(ValueError, match=r"indices must lie in \[0, 7\)"):
        load_lattice_program(tmp_path / "a")(ids=torch.tensor([7], dtype=torch.int32))


@pytest.mark.parametrize(("reduction", "interp"), [("mean", "nearest"), ("sum", "linear")])
def test_voxelize_devoxelize(tmp_path: Path, reduction: str, interp: str) -> None:
    g = h.Graph()
    for name, ty in (("points", "tensor<?x3xf32>"), ("features", "tensor<?x2xf32>"),
                     ("batch_indices", "tensor<?xi32>"), ("active_rows", "tensor<1xi32>")):
        g.tensor_input(name, ty)
    vs = "voxel_size = array<f64: 0.5, 0.5, 0.5>, origin = array<f64: 0.0, 0.0, 0.0>"
    g.op("v", "voxelize", ["points", "features", "batch_indices", "active_rows"],
         ["tensor<?x3xf32>", "tensor<?x2xf32>", "tensor<?xi32>", "tensor<1xi32>"],
         f"{vs}, reduction = #lattice.voxel_reduction<{reduction}>, "
         f"{h.triple('stride', (1, 1, 1))}", h.SP)
    g.op("d", "devoxelize", ["points", "v", "batch_indices", "active_rows"],
         ["tensor<?x3xf32>", h.SP, "tensor<?xi32>", "tensor<1xi32>"],
         f"{vs}, interpolation = #lattice.point_interpolation<{interp}>", "tensor<?x2xf32>")
    g.output("d", "tensor<?x2xf32>", "points_out")
    g.output("v", h.SP, "voxels")
    pts = torch.tensor([[0.1, 0.1, 0.1], [0.2, 0.3, 0.1], [0.8, 0.1, 0.1], [0.3, 0.3, 0.3],
                        [9.0, 9.0, 9.0]])
    feats = torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0], [7.0, 8.0], [99.0, 99.0]])
    batch = torch.tensor([0, 0, 0, 1, 0], dtype=torch.int32)
    outs = _run(tmp_path, g, {}, {"points": pts, "features": feats, "batch_indices": batch,
                                  "active_rows": torch.tensor([4], dtype=torch.int32)})
    vox = outs["voxels"]
    assert isinstance(vox, SparseOutput)  # the padding row (9, 9, 9) is not voxelized
    assert vox.coords.tolist() == [[0, 0, 0, 0], [0, 1, 0, 0], [1, 0, 0, 0]]
    v0 = [2.0, 3.0] if reduction == "mean" else [4.0, 6.0]
    assert vox.features.tolist() == [v0, [5.0, 6.0], [7.0, 8.0]]
    d = outs["points_out"]
    assert isinstance(d, torch.Tensor) and d.shape == (4, 2)  # one row per active point
    if interp == "nearest":  # voxel at floor(u + 0.5), u = p / 0.5
        # u = (.2,.2,.2) -> (0,0,0); (.4,.6,.2) -> (0,1,0) absent; (1.6,.2,.2) -> (2,0,0)
        # absent; batch 1 (.6,.6,.6) -> (1,1,1) absent
        want = [v0, [0.0, 0.0], [0.0, 0.0], [0.0, 0.0]]
        torch.testing.assert_close(d, torch.tensor(want))
    else:  # corners floor(u) + {0, 1}; absent voxels add nothing, no renormalization
        u0 = pts[0] / 0.5
        w00 = float((1 - u0).prod())
        w10 = float(u0[0] * (1 - u0[1]) * (1 - u0[2]))
        torch.testing.assert_close(d[0], torch.tensor(v0) * w00 + torch.tensor([5.0, 6.0]) * w10)


def test_half_features_come_back_half(tmp_path: Path) -> None:
    x, inputs = _sparse_x()
    inputs["x_features"] = x.feats.half()
    g = h.Graph()
    g.sparse_input("x", 3, dtype="f16")
    sp16 = h.SP.replace("f32", "f16")
    g.weight("w", "c.weight", "conv3d")
    g.op("y", "subm_conv3d", ["x", "w"], [sp16, WC],
         f"{h.triple('kernel_size', (3, 3, 3))}, {h.triple('dilation', (1, 1, 1))}, {ACC}", sp16)
    g.output("y", sp16)
    w = torch.randn(27, 3, 2)
    out = _run(tmp_path, g, {"c.weight": h.artifact_weight(w, (3, 3, 3))}, inputs)["output"]
    assert isinstance(out, SparseOutput) and out.features.dtype == torch.float16
    ref = F.subm_conv3d(SparseTensor(x.feats.half().float(), x.coords), w, None, 3)
    torch.testing.assert_close(out.features.float(), ref.feats, rtol=1e-2, atol=1e-2)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_replay_matches_cpu(tmp_path: Path) -> None:
    ks = (3, 3, 3)
    _, inputs = _sparse_x(200, 3, 10)
    g = h.Graph()
    g.sparse_input("x", 3)
    g.weight("w", "c.weight", "conv3d")
    g.op("s", "subm_conv3d", ["x", "w"], [h.SP, WC],
         f"{h.triple('kernel_size', ks)}, {h.triple('dilation', (1, 1, 1))}, {ACC}", h.SP)
    g.op("p", "pool3d", ["s"], [h.SP],
         f"mode = #lattice.pool_mode<max>, {_geom((2, 2, 2), (2, 2, 2))}", h.SP)
    g.op("u", "trilinear_upsample3d", ["p", "s"], [h.SP, h.SP], h.triple("stride", (2, 2, 2)), h.SP)
    g.op("c", "sparse.cat", ["s", "u"], [h.SP, h.SP], "join = #lattice.join<inner>", h.SP)
    g.output("c", h.SP)
    art = h.write_artifact(tmp_path / "a", g, {"c.weight": h.artifact_weight(torch.randn(27, 3, 4),
                                                                              ks)})
    cpu = load_lattice_program(art)(**inputs)["output"]
    gpu = load_lattice_program(art, device="cuda")(**inputs)["output"]
    assert isinstance(cpu, SparseOutput) and isinstance(gpu, SparseOutput)
    assert gpu.features.is_cuda
    assert torch.equal(gpu.coords.cpu(), cpu.coords)
    torch.testing.assert_close(gpu.features.cpu(), cpu.features, rtol=1e-4, atol=1e-4)


def test_packed_scales_may_be_f32_when_declared(tmp_path: Path) -> None:
    w, x = torch.randn(3, 8), torch.randn(4, 8)
    packed = pack_weight(w, bits=8, group_size=32)
    stored = {"l.weight.weight": packed.weight, "l.weight.scales": packed.scales.float(),
              "l.weight.biases": packed.biases.float()}
    g = h.Graph()
    g.tensor_input("v", "tensor<?x8xf32>")
    g.weight("w", "l.weight", "linear",
             "#lattice.packing<int8, group_size = 32, scale_dtype = f32, mode = affine>")
    g.op("y", "linear", ["v", "w"], ["tensor<?x8xf32>", WL], "", "tensor<?x3xf32>")
    g.output("y", "tensor<?x3xf32>")
    out = _run(tmp_path, g, stored, {"v": x})["output"]
    ref = x @ unpack_weight(*packed.astuple(), bits=8, in_channels=8).T
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    text = (tmp_path / "a" / "graph.mlir").read_text()
    (tmp_path / "a" / "graph.mlir").write_text(text.replace("scale_dtype = f32",
                                                            "scale_dtype = f16"))
    with pytest.raises(ValueError, match="packed scales must be a 3-D f16 tensor"):
        load_lattice_program(tmp_path / "a")


def test_voxelize_quantizes_in_float32(tmp_path: Path) -> None:
    """float32 0.7 / 0.1 is 7.0 in float32 but 6.99.. in float64: the contract's runtimes
    (MLX Lattice, torch-lattice 0.5) divide in float32, so the point lands in cell 7."""
    g = h.Graph()
    for name, ty in (("points", "tensor<?x3xf32>"), ("features", "tensor<?x1xf32>"),
                     ("batch_indices", "tensor<?xi32>"), ("active_rows", "tensor<1xi32>")):
        g.tensor_input(name, ty)
    g.op("v", "voxelize", ["points", "features", "batch_indices", "active_rows"],
         ["tensor<?x3xf32>", "tensor<?x1xf32>", "tensor<?xi32>", "tensor<1xi32>"],
         "voxel_size = array<f64: 0.1, 0.1, 0.1>, origin = array<f64: 0.0, 0.0, 0.0>, "
         f"reduction = #lattice.voxel_reduction<sum>, {h.triple('stride', (1, 1, 1))}", h.SP)
    g.output("v", h.SP)
    pts = torch.tensor([[0.7, 0.9, 1.4]], dtype=torch.float32)
    assert torch.floor(pts.double() / 0.1).tolist() == [[6.0, 8.0, 13.0]]
    out = _run(tmp_path, g, {}, {"points": pts, "features": torch.ones(1, 1),
                                 "batch_indices": torch.zeros(1, dtype=torch.int32),
                                 "active_rows": torch.tensor([1], dtype=torch.int32)})["output"]
    assert isinstance(out, SparseOutput) and out.coords.tolist() == [[0, 7, 9, 14]]


def test_pool_transpose_without_target_generates_the_fine_support(tmp_path: Path) -> None:
    """The contract's no-target route expands every coarse row; it does not return to the
    support the pooling started from."""
    x, inputs = _sparse_x()
    g = h.Graph()
    g.sparse_input("x", 3)
    g.op("p", "pool3d", ["x"], [h.SP], f"mode = #lattice.pool_mode<avg>, "
         f"{_geom((2, 2, 2), (2, 2, 2))}", h.SP)
    g.op("u", "pool_transpose3d", ["p"], [h.SP], _geom((2, 2, 2), (2, 2, 2)), h.SP)
    g.output("u", h.SP)
    out = _run(tmp_path, g, {}, inputs)["output"]
    pooled = F.avg_pool3d(x, 2, 2)
    ref = F.pool_transpose3d(pooled, 2, 2, expand_coordinates=True)
    assert ref.coords.shape[0] == 8 * pooled.coords.shape[0] != x.coords.shape[0]
    _assert_sparse(out, ref)


def test_generated_transpose_below_zero_is_refused(tmp_path: Path) -> None:
    """k3 s2 p1 from a coarse row at 0 generates fine coordinate -1, which a SparseTensor
    cannot hold: the replay says so (a target form is how to express such a layer)."""
    g = h.Graph()
    g.sparse_input("x", 2, (2, 2, 2))
    g.weight("w", "w.weight", "conv3d")
    g.op("y", "conv_transpose3d", ["x", "w"], [h.SP, WC],
         f"{_geom((3, 3, 3), (2, 2, 2), (1, 1, 1))}, {ACC}", h.SP)
    g.output("y", h.SP)
    w = h.artifact_weight(torch.randn(27, 2, 2), (3, 3, 3))
    coords = torch.tensor([[0, 0, 2, 2], [0, 2, 2, 2]], dtype=torch.int32)
    with pytest.raises(ValueError, match=r"lattice\.conv_transpose3d: .*generates coordinate -1"):
        _run(tmp_path, g, {"w.weight": w}, h.sparse_inputs("x", coords, torch.randn(2, 2)))


@pytest.mark.parametrize("op,group,match", [
    ("target_conv_transpose3d", 32, "packed .* not run by MLX Lattice on this op"),
    ("target_conv3d", 16, "group_size must be 32, 64 or 128"),
])
def test_packed_weights_mlx_lattice_refuses_are_refused(tmp_path: Path, op: str, group: int,
                                                         match: str) -> None:
    # MLX Lattice refuses both ("target transpose convolution does not support packed
    # weights."; "quantized weight group_size must be 32, 64, or 128."), so a replay
    # that ran them would vouch for an artifact the consumer cannot run.
    st = (2, 2, 2)
    g = h.Graph()
    g.sparse_input("x", 32, st if op.endswith("transpose3d") else (1, 1, 1))
    g.sparse_input("t", 1, (1, 1, 1) if op.endswith("transpose3d") else st)
    g.weight("w", "conv.weight", "conv3d",
             f"#lattice.packing<int8, group_size = {group}, scale_dtype = f32, mode = affine>")
    g.op("y", op, ["x", "t", "w"], [h.SP, h.SP, WC], f"{_geom((2, 2, 2), st)}, {ACC}", h.SP)
    g.output("y", h.SP)
    w = torch.randn(4, 2, 2, 2, 32)
    stored = pack_weight(w, bits=8, group_size=32).tensors("conv.weight")
    if group != 32:  # the codes of another group size: 16 input channels per group
        stored["conv.weight.scales"] = torch.cat([stored["conv.weight.scales"]] * 2, dim=1)
        stored["conv.weight.biases"] = torch.cat([stored["conv.weight.biases"]] * 2, dim=1)
    art = h.write_artifact(tmp_path / "a", g, stored)
    # physical coordinates: multiples of 2 fit either input's stride
    inputs = {**h.sparse_inputs("x", h.random_coords(10, 3, seed=1) * 2, torch.randn(10, 32)),
              **h.sparse_inputs("t", h.random_coords(12, 4, seed=2) * 2, torch.zeros(12, 1))}
    with pytest.raises(ValueError, match=match):
        load_lattice_program(art)(**inputs)
