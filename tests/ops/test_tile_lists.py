"""Tile lists kept with a neighbour table (torch_lattice.ops.conv.tile_lists).

From a table's second forward on, ``lattice::sparse_conv`` runs over the table's tile
lists instead of listing it again. Every call must give bitwise the result of the first
(which lists the table itself) and match a float64 reference; a table changed in place,
an inference tensor, a non-contiguous table, a second thread count and a table that
names rows past the features are each handled as a user would expect.
"""

from __future__ import annotations

import gc

import pytest
import torch

import torch_lattice as tl
from torch_lattice.ops import conv as T


def _table(n_out: int, k: int, n_in: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    nbr = torch.randint(0, n_in, (n_out, k), generator=g, dtype=torch.int32)
    nbr[torch.rand(n_out, k, generator=g) < 0.75] = -1
    return nbr


def _reference(x: torch.Tensor, w: torch.Tensor, nbr: torch.Tensor) -> torch.Tensor:
    """``sum_n x[nbr[:, n]] @ w[n]`` in float64, absent entries skipped."""
    y = torch.zeros(nbr.shape[0], w.shape[2], dtype=torch.float64)
    for n in range(nbr.shape[1]):
        rows = nbr[:, n].long()
        hit = rows >= 0
        y[hit] += x.double()[rows[hit]] @ w[n].double()
    return y


def _rev(x: torch.Tensor, nbr: torch.Tensor) -> torch.Tensor:
    """A stand-in for ``nbr``'s reversed table, of the shape the op checks: the forward
    alone never reads it."""
    return torch.full((x.shape[0], nbr.shape[1]), -1, dtype=torch.int32)


def _operands(nbr: torch.Tensor, n_in: int, c_in: int, c_out: int, dtype: torch.dtype):
    g = torch.Generator().manual_seed(c_in * 100 + c_out)
    x = torch.randn(n_in, c_in, generator=g).to(dtype)
    w = torch.randn(nbr.shape[1], c_in, c_out, generator=g).to(dtype)
    return x, w


def _entry(nbr: torch.Tensor) -> T._Entry | None:
    return T._cache.get(nbr)


@pytest.fixture(autouse=True)
def _fresh_cache():
    T.clear_tile_lists()
    yield
    T.clear_tile_lists()


# Up to 256 bytes an output row: 64 floats, 32 doubles (over 128, tiles listed from the
# table split each kernel row's first entries; over lists they are zeroed instead).
@pytest.mark.parametrize(
    "dtype,c_in,c_out",
    [(torch.float32, 16, 16), (torch.float32, 5, 32), (torch.float32, 32, 3),
     (torch.float32, 12, 48), (torch.float32, 8, 64),
     (torch.float64, 16, 16), (torch.float64, 7, 5), (torch.float64, 6, 32)],
)  # fmt: skip
def test_later_calls_are_bitwise_the_first(dtype, c_in, c_out):
    nbr, n_in = _table(3000, 27, 2500, 0), 2500
    x, w = _operands(nbr, n_in, c_in, c_out, dtype)
    first = T.sparse_conv(x, w, nbr, _rev(x, nbr))
    assert _entry(nbr) is not None and not _entry(nbr).sizes  # listed by its call
    for _ in range(3):
        assert torch.equal(T.sparse_conv(x, w, nbr, _rev(x, nbr)), first)
    assert len(_entry(nbr).sizes) == 1  # built on the second call, reused since
    tol = 1e-4 if dtype == torch.float32 else 1e-12
    torch.testing.assert_close(first.double(), _reference(x, w, nbr), rtol=tol, atol=tol)


@pytest.mark.parametrize(
    "dtype,c_in,c_out",
    [(torch.float32, 16, 16), (torch.float32, 8, 64), (torch.float32, 16, 40),
     (torch.float64, 16, 16), (torch.float64, 6, 32)],
)  # fmt: skip
def test_lead_kernel_row_first_on_every_path(dtype, c_in, c_out):
    """A forward over an odd kernel adds each row's product through the middle kernel row
    first (``tl_fwd_lead``): tiles whose rows all have that entry (a submanifold map's
    centre) write their rows there, a tile where one row lacks it zeroes its rows, and a
    table listed with each row's first entry kept apart (outputs over 128 bytes) puts the
    lead entry first. The table's first call, the kept tile lists and fetch-on-demand's
    pair lists must give the same bits at 1 and 2 threads, near a float64 reference."""
    from torch_lattice.ops.conv import pair_conv
    from torch_lattice.ops.kmap import kernel_pairs

    n = 5000
    nbr = _table(n, 27, n, 3)
    nbr[:, 13] = torch.arange(n, dtype=torch.int32)  # every row its own centre ...
    nbr[4100, 13] = -1  # ... but one, in a later tile
    nbr[4100, :13] = -1  # whose first entry is then past the lead
    x, w = _operands(nbr, n, c_in, c_out, dtype)
    offsets, pin, pout = kernel_pairs(nbr)
    before = torch.get_num_threads()
    try:
        runs = []
        for threads in (1, 2):
            torch.set_num_threads(threads)
            T.clear_tile_lists()
            first = T.sparse_conv(x, w, nbr, _rev(x, nbr))  # listed from the table
            rev = _rev(x, nbr)
            runs += [first, T.sparse_conv(x, w, nbr, rev), T.sparse_conv(x, w, nbr, rev)]
            assert _entry(nbr) is not None and len(_entry(nbr).sizes) == 1  # over lists
            runs.append(pair_conv(x, w, offsets, pin, pout, None, None, None, n, False))
            runs.append(pair_conv(x, w, offsets, pin, pout, None, None, None, n, True))
    finally:
        torch.set_num_threads(before)
    for y in runs[1:]:
        assert torch.equal(y, runs[0])
    tol = 1e-4 if dtype == torch.float32 else 1e-12
    ref = _reference(x, w, nbr)
    torch.testing.assert_close(runs[0].double(), ref, rtol=tol, atol=tol * ref.abs().max())


def test_lists_follow_the_tables_own_entries():
    """The kept lists name exactly the table's present entries, tile by tile."""
    nbr = _table(1000, 5, 300, 1)
    lists = T.build_tile_lists(nbr, 64)
    k = nbr.shape[1]
    for t in range(-(-1000 // 64)):
        for n in range(k):
            a, b = int(lists.start[t * k + n]), int(lists.start[t * k + n + 1])
            col = nbr[t * 64 : (t + 1) * 64, n]
            rows = torch.nonzero(col >= 0).flatten()
            assert torch.equal(lists.rows_out[a:b].long(), rows)
            assert torch.equal(lists.rows_in[a:b], col[rows])
    assert lists.top == int(nbr.max()) + 1


def test_wide_float_layers_keep_no_lists():
    """float32 and float64 outputs wider than 256 bytes a row list each call."""
    nbr, n_in = _table(2000, 27, 2000, 2), 2000
    for dtype, c_out in ((torch.float32, 65), (torch.float64, 33)):
        x, w = _operands(nbr, n_in, 8, c_out, dtype)
        a = T.sparse_conv(x, w, nbr, _rev(x, nbr))
        b = T.sparse_conv(x, w, nbr, _rev(x, nbr))
        assert torch.equal(a, b)
        entry = _entry(nbr)
        assert entry is None or not entry.sizes


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("c_out", [16, 72])
def test_half_layers_of_any_width_keep_lists(dtype, c_out):
    """The half types' forward never splits its tiles: lists at every width, bitwise
    the first call's output, within the dtype's rounding of a float64 reference."""
    nbr, n_in = _table(3000, 27, 2500, 13), 2500
    x, w = _operands(nbr, n_in, 24, c_out, dtype)
    first = T.sparse_conv(x, w, nbr, _rev(x, nbr))
    for _ in range(2):
        assert torch.equal(T.sparse_conv(x, w, nbr, _rev(x, nbr)), first)
    assert len(_entry(nbr).sizes) == 1
    want = _reference(x, w, nbr)
    err = float((first.double() - want).abs().max() / want.abs().max())
    assert err < 1e-2


def test_a_table_changed_in_place_is_listed_again():
    nbr, n_in = _table(3000, 27, 2500, 3), 2500
    x, w = _operands(nbr, n_in, 16, 16, torch.float32)
    T.sparse_conv(x, w, nbr, _rev(x, nbr))
    T.sparse_conv(x, w, nbr, _rev(x, nbr))  # lists built
    nbr[::7, 13] = -1
    nbr[5::11, 2] = 17
    got = T.sparse_conv(x, w, nbr, _rev(x, nbr))
    assert torch.equal(got, T.sparse_conv(x, w, nbr.clone(), _rev(x, nbr)))  # a new table: listed
    torch.testing.assert_close(got.double(), _reference(x, w, nbr), rtol=1e-4, atol=1e-4)
    T.sparse_conv(x, w, nbr, _rev(x, nbr))  # lists of the changed table
    with torch.no_grad():
        nbr.resize_(1500, 27)  # fewer rows, the same memory
    got = T.sparse_conv(x, w, nbr, _rev(x, nbr))
    assert got.shape[0] == 1500
    torch.testing.assert_close(got.double(), _reference(x, w, nbr), rtol=1e-4, atol=1e-4)


def test_inference_tensors_and_non_contiguous_tables():
    with torch.inference_mode():
        nbr = _table(3000, 27, 2500, 4)
    x, w = _operands(nbr, 2500, 16, 16, torch.float32)
    want = _reference(x, w, nbr)
    with torch.inference_mode():
        outs = [T.sparse_conv(x, w, nbr, _rev(x, nbr)) for _ in range(3)]
    assert len(_entry(nbr).sizes) == 1
    for y in outs:
        torch.testing.assert_close(y.double(), want, rtol=1e-4, atol=1e-4)
    wide = _table(3000, 54, 2500, 5)
    view = wide[:, ::2]  # every call copies it: nothing kept
    for _ in range(2):
        y = T.sparse_conv(x, w, view, _rev(x, view))
        torch.testing.assert_close(y.double(), _reference(x, w, view), rtol=1e-4, atol=1e-4)
    assert _entry(view) is None


def test_each_thread_count_gets_its_own_tiles():
    nbr, n_in = _table(3000, 27, 2500, 6), 2500
    x, w = _operands(nbr, n_in, 16, 16, torch.float32)
    threads = torch.get_num_threads()
    want = T.sparse_conv(x, w, nbr, _rev(x, nbr))
    try:
        for count in (1, 2, 3):
            torch.set_num_threads(count)
            for _ in range(2):
                got = T.sparse_conv(x, w, nbr, _rev(x, nbr))
                torch.testing.assert_close(got, want, rtol=0, atol=0)
    finally:
        torch.set_num_threads(threads)
    assert 1 <= len(_entry(nbr).sizes) <= T.MAX_SIZES


def test_rows_past_the_features_are_refused():
    """Lists kept from calls on 2500 rows do not let a call on fewer read past them."""
    nbr = _table(3000, 27, 2500, 7)
    x, w = _operands(nbr, 2500, 16, 16, torch.float32)
    T.sparse_conv(x, w, nbr, _rev(x, nbr))
    T.sparse_conv(x, w, nbr, _rev(x, nbr))
    assert _entry(nbr).sizes
    with pytest.raises(ValueError, match="rows in"):
        T.sparse_conv(x[:100], w, nbr, _rev(x[:100], nbr))


def test_lists_go_with_their_table():
    nbr = _table(3000, 27, 2500, 8)
    x, w = _operands(nbr, 2500, 16, 16, torch.float32)
    T.sparse_conv(x, w, nbr, _rev(x, nbr))
    T.sparse_conv(x, w, nbr, _rev(x, nbr))
    assert len(T._cache) == 1
    del nbr
    gc.collect()
    assert len(T._cache) == 0


def test_module_gradients_over_kept_lists():
    """A SubmConv3d's forward and input gradient (over the reversed table) run over
    kept lists from their second call; outputs and gradients stay bitwise those of the
    first call."""
    g = torch.Generator().manual_seed(9)
    coords = torch.unique(torch.randint(0, 24, (4000, 3), generator=g), dim=0)
    coords = torch.cat([torch.zeros(coords.shape[0], 1, dtype=coords.dtype), coords], 1)
    x = tl.SparseTensor(torch.randn(coords.shape[0], 16, generator=g), coords.int())
    conv = tl.nn.SubmConv3d(16, 16, 3, bias=False)
    results = []
    for _ in range(3):
        feats = x.feats.detach().requires_grad_(True)
        y = conv(x.replace(feats)).feats
        dy = torch.ones_like(y)
        results.append([y.detach(), *torch.autograd.grad(y, [feats, conv.weight], dy)])
    assert sum(1 for e in T._cache.values() if e.sizes) == 2  # the table and its reverse
    for later in results[1:]:
        for a, b in zip(later, results[0], strict=True):
            assert torch.equal(a, b)


def test_keeping_can_be_turned_off():
    nbr = _table(3000, 27, 2500, 10)
    x, w = _operands(nbr, 2500, 16, 16, torch.float32)
    first = T.sparse_conv(x, w, nbr, _rev(x, nbr))
    T.sparse_conv(x, w, nbr, _rev(x, nbr))
    assert _entry(nbr).sizes
    other = _table(3000, 27, 2500, 11)
    try:
        assert T.keep_tile_lists(False) is True
        for _ in range(3):
            assert torch.equal(T.sparse_conv(x, w, nbr, _rev(x, nbr)), first)
            T.sparse_conv(x, w, other, _rev(x, other))
        assert _entry(other) is None  # neither counted nor built
        assert T.kept_tile_lists(nbr, next(iter(_entry(nbr).sizes))) is None  # kept, unread
    finally:
        assert T.keep_tile_lists(True) is False
    assert T.kept_tile_lists(nbr, next(iter(_entry(nbr).sizes))) is not None
    T.clear_tile_lists()
    assert len(T._cache) == 0
    with pytest.raises(TypeError, match="keep must be a bool"):
        T.keep_tile_lists(1)  # type: ignore[arg-type]


def test_lists_beyond_the_memory_budget_are_not_kept():
    """A table whose lists could outgrow the memory budget is listed by every call
    instead of failing."""
    nbr = _table(3000, 27, 2500, 12)
    x, w = _operands(nbr, 2500, 16, 16, torch.float32)
    first = T.sparse_conv(x, w, nbr, _rev(x, nbr))
    tl.set_memory_budget(8 * nbr.numel() - 1)
    try:
        for _ in range(2):
            assert torch.equal(T.sparse_conv(x, w, nbr, _rev(x, nbr)), first)
        assert not _entry(nbr).sizes
    finally:
        tl.set_memory_budget(None)
    T.sparse_conv(x, w, nbr, _rev(x, nbr))
    assert _entry(nbr).sizes


@pytest.mark.parametrize("isa", ["avx2", "baseline"])
def test_narrower_instruction_sets_over_kept_lists(isa, monkeypatch):
    """The lists hold the same entries on every instruction set: forward and weight
    gradient over them (capped by TORCH_LATTICE_CPU_ISA) are bitwise the first call's."""
    monkeypatch.setenv("TORCH_LATTICE_CPU_ISA", isa)
    nbr, n_in = _table(3000, 27, 2500, 14), 2500
    x, w = _operands(nbr, n_in, 16, 16, torch.float32)
    dy = torch.randn(3000, 16, generator=torch.Generator().manual_seed(14))
    first = T.sparse_conv(x, w, nbr, _rev(x, nbr))
    grad = T.sparse_conv_weight_grad(x, dy, nbr)
    for _ in range(2):
        assert torch.equal(T.sparse_conv(x, w, nbr, _rev(x, nbr)), first)
        assert torch.equal(T.sparse_conv_weight_grad(x, dy, nbr), grad)
    assert _entry(nbr).sizes
    torch.testing.assert_close(first.double(), _reference(x, w, nbr), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("isa", ["auto", "avx2"])
@pytest.mark.parametrize("c", [16, 32])
def test_weight_gradient_over_its_forwards_lists(isa, c, monkeypatch):
    """The weight gradient's blocks (4096 rows at C = 16, 2048 at 32) are whole tiles of
    its forward's lists (2048 and 1024 rows for a table of 40,000 rows at 2 threads): it
    runs over them, bitwise its result over the table and within 1e-4 of a float64
    reference."""
    monkeypatch.setenv("TORCH_LATTICE_CPU_ISA", isa)
    x, dy, nbr, before, after, block, lists = _weight_grad_without_and_over_lists(
        torch.float32, c, c, 15)
    assert block == 2 * lists.tile_rows
    _check_weight_grad(x, dy, nbr, before, after, 1e-4, 1e-3)


@pytest.mark.parametrize(
    "dtype,c_in,c_out",
    [(torch.float32, 32, 16), (torch.float64, 16, 8)],
)  # fmt: skip
def test_one_vector_weight_gradients_over_lists_by_index(dtype, c_in, c_out):
    """A weight gradient one AVX-512 vector wide (16 floats, 8 doubles) over whole input
    channels in 16-row passes reads its forward's lists by index (rows_t_16_runs), one
    pass per 16 input channels (two at C_in = 32): bitwise its result over the table.
    (C = 16 in float32 is the test above.)"""
    x, dy, nbr, before, after, block, lists = _weight_grad_without_and_over_lists(
        dtype, c_in, c_out, 16)
    assert block % lists.tile_rows == 0
    tol = 1e-3 if dtype == torch.float32 else 1e-10
    _check_weight_grad(x, dy, nbr, before, after, tol, tol)


def _weight_grad_without_and_over_lists(
    dtype: torch.dtype, c_in: int, c_out: int, seed: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, int,
           T.TileLists]:
    """At 2 threads, on a 40,000-row table: operands x and dy, the weight gradient
    before any forward has kept lists and after two forwards kept them, the weight
    gradient's block rows and the kept lists it then runs over."""
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        nbr, n_in = _table(40000, 27, 30000, seed), 30000
        x, w = _operands(nbr, n_in, c_in, c_out, dtype)
        dy = torch.randn(40000, c_out, generator=torch.Generator().manual_seed(seed)).to(dtype)
        before = T.sparse_conv_weight_grad(x, dy, nbr)  # no lists yet
        T.sparse_conv(x, w, nbr, _rev(x, nbr))
        T.sparse_conv(x, w, nbr, _rev(x, nbr))
        code = T.DTYPE_CODES[dtype]
        block = T._C.conv_weight_grad_list_rows(code, n_in, 40000, 27, c_in, c_out, 2)
        lists = T.kept_tile_lists(nbr, block)
        assert lists is not None
        after = T.sparse_conv_weight_grad(x, dy, nbr)
    finally:
        torch.set_num_threads(threads)
    return x, dy, nbr, before, after, block, lists


def _check_weight_grad(x: torch.Tensor, dy: torch.Tensor, nbr: torch.Tensor,
                       before: torch.Tensor, after: torch.Tensor, rtol: float,
                       atol: float) -> None:
    """``after`` is bitwise ``before``, and close to a float64 reference."""
    assert torch.equal(after, before)
    want = torch.stack([
        x.double()[nbr[:, n].clamp(min=0).long()].mul((nbr[:, n] >= 0)[:, None]).T @ dy.double()
        for n in range(nbr.shape[1])
    ])  # fmt: skip
    torch.testing.assert_close(after.double(), want, rtol=rtol, atol=atol)
