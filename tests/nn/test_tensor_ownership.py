"""SparseTensor owns its coordinates, and per-call caches are bounded (issue 21).

A caller who edits the coordinate tensor it passed in must change nothing: not the
support, not its validation, not the cached kernel maps. ``conv3d(x, coordinates=q)``
with a fresh ``q`` every call must not grow ``x``'s caches without bound.
"""

from __future__ import annotations

import pytest
import torch

import torch_lattice as tl
from torch_lattice.nn import functional as F
from torch_lattice.tensor import TRANSIENT_CACHE_SIZE, validate_coords


def _coords(n: int = 30, extent: int = 5, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    cells = torch.randperm(2 * extent**3, generator=g)[:n].sort().values
    b, rest = cells // extent**3, cells % extent**3
    return torch.stack([b, rest // extent**2, (rest // extent) % extent, rest % extent],
                       dim=1).to(torch.int32)


def _weight(k: int, cin: int = 2, cout: int = 3, seed: int = 1) -> torch.Tensor:
    return torch.randn(k, cin, cout, generator=torch.Generator().manual_seed(seed),
                       dtype=torch.float64)


def test_validate_coords_never_returns_the_callers_tensor() -> None:
    coords = _coords()
    out = validate_coords(coords)
    assert out.dtype == torch.int32
    assert out.untyped_storage().data_ptr() != coords.untyped_storage().data_ptr()
    coords[0, 1] = -5
    assert int(out.min()) >= 0


def test_editing_the_callers_coords_changes_nothing() -> None:
    coords = _coords()
    feats = torch.randn(coords.shape[0], 2, dtype=torch.float64)
    x = tl.SparseTensor(feats, coords)
    w = _weight(27)
    before = F.subm_conv3d(x, w, None, 3, 1).feats.clone()
    original = coords.clone()
    # Negative, duplicate and moved rows in the caller's tensor, after construction.
    coords[0] = torch.tensor([0, -1, -1, -1], dtype=torch.int32)
    coords[1] = coords[2]
    coords[3, 1] += 1
    assert torch.equal(x.coords, original)
    after = F.subm_conv3d(x, w, None, 3, 1)  # served from the cached map
    assert torch.equal(after.coords, original)
    torch.testing.assert_close(after.feats, before, rtol=0, atol=0)
    fresh = F.subm_conv3d(tl.SparseTensor(feats, original), w, None, 3, 1).feats
    torch.testing.assert_close(after.feats, fresh, rtol=0, atol=0)
    down = F.conv3d(x, _weight(8), None, 2, 2)  # a generated support from the owned rows
    ref = F.conv3d(tl.SparseTensor(feats, original), _weight(8), None, 2, 2)
    assert torch.equal(down.coords, ref.coords)


def test_a_target_tensor_is_copied_too() -> None:
    x = tl.SparseTensor(torch.randn(30, 2, dtype=torch.float64), _coords())
    q = torch.unique(torch.div(_coords(), 2, rounding_mode="floor"), dim=0).to(torch.int32)
    original = q.clone()
    w = _weight(8)
    y = F.conv3d(x, w, None, 2, 2, coordinates=q)
    q[0, 1] = 100
    assert torch.equal(y.coords, original)


def test_editing_the_stored_rows_in_place_is_refused() -> None:
    x = tl.SparseTensor(torch.randn(30, 2, dtype=torch.float64), _coords())
    w = _weight(27)
    F.subm_conv3d(x, w, None, 3, 1)
    x.coords[0, 1] += 1  # the stored tensor itself: the cached map would be stale
    with pytest.raises(ValueError, match="modified in place"):
        F.subm_conv3d(x, w, None, 3, 1)


@pytest.mark.parametrize("edit", ["resize_", "as_strided_", "unsqueeze_"])
def test_rows_reshaped_in_place_are_refused_by_every_layer(edit: str) -> None:
    """A strided layer or a pooling read the rows' range or batches before the check and
    failed on the reshaped rows with a range error or a TypeError."""
    x = tl.SparseTensor(torch.randn(30, 2, dtype=torch.float64), _coords())
    F.subm_conv3d(x, _weight(27), None, 3, 1)
    {"resize_": lambda t: t.resize_(2, 4),
     "as_strided_": lambda t: t.as_strided_((t.shape[0], 4), (0, 1)),
     "unsqueeze_": lambda t: t.unsqueeze_(0)}[edit](x.coords)
    for layer in (tl.nn.Conv3d(2, 2, 2, stride=2).double(), tl.nn.MaxPool3d(2, 2),
                  tl.nn.GlobalMaxPool(), tl.nn.SubmConv3d(2, 2, 3).double()):
        with pytest.raises(ValueError, match="modified in place"):
            layer(x)


def test_fresh_targets_keep_the_cache_bounded() -> None:
    """1,000 calls with a new target each: the per-tensor caches stay bounded."""
    x = tl.SparseTensor(torch.randn(30, 2), _coords())
    w = torch.randn(8, 2, 3)
    manager = x.coordinate_manager
    F.conv3d(x, w, None, 2, 2)  # the tensor's own (stable) maps
    stable = manager.cache_sizes()["kernel_maps"]
    base = torch.unique(torch.div(_coords(), 2, rounding_mode="floor"), dim=0).to(torch.int32)
    sizes = []
    for i in range(1000):
        q = base.clone()
        q[:, 1] += i % 3  # some fresh rows, always a fresh tensor
        target = q if i % 2 else tl.SparseTensor(torch.zeros(q.shape[0], 1), q, stride=2)
        F.conv3d(x, w, None, 2, 2, coordinates=target)
        sizes.append(manager.cache_sizes())
    assert max(s["transient"] for s in sizes) == TRANSIENT_CACHE_SIZE
    assert all(s["kernel_maps"] == stable for s in sizes)
    assert manager.builds >= 1000  # every fresh target really built a map


def test_a_reused_target_is_served_from_the_cache() -> None:
    x = tl.SparseTensor(torch.randn(30, 2), _coords())
    q = tl.SparseTensor(torch.zeros(1, 1), torch.tensor([[0, 1, 1, 1]], dtype=torch.int32),
                        stride=2)
    w = torch.randn(8, 2, 3)
    F.conv3d(x, w, None, 2, 2, coordinates=q)
    builds = x.coordinate_manager.builds
    for _ in range(5):
        F.conv3d(x, w, None, 2, 2, coordinates=q)
    assert x.coordinate_manager.builds == builds


def test_a_fixed_target_with_fresh_sources_stays_bounded() -> None:
    fine = tl.SparseTensor(torch.randn(30, 2), _coords())
    coarse = F.conv3d(fine, torch.randn(8, 2, 2), None, 2, 2)
    w = torch.randn(8, 2, 2)
    for i in range(100):
        src = tl.SparseTensor(torch.randn(coarse.coords.shape[0], 2), coarse.coords.clone(),
                              stride=2)
        F.conv_transpose3d(src, w, None, 2, 2, coordinates=fine)
        assert fine.coordinate_manager.cache_sizes()["transient"] <= TRANSIENT_CACHE_SIZE, i


def test_pool_transpose_without_target_stays_bounded() -> None:
    x = tl.SparseTensor(torch.randn(30, 2), _coords(), stride=2)
    for _ in range(2 * TRANSIENT_CACHE_SIZE):
        F.pool_transpose3d(x, 2, 2, expand_coordinates=True)
    sizes = x.coordinate_manager.cache_sizes()
    assert sizes["transient"] <= TRANSIENT_CACHE_SIZE and sizes["kernel_maps"] == 0


def test_the_unet_reuses_its_padded_support() -> None:
    net = tl.backbones.SparseResUNet42(2, 3, width=0.25).eval()
    x = tl.SparseTensor(torch.randn(30, 2), _coords())
    with torch.no_grad():
        net(x)
        sizes = x.coordinate_manager.cache_sizes()
        builds = x.coordinate_manager.builds
        net(x)
    assert x.coordinate_manager.cache_sizes() == sizes
    assert x.coordinate_manager.builds == builds


@pytest.mark.parametrize("size", [1e-50, 1e39, [1.0, 1e-45, 1.0]])
def test_a_voxel_size_that_is_not_a_float32_is_refused(size: object) -> None:
    points = torch.rand(5, 3)
    with pytest.raises(ValueError, match="voxel_size must be a positive finite float32"):
        tl.voxelize(points, torch.ones(5, 1), voxel_size=size)  # type: ignore[arg-type]
    x = tl.voxelize(points, torch.ones(5, 1), voxel_size=0.5)
    with pytest.raises(ValueError, match="voxel_size must be a positive finite float32"):
        tl.devoxelize(points, x, voxel_size=size)  # type: ignore[arg-type]


@pytest.mark.parametrize("srange", [(1, 2**31 + 1, 8, 8), (2**40, 8, 8, 8)])
def test_a_spatial_range_past_int32_is_refused(srange: tuple[int, int, int, int]) -> None:
    with pytest.raises(ValueError, match=r"spatial_range entries must be at most 2\^31"):
        tl.SparseTensor(torch.ones(1, 1), torch.zeros(1, 4, dtype=torch.int32),
                        spatial_range=srange)
    edge = tl.SparseTensor(torch.ones(1, 1), torch.zeros(1, 4, dtype=torch.int32),
                           spatial_range=(1, 2**31, 1, 1))
    assert edge.spatial_range == (1, 2**31, 1, 1)


def test_an_expanded_coordinate_view_is_refused_before_it_is_copied() -> None:
    previous = tl.set_memory_budget(2**30)
    try:
        rows = torch.zeros(1, 4, dtype=torch.int32).expand(2**31, 4)  # 32 GiB if copied
        with pytest.raises(ValueError, match="rows must be unique, row 1 repeats"):
            tl.SparseTensor(torch.zeros(1, 1).expand(2**31, 1), rows)
        tl.set_memory_budget(2**20)
        wide = torch.zeros(2**16, 1, dtype=torch.int64).expand(2**16, 4)  # 3 MiB to copy
        with pytest.raises(ValueError, match=r"copying coords .* memory budget"):
            validate_coords(wide)
    finally:
        tl.set_memory_budget(previous)


def _subm_ones() -> tl.nn.SubmConv3d:
    m = tl.nn.SubmConv3d(1, 1)
    m.weight.data.fill_(1)
    return m


# Row 3 moved next to rows 0-2 (a stale map misses the new neighbours), or out of range.
@pytest.mark.parametrize("moved", [[0, 0, 1, 0], [0, 5, 0, 0]], ids=["inside", "outside_range"])
def test_editing_the_stored_rows_under_inference_mode_is_refused(moved: list[int]) -> None:
    coords = torch.tensor([[0, 0, 0, 0], [0, 1, 0, 0], [0, 1, 1, 1], [1, 2, 2, 2]],
                          dtype=torch.int32)
    m = _subm_ones()
    with torch.inference_mode():
        x = tl.SparseTensor(torch.ones(4, 1), coords, spatial_range=(2, 3, 3, 3))
        m(x)
        x.coords[3] = torch.tensor(moved, dtype=torch.int32)
        with pytest.raises(ValueError, match="modified in place"):
            m(x)
    with pytest.raises(ValueError, match="modified in place"):
        m(x)  # and after leaving inference mode


def test_editing_the_stored_rows_before_the_first_call_under_inference_mode() -> None:
    with torch.inference_mode():
        x = tl.SparseTensor(torch.ones(30, 1), _coords())
        x.coords[0, 1] += 1
        with pytest.raises(ValueError, match="modified in place"):
            _subm_ones()(x)


def test_supports_made_under_inference_mode_track_edits() -> None:
    # Generated rows (a strided convolution's output, voxelized points) are made by ops
    # under inference mode too; an edit through .coords must still be seen.
    down = tl.nn.Conv3d(1, 1, kernel_size=2, stride=2)
    with torch.inference_mode():
        x = tl.SparseTensor(torch.ones(30, 1), _coords())
        y = down(x)
        assert not y.coords.is_inference()
        _subm_ones()(y)
        y.coords[0, 1] += 7
        with pytest.raises(ValueError, match="modified in place"):
            _subm_ones()(y)
        v = tl.voxelize(torch.rand(50, 3) * 4, torch.ones(50, 1))
        _subm_ones()(v)
        v.coords[0, 1] += 9
        with pytest.raises(ValueError, match="modified in place"):
            _subm_ones()(v)


def test_inference_mode_results_match_a_fresh_tensor() -> None:
    coords, feats = _coords(), torch.randn(30, 2, dtype=torch.float64)
    w = _weight(27)
    want = F.subm_conv3d(tl.SparseTensor(feats, coords), w, None, 3, 1).feats
    with torch.inference_mode():
        x = tl.SparseTensor(feats, coords)
        got = [F.subm_conv3d(x, w, None, 3, 1).feats for _ in range(2)]
    for g in got:
        torch.testing.assert_close(g, want, rtol=0, atol=0)


def test_training_after_an_inference_mode_pass_on_the_same_support() -> None:
    """A validation pass under torch.inference_mode builds and caches the maps; a later
    training call on the same support saves them for backward, so they must be normal
    tensors (as torch.nn.Conv3d allows the same pattern)."""
    torch.manual_seed(0)
    coords = torch.unique(torch.randint(0, 8, (300, 4)) % torch.tensor([2, 8, 8, 8]), dim=0)
    x = tl.SparseTensor(torch.randn(len(coords), 4, requires_grad=True), coords)
    fine = tl.SparseTensor(torch.randn(len(coords), 4), coords, stride=2)
    down = tl.nn.Conv3d(4, 4, 2, stride=2)
    calls = {
        "subm": lambda: tl.nn.SubmConv3d(4, 4, 3)(x),
        "strided": lambda: down(x),
        "inverse": lambda: tl.nn.ConvTranspose3d(4, 4, 2, stride=2)(down(x)),
        "target": lambda: tl.nn.ConvTranspose3d(4, 4, 2, stride=2)(down(x), x),
        "normalized": lambda: tl.nn.NormalizedSubmConv3d(4, 4, 3)(x),
        "max pool": lambda: tl.nn.MaxPool3d(2, 2)(x),
        "generative": lambda: tl.nn.GenerativeConvTranspose3d(4, 4, 2, stride=2)(fine),
    }
    for name, call in calls.items():
        for dataflow in tl.nn.functional.Dataflow:
            if name == "target" and dataflow is not tl.nn.functional.Dataflow.GatherScatter:
                continue  # target transposes run gather-scatter only
            with tl.nn.functional.conv_config(dataflow=dataflow):
                with torch.inference_mode():
                    call()
                y = call()
            assert y.feats.requires_grad, name
            y.feats.sum().backward()
