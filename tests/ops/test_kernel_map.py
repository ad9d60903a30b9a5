"""Kernel-map invariants, checked against a brute-force enumeration.

Invariant: ``nbr[o, n] == i`` iff ``in[i] == out[o] * stride - padding +
r_n * dilation`` (same batch), else -1; and ``rev[i, n] == o`` iff
``nbr[o, n] == i``.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from torch_lattice.data.synthetic import height_field
from torch_lattice.geometry import ConvGeometry, kernel_positions
from torch_lattice.ops import build_kernel_map, generate_support


def _coords(n: int, side: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    c = torch.randint(0, side, (n, 4), generator=g)
    c[:, 0] %= 3
    c = torch.unique(c, dim=0)
    return c[torch.randperm(c.shape[0], generator=g)].to(torch.int32)


def _brute_nbr(inp: torch.Tensor, out: torch.Tensor, g: ConvGeometry) -> torch.Tensor:
    index = {tuple(r): i for i, r in enumerate(inp.tolist())}
    pos = kernel_positions(g.kernel_size).tolist()
    nbr = torch.full((out.shape[0], len(pos)), -1, dtype=torch.int32)
    for o, (b, *q) in enumerate(out.tolist()):
        for n, r in enumerate(pos):
            c = tuple(q[a] * g.stride[a] - g.padding[a] + r[a] * g.dilation[a] for a in range(3))
            nbr[o, n] = index.get((b, *c), -1)
    return nbr


CASES = [
    ConvGeometry.submanifold((3, 3, 3), (1, 1, 1)),
    ConvGeometry.submanifold((5, 1, 3), (1, 2, 2)),
    ConvGeometry((2, 2, 2), (2, 2, 2)),
    ConvGeometry((3, 3, 3), (2, 2, 2), (1, 1, 1)),
    ConvGeometry((4, 2, 3), (3, 1, 2), (2, 0, 1), (1, 3, 2)),
]


def _sorted(c: torch.Tensor) -> torch.Tensor:
    return torch.unique(c, dim=0)  # ascending (b, x, y, z)


# Rows in ascending (b, x, y, z) order take the merge path of the C core,
# other orders its hash table; both must give the brute-force tables.
ORDERS = {
    "permuted": lambda inp, out: (inp, out),
    "sorted": lambda inp, out: (_sorted(inp), _sorted(out)),
    "sorted-input": lambda inp, out: (_sorted(inp), out),
    "sorted-output": lambda inp, out: (inp, _sorted(out)),
}


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("g", CASES)
def test_neighbour_tables_match_brute_force(g: ConvGeometry, order: str) -> None:
    inp, out = ORDERS[order](_coords(120, 9, 0), _coords(80, 6, 1))
    kmap = build_kernel_map(inp, out, g)
    assert torch.equal(kmap.nbr, _brute_nbr(inp, out, g))
    rev = torch.full_like(kmap.rev, -1)
    for o, n in itertools.product(range(out.shape[0]), range(g.volume)):
        i = int(kmap.nbr[o, n])
        if i >= 0:
            rev[i, n] = o
    assert torch.equal(kmap.rev, rev)


@pytest.mark.parametrize("g", CASES[2:])
@pytest.mark.parametrize("fill", [1.0, 0.05], ids=["dense", "sparse"])
def test_strided_map_onto_generated_support(g: ConvGeometry, fill: float) -> None:
    """A strided layer's map onto its own generated support, inputs ascending: a dense
    block (few outputs per input, so the C core merges from the outputs' side) and a
    sparse one (many, so it fills the table from the inputs' side) give the brute-force
    table."""
    side = 12
    axes = [torch.arange(side)] * 3
    grid = torch.stack(torch.meshgrid(*axes, indexing="ij"), dim=-1).reshape(-1, 3)
    keep = torch.rand(grid.shape[0], generator=torch.Generator().manual_seed(3)) < fill
    inp = torch.cat([torch.zeros(int(keep.sum()), 1, dtype=torch.long), grid[keep]], 1).int()
    out = generate_support(inp, *map(list, g.as_c()), list(g.output_range((side,) * 3)), 1)
    assert out.shape[0] > 0
    kmap = build_kernel_map(inp, out, g)
    assert torch.equal(kmap.nbr, _brute_nbr(inp, out, g))
    assert torch.equal(kmap.rev, _transpose(kmap.nbr, inp.shape[0]))


def _transpose(nbr: torch.Tensor, n_in: int) -> torch.Tensor:
    rev = torch.full((n_in, nbr.shape[1]), -1, dtype=torch.int32)
    o, n = torch.nonzero(nbr >= 0, as_tuple=True)
    rev[nbr[o, n].long(), n] = o.to(torch.int32)
    return rev


@pytest.mark.parametrize(
    "g",
    [
        CASES[0],
        CASES[1],  # anisotropic odd sizes with dilation: still symmetric offsets
        ConvGeometry((3, 3, 3), (1, 1, 1), (0, 1, 2)),  # not centred: the general path
        ConvGeometry((2, 2, 2), (1, 1, 1), (1, 1, 1)),  # even size: no mirror offsets
    ],
)
@pytest.mark.parametrize("order", ["sorted", "permuted"])
def test_a_support_with_itself_has_rev_the_transpose_of_nbr(g: ConvGeometry, order: str) -> None:
    """One tensor as input and output (the case whose rev is nbr's kernel rows reversed)."""
    coords = ORDERS[order](_coords(150, 8, 6), _coords(1, 8, 7))[0]
    kmap = build_kernel_map(coords, coords, g)
    assert torch.equal(kmap.nbr, _brute_nbr(coords, coords, g))
    assert torch.equal(kmap.rev, _transpose(kmap.nbr, coords.shape[0]))


@pytest.mark.parametrize("order", ["sorted", "permuted"])
def test_repeated_input_row_is_refused_in_any_order(order: str) -> None:
    inp = _sorted(_coords(50, 6, 3))
    inp = torch.cat([inp[:10], inp[9:]])  # row 9 twice, still ascending
    if order == "permuted":
        inp = inp.flip(0)
    with pytest.raises(ValueError, match="duplicate"):
        build_kernel_map(inp, inp, CASES[0])


def test_merge_and_hash_paths_agree_on_a_surface() -> None:
    """A sorted surface (the merge path) against the same rows shuffled (the hash
    path): the same relation, rows renamed by the permutation."""
    coords = height_field(40, seed=4)
    coords = _sorted(coords)
    perm = torch.randperm(coords.shape[0], generator=torch.Generator().manual_seed(5))
    g = CASES[0]
    merged = build_kernel_map(coords, coords, g).nbr
    hashed = build_kernel_map(coords[perm], coords[perm], g).nbr
    inv = torch.empty_like(perm)
    inv[perm] = torch.arange(perm.shape[0])
    renamed = torch.where(merged[perm] >= 0, inv[merged[perm].clamp(min=0)], -1)
    assert torch.equal(hashed, renamed.to(hashed.dtype))


# The C core generates supports by sorting packed candidate keys where an input reaches at
# most 8 outputs (the first two), else through its hash table (the last two: 12 and 27).
GENERATING = [*CASES[2:], ConvGeometry((5, 5, 5), (2, 2, 2), (2, 2, 2))]


@pytest.mark.parametrize("g", GENERATING)
def test_generated_support_is_reachable_set_sorted(g: ConvGeometry) -> None:
    inp = _coords(150, 10, 2)
    rng = g.output_range((10, 10, 10))
    got = generate_support(inp, *map(list, g.as_c()), list(rng), 3)
    pos = kernel_positions(g.kernel_size).tolist()
    have = {tuple(r) for r in inp.tolist()}
    want = []
    for b in range(3):
        for q in itertools.product(*(range(r) for r in rng)):
            for r in pos:
                c = tuple(
                    q[a] * g.stride[a] - g.padding[a] + r[a] * g.dilation[a] for a in range(3)
                )
                if (b, *c) in have:
                    want.append((b, *q))
                    break
    assert got.tolist() == [list(w) for w in want]


def test_wide_coordinates_have_no_span_limit() -> None:
    """Coordinates anywhere in int32 hash and sort correctly (no packing)."""
    big = 2**31 - 2
    inp = torch.tensor([[0, big, 0, big], [0, big - 1, 0, big], [5, 0, big, 0]], dtype=torch.int32)
    g = ConvGeometry.submanifold((3, 3, 3), (1, 1, 1))
    kmap = build_kernel_map(inp, inp, g)
    assert torch.equal(kmap.nbr, _brute_nbr(inp, inp, g))
    g2 = ConvGeometry((2, 2, 2), (2, 2, 2))
    got = generate_support(inp, *map(list, g2.as_c()), [2**30] * 3, 6)
    h = big // 2
    assert got.tolist() == [[0, h - 1, 0, h], [0, h, 0, h], [5, 0, h, 0]]
