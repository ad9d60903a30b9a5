"""Porting helpers: ``legacy_coords`` and ``legacy_strided_support`` (docs/migration.md).

Contract, per TorchSparse version:

- ``legacy_coords(rows, version=v, tensor_stride=ts)``: 1.4/2.0 ``[x, y, z, b]``
  physical -> ``[b, x, y, z]`` logical (``x / ts``); 2.1 rows pass through; row order kept.
- ``legacy_strided_support(rows, ...)`` equals a slow, independent transcription of
  each version's downsampling written below in physical units (``_support_*``), sorted
  by (b, x, y, z).

The port test emulates a TorchSparse 1.4 MinkUNet-style network in physical
``[x, y, z, b]`` rows, with its coordinate and kernel-map caches (``Legacy14``), and
checks that the documented recipe (legacy checkpoint -> kernel spec ->
``convert-checkpoint`` -> strict load -> helpers for coordinates and supports)
reproduces every layer's rows and features in float64.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from torch import nn

import torch_lattice as tl
from torch_lattice import migration
from torch_lattice.migration import cli

try:
    import legacy_reference as legacy
except ImportError:  # tests/ may become a package
    from tests import legacy_reference as legacy

F64 = torch.float64
Triple = tuple[int, int, int]


# ---------------------------------------------------------------- slow references


def _axis_offsets(version: str, k: int) -> list[int]:
    if version == "1.4":  # numpy.arange(-k // 2 + 1, k // 2 + 1)
        return list(range(-k // 2 + 1, k // 2 + 1))
    if k % 2 == 0:  # 2.0 downsample_cuda: lower = 0 for even k
        return list(range(k))
    return list(range(-(k - 1) // 2, (k - 1) // 2 + 1))


def _support_1x(phys: list[list[int]], ks: Triple, st: Triple, ts: Triple, version: str):
    """TorchSparse 1.4/2.0 ``spdownsample`` on physical ``[x, y, z, b]`` rows."""
    sample = [st[a] * ts[a] for a in range(3)]
    out = set()
    if all(st[a] in (1, ks[a]) for a in range(3)):
        for x, y, z, b in phys:
            out.add((b, *(c // sample[a] * sample[a] for a, c in enumerate((x, y, z)))))
    else:
        lo = [min(r[a] for r in phys) for a in range(3)]
        offs = [_axis_offsets(version, ks[a]) for a in range(3)]
        for x, y, z, b in phys:
            for o in itertools.product(*offs):
                c = [v + o[a] * ts[a] for a, v in enumerate((x, y, z))]
                if all(c[a] % sample[a] == 0 and c[a] >= lo[a] for a in range(3)):
                    out.add((b, *c))
    # back to logical rows at the output stride, sorted by (b, x, y, z)
    return sorted((b, *(c[a] // sample[a] for a in range(3))) for b, *c in out)


def _support_21(rows: list[list[int]], ks: Triple, st: Triple, pad: Triple, srange=None):
    """TorchSparse 2.1 ``hashmap_on_the_fly`` on logical ``[b, x, y, z]`` rows."""
    if srange is None:
        hi = [(max(r[a + 1] for r in rows) + 2 * pad[a] - (ks[a] - 1)) // st[a] for a in range(3)]
    else:
        hi = [(srange[a + 1] + 2 * pad[a] - (ks[a] - 1) - 1) // st[a] for a in range(3)]
    out = set()
    for b, *c in rows:
        for j in itertools.product(*(range(k) for k in ks)):
            num = [c[a] + pad[a] - j[a] for a in range(3)]
            if all(num[a] % st[a] == 0 and 0 <= num[a] // st[a] <= hi[a] for a in range(3)):
                out.add((b, *(num[a] // st[a] for a in range(3))))
    return sorted(out)


def _scene(seed: int, batches: int = 3, lo=(2, 0, 1), hi=(12, 9, 10), p: float = 0.15):
    """Logical ``[b, x, y, z]`` rows, unsorted, per-axis ranges ``[lo, hi)``."""
    gen = torch.Generator().manual_seed(seed)
    rows = []
    for b in range(batches):
        shape = [hi[a] - lo[a] for a in range(3)]
        cells = torch.nonzero(torch.rand(*shape, generator=gen) < p) + torch.tensor(lo)
        rows.append(torch.cat([torch.full((cells.shape[0], 1), b), cells], dim=1))
    coords = torch.cat(rows)
    return coords[torch.randperm(coords.shape[0], generator=gen)]


def _to_legacy(rows: torch.Tensor, version: str, ts: Triple) -> torch.Tensor:
    """Our logical rows -> legacy rows (the inverse of ``legacy_coords``)."""
    if version == "2.1":
        return rows.clone()
    return torch.cat([rows[:, 1:] * torch.tensor(ts), rows[:, :1]], dim=1)


# ---------------------------------------------------------------- legacy_coords


@pytest.mark.parametrize("version", ["1.4", "2.0", "1.4.0", "2.0.0"])
@pytest.mark.parametrize("ts", [(1, 1, 1), (2, 2, 2), (4, 1, 2)])
def test_legacy_coords_physical_xyzb(version: str, ts: Triple) -> None:
    ours = _scene(0)
    rows = _to_legacy(ours, "1.4", ts)
    got = migration.legacy_coords(rows.int(), version=version, tensor_stride=ts)
    assert got.dtype == torch.int32
    assert torch.equal(got.long(), ours)  # same row order


def test_legacy_coords_21_passes_logical_rows() -> None:
    ours = _scene(1)
    got = migration.legacy_coords(ours, version="2.1", tensor_stride=4)
    assert got.dtype == torch.int32 and torch.equal(got.long(), ours)


def test_legacy_coords_worked_example() -> None:
    rows = torch.tensor([[4, 0, 6, 0], [2, 8, 2, 1]])  # 1.4 at stride 2: [x, y, z, b]
    got = migration.legacy_coords(rows, version="1.4", tensor_stride=2)
    assert got.tolist() == [[0, 2, 0, 3], [1, 1, 4, 1]]


@pytest.mark.parametrize(
    ("kwargs", "exc", "match"),
    [
        ({"coords": [[0, 0, 0, 0]]}, TypeError, "coords must be a torch.Tensor"),
        ({"coords": torch.zeros(2, 4)}, TypeError, "integer dtype"),
        ({"coords": torch.zeros(2, 4, dtype=torch.bool)}, TypeError, "integer dtype"),
        ({"coords": torch.zeros(2, 3, dtype=torch.int32)}, ValueError, r"shape \(N, 4\)"),
        ({"coords": torch.zeros(4, dtype=torch.int32)}, ValueError, r"shape \(N, 4\)"),
        ({"version": "1.3"}, ValueError, "supported TorchSparse versions: 1.4, 2.0, 2.1"),
        ({"version": 2.1}, TypeError, "version must be a str"),
        ({"tensor_stride": 0}, ValueError, "tensor_stride must be >= 1"),
        ({"tensor_stride": (2, 2)}, ValueError, "tensor_stride must be an int or 3 ints"),
        ({"tensor_stride": 2.0}, TypeError, "tensor_stride"),
        ({"tensor_stride": 4}, ValueError, "not a multiple of tensor_stride"),
        ({"coords": torch.tensor([[-2, 0, 0, 0]])}, ValueError, "non-negative"),
        ({"coords": torch.tensor([[0, 0, 0, 2**31]])}, ValueError, "int32"),
    ],
)
def test_legacy_coords_refusals(kwargs: dict, exc: type, match: str) -> None:
    args = {"coords": torch.tensor([[2, 4, 6, 1]]), "version": "1.4", "tensor_stride": 2}
    args |= kwargs
    coords = args.pop("coords")
    with pytest.raises(exc, match=match):
        migration.legacy_coords(coords, **args)


# ---------------------------------------------------------------- legacy_strided_support

GEOMETRIES = [
    ((2, 2, 2), (2, 2, 2)),  # floor branch
    ((3, 3, 3), (2, 2, 2)),  # general branch, centred
    ((3, 1, 3), (2, 1, 2)),  # anisotropic, general
    ((3, 3, 3), (3, 3, 3)),  # stride == kernel: floor branch
    ((2, 3, 2), (2, 1, 2)),  # stride 1 on an axis of size 3: floor branch
    ((4, 2, 3), (2, 2, 3)),  # even k = 4: 1.4 offsets -1..2, 2.0 offsets 0..3
    ((3, 3, 1), (2, 3, 1)),  # mixed
]


@pytest.mark.parametrize(("ks", "st"), GEOMETRIES)
@pytest.mark.parametrize("ts", [(1, 1, 1), (2, 2, 2), (1, 2, 4)])
def test_support_14_matches_transcription(ks: Triple, st: Triple, ts: Triple) -> None:
    ours = _scene(2)
    phys = _to_legacy(ours, "1.4", ts).tolist()
    got = migration.legacy_strided_support(ours, kernel_size=ks, stride=st, version="1.4")
    assert got.dtype == torch.int32
    assert got.tolist() == [list(r) for r in _support_1x(phys, ks, st, ts, "1.4")]
    assert {int(b) for b in got[:, 0]} == {0, 1, 2}  # every batch present


@pytest.mark.parametrize(("ks", "st"), GEOMETRIES)
def test_support_20_matches_transcription(ks: Triple, st: Triple) -> None:
    """A far corner row keeps odd-kernel candidates under the maximum; where a
    candidate still passes it (even k >= 4), 2.0 would alias and the helper refuses."""
    ours = torch.cat([_scene(3), torch.tensor([[0, 30, 30, 30]])])
    phys = _to_legacy(ours, "2.0", (1, 1, 1)).tolist()
    want = _support_1x(phys, ks, st, (1, 1, 1), "2.0")
    general = not all(st[a] in (1, ks[a]) for a in range(3))
    if general and any(r[a + 1] * st[a] > 30 for r in want for a in range(3)):
        with pytest.raises(ValueError, match=r"2\.0 aliases"):
            migration.legacy_strided_support(ours, kernel_size=ks, stride=st, version="2.0")
        return
    got = migration.legacy_strided_support(ours, kernel_size=ks, stride=st, version="2.0")
    assert got.tolist() == [list(r) for r in want]


def test_support_20_refuses_aliasing_inputs() -> None:
    rows = torch.tensor([[0, 2, 0, 0], [0, 7, 0, 0]])
    with pytest.raises(ValueError, match=r"2\.0 aliases"):
        migration.legacy_strided_support(rows, kernel_size=3, stride=2, version="2.0")
    # the floor branch never goes past the maximum
    got = migration.legacy_strided_support(rows, kernel_size=2, stride=2, version="2.0")
    assert got.tolist() == [[0, 1, 0, 0], [0, 3, 0, 0]]


@pytest.mark.parametrize(("ks", "st"), GEOMETRIES)
@pytest.mark.parametrize("pad", [(0, 0, 0), (1, 1, 1), (1, 0, 2)])
@pytest.mark.parametrize("srange", [None, (3, 12, 9, 10), (3, 14, 16, 11)])
def test_support_21_matches_transcription(ks: Triple, st: Triple, pad: Triple, srange) -> None:
    ours = _scene(4)
    got = migration.legacy_strided_support(
        ours, kernel_size=ks, stride=st, padding=pad, version="2.1", spatial_range=srange
    )
    assert got.tolist() == [list(r) for r in _support_21(ours.tolist(), ks, st, pad, srange)]


def test_worked_example_1d() -> None:
    """docs/migration.md: x in {0, 7} at k3 s2 (y = z = 0), ours and legacy."""
    rows = torch.tensor([[0, 0, 0, 0], [0, 7, 0, 0], [1, 7, 0, 0]])

    def xs(version: str, **kw) -> list[list[int]]:
        got = migration.legacy_strided_support(
            rows, kernel_size=(3, 1, 1), stride=(2, 1, 1), version=version, **kw
        )
        return got[:, :2].tolist()

    # 1.4: no upper bound: x = 8 is even and >= the minimum -> cell 4
    assert xs("1.4") == [[0, 0], [0, 3], [0, 4], [1, 3], [1, 4]]
    # 2.1 with padding 1 clips at (7 + 2 - 2) // 2 = 3
    assert xs("2.1", padding=(1, 0, 0)) == [[0, 0], [0, 3], [1, 3]]
    ours = tl.nn.Conv3d(1, 1, (3, 1, 1), stride=(2, 1, 1), padding=(1, 0, 0))
    x = tl.SparseTensor(torch.ones(3, 1), rows, spatial_range=(2, 8, 1, 1))
    assert ours(x).coords[:, :2].tolist() == [[0, 0], [0, 3], [1, 3]]
    # lower edge: with every x >= 1, 1.4 drops cell 0, which we keep
    rows = torch.tensor([[0, 1, 0, 0], [0, 6, 0, 0]])
    got = migration.legacy_strided_support(
        rows, kernel_size=(3, 1, 1), stride=(2, 1, 1), version="1.4"
    )
    assert got[:, 1].tolist() == [1, 3]
    y = ours(tl.SparseTensor(torch.ones(2, 1), rows, spatial_range=(1, 8, 1, 1)))
    assert y.coords[:, 1].tolist() == [0, 1, 3]


def test_edge_cells_upper_and_lower_14() -> None:
    """1.4 keeps upper cells past [0, R_out) and drops lower cells below the minimum."""
    ours = _scene(5)
    got = {
        tuple(r)
        for r in migration.legacy_strided_support(
            ours, kernel_size=3, stride=2, version="1.4"
        ).tolist()
    }
    conv = tl.nn.Conv3d(1, 1, 3, stride=2, padding=1)
    gen = conv(tl.SparseTensor(torch.ones(ours.shape[0], 1), ours))
    mine = {tuple(r) for r in gen.coords.tolist()}
    assert got - mine and mine - got
    assert any(r[3] == 0 for r in mine - got)  # z min is 1: legacy drops z cell 0
    assert max(r[1] for r in got) > max(r[1] for r in mine)


def test_support_empty_input() -> None:
    empty = torch.zeros(0, 4, dtype=torch.int32)
    for v in ("1.4", "2.0", "2.1"):
        got = migration.legacy_strided_support(empty, kernel_size=3, stride=2, version=v)
        assert got.shape == (0, 4) and got.dtype == torch.int32


@pytest.mark.parametrize(
    ("kwargs", "exc", "match"),
    [
        ({"version": "3.0"}, ValueError, "supported TorchSparse versions"),
        ({"stride": 1}, ValueError, "stride must exceed 1 on some axis"),
        ({"stride": (2, 0, 2)}, ValueError, "stride must be >= 1"),
        ({"kernel_size": (3, 3)}, ValueError, "kernel_size must be an int or 3 ints"),
        ({"kernel_size": 0}, ValueError, "kernel_size must be >= 1"),
        ({"kernel_size": "3"}, TypeError, "kernel_size"),
        ({"padding": -1, "version": "2.1"}, ValueError, "padding must be >= 0"),
        ({"padding": 1}, ValueError, "padding must be 0 for TorchSparse 1.4"),
        ({"padding": 1, "version": "2.0"}, ValueError, "padding must be 0 for TorchSparse 2.0"),
        (
            {"spatial_range": (1, 8, 8, 8)},
            ValueError,
            "spatial_range must be None for TorchSparse 1.4",
        ),
        ({"spatial_range": (8, 8, 8), "version": "2.1"}, ValueError, r"\(B, X, Y, Z\)"),
        ({"spatial_range": (1, 8, 0, 8), "version": "2.1"}, ValueError, "positive ints"),
        ({"spatial_range": (1, 8, 8, 8), "version": "2.1"}, ValueError, "spatial_range"),
        ({"coords": torch.tensor([[0, -1, 0, 0]])}, ValueError, "non-negative"),
        ({"coords": torch.zeros(1, 4)}, TypeError, "integer dtype"),
        ({"coords": torch.zeros(1, 3, dtype=torch.int64)}, ValueError, r"\(N, 4\)"),
    ],
)
def test_support_refusals(kwargs: dict, exc: type, match: str) -> None:
    args = {
        "coords": torch.tensor([[0, 1, 2, 3], [1, 4, 4, 4]]),
        "kernel_size": 3,
        "stride": 2,
        "version": "1.4",
    }
    args |= kwargs
    coords = args.pop("coords")
    with pytest.raises(exc, match=match):
        migration.legacy_strided_support(coords, **args)


# ---------------------------------------------------------------- the port


CIN, C, CLASSES = 3, 4, 5
SPEC = {
    "stem.0.kernel": [3, 3, 3],
    "down.0.kernel": [2, 2, 2],
    "block.0.kernel": [3, 3, 3],
    "deep.0.kernel": [3, 3, 3],
    "up.0.kernel": [2, 2, 2],
    "mid.0.kernel": [3, 1, 3],
    "side.0.kernel": [3, 3, 3],
    "head.kernel": [1, 1, 1],
}


class Legacy14:
    """TorchSparse 1.4 ``conv3d`` semantics on physical ``[x, y, z, b]`` rows, with its
    caches: ``cmaps[stride]`` (first coordinates seen at a stride: a later strided conv
    to that stride reuses them) and ``kmaps[(stride, k, s)]`` (a transposed conv reuses
    the matching downsample's map). Kernel row ``n`` reads the input at
    ``out + (pos_n - (k-1)//2) * tensor_stride`` (``legacy_row_positions`` order).
    """

    def __init__(self, coords: torch.Tensor) -> None:
        self.cmaps: dict[Triple, torch.Tensor] = {(1, 1, 1): coords}
        self.kmaps: dict[tuple, tuple] = {}

    @staticmethod
    def _map(src: torch.Tensor, dst: torch.Tensor, ks: Triple, ts: Triple):
        lookup = {tuple(r): i for i, r in enumerate(src.tolist())}
        pairs: list[list[tuple[int, int]]] = []
        for pos in legacy.legacy_row_positions(ks):
            off = [(pos[a] - (ks[a] - 1) // 2) * ts[a] for a in range(3)]
            pl = []
            for o, (x, y, z, b) in enumerate(dst.tolist()):
                i = lookup.get((x + off[0], y + off[1], z + off[2], b))
                if i is not None:
                    pl.append((i, o))
            pairs.append(pl)
        return pairs

    @staticmethod
    def _apply(feats, kernel, pairs, rows, bias=None, transposed=False):
        out = torch.zeros(rows, kernel.shape[-1], dtype=feats.dtype)
        for n, pl in enumerate(pairs):
            for i, o in pl:
                if transposed:
                    i, o = o, i
                out[o] += feats[i] @ kernel[n]
        return out if bias is None else out + bias

    def subm(self, coords, feats, kernel, ks, ts, bias=None):
        return self._apply(feats, kernel, self._map(coords, coords, ks, ts), coords.shape[0], bias)

    def strided(self, coords, feats, kernel, ks, st, ts):
        out_ts = tuple(ts[a] * st[a] for a in range(3))
        if out_ts not in self.cmaps:
            phys = coords.tolist()
            rows = _support_1x(phys, ks, st, ts, "1.4")
            self.cmaps[out_ts] = torch.tensor(
                [[*(r[a + 1] * out_ts[a] for a in range(3)), r[0]] for r in rows]
            ).reshape(-1, 4)
        out = self.cmaps[out_ts]
        key = (ts, ks, st)
        if key not in self.kmaps:
            self.kmaps[key] = self._map(coords, out, ks, ts)
        return out, self._apply(feats, kernel, self.kmaps[key], out.shape[0])

    def transposed(self, feats, kernel, ks, st, ts):
        fine_ts = tuple(ts[a] // st[a] for a in range(3))
        fine = self.cmaps[fine_ts]
        pairs = self.kmaps[(fine_ts, ks, st)]
        return fine, self._apply(feats, kernel, pairs, fine.shape[0], transposed=True)


def legacy_state(seed: int = 0) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)

    def w(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, dtype=F64) / 3

    def bn(prefix: str, c: int) -> dict[str, torch.Tensor]:
        return legacy.random_batch_norm_state(prefix, c, gen, batches_tracked=11)

    s = {"stem.0.kernel": w(27, CIN, C)} | bn("stem.1.", C)
    s |= {"down.0.kernel": w(8, C, 2 * C)} | bn("down.1.", 2 * C)
    s |= {"block.0.kernel": w(27, 2 * C, 2 * C), "block.0.bias": w(2 * C)}
    s |= bn("block.1.", 2 * C)
    s |= {"deep.0.kernel": w(27, 2 * C, 2 * C)} | bn("deep.1.", 2 * C)
    s |= {"up.0.kernel": w(8, 2 * C, C)} | bn("up.1.", C)
    s |= {"mid.0.kernel": w(9, 2 * C, C)} | bn("mid.1.", C)
    s |= {"side.0.kernel": w(27, C, 2 * C)} | bn("side.1.", 2 * C)
    s |= {"head.kernel": w(C, CLASSES), "head.bias": w(CLASSES)}  # pointwise: 2-D
    return s


def legacy_forward(s, coords: torch.Tensor, feats: torch.Tensor) -> dict[str, tuple]:
    """The legacy 1.4 network (as its model definition would run it), layer by layer.

    Returns ``{name: (physical [x, y, z, b] rows, tensor stride, features)}``.
    """
    net = Legacy14(coords)

    def br(f, prefix):
        return torch.relu(legacy.batch_norm(f, s, prefix))

    one, two, four = (1, 1, 1), (2, 2, 2), (4, 4, 4)
    x0 = br(net.subm(coords, feats, s["stem.0.kernel"], (3, 3, 3), one), "stem.1.")
    c2, d = net.strided(coords, x0, s["down.0.kernel"], (2, 2, 2), (2, 2, 2), one)
    d = br(d, "down.1.")
    d = br(net.subm(c2, d, s["block.0.kernel"], (3, 3, 3), two, s["block.0.bias"]), "block.1.")
    c4, g = net.strided(c2, d, s["deep.0.kernel"], (3, 3, 3), (2, 2, 2), two)
    g = br(g, "deep.1.")
    c1, u = net.transposed(d, s["up.0.kernel"], (2, 2, 2), (2, 2, 2), two)
    assert torch.equal(c1, coords)
    u = br(u, "up.1.")
    m = br(net.subm(coords, torch.cat([u, x0], 1), s["mid.0.kernel"], (3, 1, 3), one), "mid.1.")
    c2b, h = net.strided(coords, m, s["side.0.kernel"], (3, 3, 3), (2, 2, 2), one)
    assert c2b is c2  # the cache: side became a target conv onto down's support
    h = br(h, "side.1.")
    y = legacy.pointwise(m, s["head.kernel"], s["head.bias"])
    return {
        "head": (coords, one, y),
        "side": (c2, two, h),
        "deep": (c4, four, g),
        "block": (c2, two, d),
    }


class Port(nn.Module):
    """The Torch Lattice port of the legacy network, following docs/migration.md."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(tl.nn.SubmConv3d(CIN, C, 3), tl.nn.BatchNorm(C), tl.nn.ReLU())
        self.down = nn.Sequential(
            tl.nn.Conv3d(C, 2 * C, 2, stride=2), tl.nn.BatchNorm(2 * C), tl.nn.ReLU()
        )
        self.block = nn.Sequential(
            tl.nn.SubmConv3d(2 * C, 2 * C, 3, bias=True), tl.nn.BatchNorm(2 * C), tl.nn.ReLU()
        )
        # legacy k3 s2: centred window = padding 1
        self.deep = nn.Sequential(
            tl.nn.Conv3d(2 * C, 2 * C, 3, stride=2, padding=1), tl.nn.BatchNorm(2 * C), tl.nn.ReLU()
        )
        self.up = nn.Sequential(
            tl.nn.ConvTranspose3d(2 * C, C, 2, stride=2), tl.nn.BatchNorm(C), tl.nn.ReLU()
        )
        self.mid = nn.Sequential(
            tl.nn.SubmConv3d(2 * C, C, (3, 1, 3)), tl.nn.BatchNorm(C), tl.nn.ReLU()
        )
        self.side = nn.Sequential(
            tl.nn.Conv3d(C, 2 * C, 3, stride=2, padding=1), tl.nn.BatchNorm(2 * C), tl.nn.ReLU()
        )
        self.head = tl.nn.Conv3d(C, CLASSES, kernel_size=1, bias=True)

    @staticmethod
    def _strided(seq: nn.Sequential, x: tl.SparseTensor, coordinates) -> tl.SparseTensor:
        y = seq[0](x, coordinates=coordinates)
        return seq[2](seq[1](y))

    def forward(self, x: tl.SparseTensor) -> dict[str, tl.SparseTensor]:
        def support(t: tl.SparseTensor, k: int) -> torch.Tensor:
            return migration.legacy_strided_support(
                t.coords, kernel_size=k, stride=2, version="1.4"
            )

        x0 = self.stem(x)
        d = self.block(self._strided(self.down, x0, support(x0, 2)))
        g = self._strided(self.deep, d, support(d, 3))
        u = self.up[2](self.up[1](self.up[0](d, x0)))
        m = self.mid(tl.cat([u, x0]))
        h = self._strided(self.side, m, d)  # legacy cache: target conv onto down's support
        return {"head": self.head(m), "side": h, "deep": g, "block": d}


def _legacy_scene(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Legacy 1.4 input: physical [x, y, z, b] rows (stride 1), 3 batches, x >= 2."""
    ours = _scene(seed, p=0.3)
    coords = torch.cat([ours[:, 1:], ours[:, :1]], dim=1).int()
    feats = torch.randn(
        coords.shape[0], CIN, generator=torch.Generator().manual_seed(seed), dtype=F64
    )
    return coords, feats


def _port_outputs(weights: dict[str, torch.Tensor], coords, feats) -> dict[str, tl.SparseTensor]:
    model = Port().double().eval()
    model.load_state_dict(weights, strict=True)
    x = tl.SparseTensor(feats, migration.legacy_coords(coords, version="1.4"))
    with torch.no_grad():
        return model(x)


def _compare(expected: dict[str, tuple], got: dict[str, tl.SparseTensor]) -> None:
    for name, (rows, ts, feats) in expected.items():
        y = got[name]
        assert y.stride == ts, name
        want = migration.legacy_coords(rows, version="1.4", tensor_stride=ts)
        assert torch.equal(y.coords.cpu(), want), name
        torch.testing.assert_close(y.feats, feats, rtol=1e-10, atol=1e-10, msg=name)


@pytest.mark.parametrize("via", ["cli", "api"])
def test_port_reproduces_legacy_14_network(tmp_path: Path, via: str) -> None:
    state = legacy_state(seed=1)
    coords, feats = _legacy_scene(seed=2)
    expected = legacy_forward(state, coords, feats)
    source = tmp_path / "legacy.pt"
    torch.save({"model": state, "epoch": 3}, source)
    spec = tmp_path / "legacy-kernels.json"
    spec.write_text(json.dumps(SPEC))
    out = tmp_path / "weights.safetensors"
    if via == "cli":
        assert cli.main([str(source), str(out), "--kernel-spec", str(spec)]) == 0
    else:
        migration.convert_checkpoint(source, out, spec)
    got = _port_outputs(load_file(str(out)), coords, feats)
    _compare(expected, got)


def test_port_scene_exercises_the_differences() -> None:
    """Guards: batch > 0 everywhere, and the legacy supports differ from what
    Torch Lattice generates (so the helpers and the cached target are needed)."""
    coords, feats = _legacy_scene(seed=2)
    expected = legacy_forward(legacy_state(seed=1), coords, feats)
    for rows, _, _ in expected.values():
        assert set(rows[:, 3].tolist()) == {0, 1, 2}
    x = tl.SparseTensor(feats, migration.legacy_coords(coords, version="1.4"))
    d = migration.legacy_coords(expected["block"][0], version="1.4", tensor_stride=2)
    dt = tl.SparseTensor(torch.zeros(d.shape[0], 1, dtype=F64), d, stride=2)
    gen = tl.nn.Conv3d(1, 1, 3, stride=2, padding=1).double()(dt)
    legacy4 = {
        tuple(r)
        for r in migration.legacy_coords(
            expected["deep"][0], version="1.4", tensor_stride=4
        ).tolist()
    }
    ours4 = {tuple(r) for r in gen.coords.tolist()}
    assert legacy4 - ours4 and ours4 - legacy4  # upper cells kept, lower cells dropped
    side = migration.legacy_strided_support(x.coords, kernel_size=3, stride=2, version="1.4")
    assert not torch.equal(side, d)  # without the cache the side conv would differ


def test_port_without_the_recipe_differs(tmp_path: Path) -> None:
    """The deep layer with our generated support and legacy rows read as-is both fail."""
    state = legacy_state(seed=1)
    coords, feats = _legacy_scene(seed=2)
    expected = legacy_forward(state, coords, feats)
    weights = migration.convert_state_dict(state, SPEC).state_dict
    model = Port().double().eval()
    model.load_state_dict(weights, strict=True)
    x = tl.SparseTensor(feats, migration.legacy_coords(coords, version="1.4"))
    with torch.no_grad():
        d = model.block(Port._strided(model.down, model.stem(x), None))
        g = Port._strided(model.deep, d, None)  # our [0, R_out) support
    want = migration.legacy_coords(expected["deep"][0], version="1.4", tensor_stride=4)
    assert g.coords.shape != want.shape or not torch.equal(g.coords, want)
    with pytest.raises(AssertionError):
        _compare(
            {"head": expected["head"]}, {"head": model(tl.SparseTensor(feats, coords))["head"]}
        )
