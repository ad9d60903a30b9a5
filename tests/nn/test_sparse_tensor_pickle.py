"""A SparseTensor pickles, copies and crosses DataLoader workers like a torch.Tensor.

What travels: features (as torch pickles them), coordinates, stride and spatial range.
What does not: the coordinate manager's caches (kernel maps, generated supports, the
derivations a no-target transpose reads), its lock and weak tables; a copy gets a new,
empty manager, shared by the tensors of one pickle that shared one, and the rows are
checked again on loading.
"""

from __future__ import annotations

import copy
import io
import pickle
from multiprocessing.reduction import ForkingPickler

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

import torch_lattice as tl
from torch_lattice import tensor as tensor_module

COORDS = torch.tensor([[0, 0, 0, 0], [0, 1, 0, 0], [0, 1, 1, 1], [1, 2, 2, 2]],
                      dtype=torch.int32)


def _tensor(requires_grad: bool = False) -> tl.SparseTensor:
    feats = torch.randn(4, 3, dtype=torch.float64, requires_grad=requires_grad)
    return tl.SparseTensor(feats, COORDS, stride=2, spatial_range=(2, 4, 5, 6))


def _torch_round_trip(obj: object, **load: object) -> object:
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return torch.load(buf, **load)  # the default: weights_only=True


def _assert_same_public(a: tl.SparseTensor, b: tl.SparseTensor) -> None:
    assert type(b) is type(a)
    assert torch.equal(a.feats.detach(), b.feats.detach()) and b.dtype == a.dtype
    assert b.feats.requires_grad == a.feats.requires_grad
    assert torch.equal(a.coords, b.coords) and b.coords.dtype == torch.int32
    assert b.stride == a.stride and b.spatial_range == a.spatial_range
    assert b.coordinate_manager is not a.coordinate_manager


ROUND_TRIPS = {
    "torch_save_load": _torch_round_trip,
    "pickle": lambda obj: pickle.loads(pickle.dumps(obj)),
    "pickle_protocol_2": lambda obj: pickle.loads(pickle.dumps(obj, protocol=2)),
    "deepcopy": copy.deepcopy,
}


@pytest.mark.parametrize("how", ROUND_TRIPS)
@pytest.mark.parametrize("requires_grad", [False, True])
def test_round_trip_keeps_the_public_state(how: str, requires_grad: bool) -> None:
    x = _tensor(requires_grad)
    y = ROUND_TRIPS[how](x)
    _assert_same_public(x, y)
    assert y.feats.is_leaf and y.coordinate_manager.cache_sizes()["kernel_maps"] == 0


@pytest.mark.parametrize("how", ROUND_TRIPS)
def test_a_copy_computes_what_the_original_does(how: str) -> None:
    x = _tensor()
    conv = tl.nn.SubmConv3d(3, 2).double()
    want = conv(x).feats
    before = x.coordinate_manager.cache_sizes()
    y = ROUND_TRIPS[how](x)
    torch.testing.assert_close(conv(y).feats, want, rtol=0, atol=0)
    # The copy built its own map; the original's caches are untouched.
    assert y.coordinate_manager.cache_sizes()["kernel_maps"] == 1
    assert x.coordinate_manager.cache_sizes() == before


def test_deepcopy_shares_no_memory_or_cache_with_the_original() -> None:
    x = _tensor()
    tl.nn.SubmConv3d(3, 2).double()(x)
    y = copy.deepcopy(x)
    assert y.support is not x.support
    assert y.feats.data_ptr() != x.feats.data_ptr()
    assert y.coords.data_ptr() != x.coords.data_ptr()
    assert y.coordinate_manager._lock is not x.coordinate_manager._lock
    y.feats.zero_()
    assert x.feats.abs().sum() > 0


def test_deepcopy_follows_torch_for_gradients() -> None:
    leaf = _tensor(requires_grad=True)
    leaf.feats.grad = torch.ones_like(leaf.feats)
    y = copy.deepcopy(leaf)
    assert y.feats.requires_grad and torch.equal(y.feats.grad, leaf.feats.grad)
    non_leaf = leaf.replace(leaf.feats * 2)
    with pytest.raises(RuntimeError, match="graph leaves"):
        copy.deepcopy(non_leaf.feats)  # torch's own rule ...
    with pytest.raises(RuntimeError, match="graph leaves"):
        copy.deepcopy(non_leaf)  # ... holds for the SparseTensor
    # Pickling keeps requires_grad and drops the graph, as torch.save does for a tensor.
    loaded = _torch_round_trip(non_leaf)
    assert loaded.feats.requires_grad and loaded.feats.is_leaf


def test_shallow_copy_shares_the_support() -> None:
    x = _tensor()
    y = copy.copy(x)
    assert y is not x and y.support is x.support and y.feats is x.feats


@pytest.mark.parametrize("how", ROUND_TRIPS)
def test_tensors_sharing_a_support_still_share_one(how: str) -> None:
    x = _tensor()
    with torch.no_grad():  # leaves: a non-leaf's deepcopy raises (torch's rule)
        relu = tl.nn.ReLU()(x)
        down = tl.nn.Conv3d(3, 3, kernel_size=2, stride=2).double()(x)
    a, b, c = ROUND_TRIPS[how]([x, relu, down])
    assert b.support is a.support
    assert c.coordinate_manager is a.coordinate_manager  # one new manager for the pickle
    assert a.coordinate_manager is not x.coordinate_manager
    assert torch.equal(c.coords, down.coords) and c.stride == (4, 4, 4)


def test_a_copy_carries_no_history_for_transposes() -> None:
    x = _tensor()
    down = tl.nn.Conv3d(3, 3, kernel_size=2, stride=2).double()
    up = tl.nn.ConvTranspose3d(3, 3, kernel_size=2, stride=2).double()
    y = down(x).detach()
    assert torch.equal(up(y).coords, x.coords)
    y2 = copy.deepcopy(y)
    with pytest.raises(ValueError, match="target"):
        up(y2)
    assert torch.equal(up(y2, x).coords, x.coords)  # with the target given it works


def test_empty_and_default_tensors_round_trip() -> None:
    empty = tl.SparseTensor(torch.zeros(0, 2), torch.zeros(0, 4, dtype=torch.int64))
    plain = tl.SparseTensor(torch.randn(2, 1), COORDS[:2].long())
    for x in (empty, plain):
        for how in ROUND_TRIPS.values():
            y = how(x)
            _assert_same_public(x, y)
            assert y.spatial_range is None and y.stride == (1, 1, 1)


class _Sub(tl.SparseTensor):
    __slots__ = ()


def test_a_subclass_keeps_its_class() -> None:
    x = _Sub.from_support(torch.randn(4, 1), _tensor().support)
    assert type(pickle.loads(pickle.dumps(x))) is _Sub
    assert type(copy.deepcopy(x)) is _Sub


def test_a_subclass_goes_to_other_processes_as_the_class_does() -> None:
    # ForkingPickler dispatches on the exact type: a subclass needs its own entry, or a
    # sample autograd cannot send would fail in a worker's queue thread (a hung loader).
    w = torch.randn(4, 1, requires_grad=True)
    x = _Sub.from_support(w * 2, _tensor().support)
    sent = ForkingPickler.dumps(x)
    with pytest.raises(RuntimeError, match=r"non-leaf.*detach"):
        pickle.loads(sent)
    leaf = _Sub.from_support(w.detach() * 2, _tensor().support)
    y = pickle.loads(ForkingPickler.dumps(leaf))
    assert type(y) is _Sub and torch.equal(y.feats, leaf.feats)


class _Forged:
    """Pickles as a SparseTensor with the given fields (a tampered or foreign file)."""

    def __init__(self, feats: object, coords: object, srange: object = None,
                 stride: object = 1) -> None:
        self.fields = (feats, coords, srange, stride)

    def __reduce__(self) -> tuple[object, ...]:
        feats, coords, srange, stride = self.fields
        support = _ForgedSupport(coords, srange, stride)
        return (tensor_module._rebuild_sparse_tensor, (feats, support))


class _ForgedSupport:
    def __init__(self, coords: object, srange: object, stride: object) -> None:
        self.fields = (coords, stride, srange)

    def __reduce__(self) -> tuple[object, ...]:
        return (tensor_module._rebuild_support,
                (*self.fields, tensor_module._new_manager(), True))


@pytest.mark.parametrize(("forged", "error", "match"), [
    (_Forged(torch.randn(2, 1), torch.tensor([[0, 1, 1, 1], [0, 1, 1, 1]])), ValueError,
     "rows must be unique"),
    (_Forged(torch.randn(1, 1), torch.tensor([[0, -1, 0, 0]])), ValueError, "non-negative"),
    (_Forged(torch.randn(1, 1), torch.tensor([[0, 5, 0, 0]]), (1, 2, 2, 2)), ValueError,
     "inside spatial_range"),
    (_Forged(torch.randn(3, 1), COORDS[:2]), ValueError, "one row per coordinate"),
    (_Forged(torch.ones(2, 1, dtype=torch.int64), COORDS[:2]), TypeError, "floating"),
    (_Forged(torch.randn(2, 1), COORDS[:2].float()), TypeError, "integer"),
    (_Forged(torch.randn(2, 1), COORDS[:2], stride=0), ValueError, "stride must be positive"),
    (_Forged(torch.randn(2, 1), COORDS[:2], srange=(1, 0, 2, 2)), ValueError,
     "spatial_range must hold positive ints"),
    # one stored value, 10^10 of them claimed: refused by its size, never listed
    (_Forged(torch.randn(2, 1), COORDS[:2], srange=torch.ones(1).expand(10**10)), ValueError,
     r"got a tensor of shape \(10000000000,\)"),
])
def test_loading_checks_the_rows_as_the_constructor_does(
    forged: _Forged, error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        _torch_round_trip(forged)
    with pytest.raises(error, match=match):
        pickle.loads(pickle.dumps(forged))


def test_weights_only_load_refuses_other_classes() -> None:
    buf = io.BytesIO()
    torch.save(_Forged(torch.randn(2, 1), COORDS[:2]), buf)
    buf.seek(0)
    assert isinstance(torch.load(buf), tl.SparseTensor)  # only allowlisted rebuilds run
    buf = io.BytesIO()
    torch.save(_Sub.from_support(torch.randn(4, 1), _tensor().support), buf)
    buf.seek(0)
    with pytest.raises(pickle.UnpicklingError, match="_Sub"):
        torch.load(buf)


# ---- DataLoader workers ----


class _Scans(Dataset):
    def __init__(self, grad: bool = False) -> None:
        self.grad = grad

    def __len__(self) -> int:
        return 3

    def __getitem__(self, i: int) -> tl.SparseTensor:
        g = torch.Generator().manual_seed(i)
        feats = torch.randn(4, 2, generator=g, requires_grad=self.grad)
        coords = COORDS.clone()
        coords[:, 3] += i
        x = tl.SparseTensor(feats * 2 if self.grad else feats, coords, spatial_range=8)
        tl.nn.SubmConv3d(2, 2)(x)  # a sample with a filled cache (kernel maps, lock)
        return x


def _collate(batch: list[tl.SparseTensor]) -> tl.SparseTensor:
    coords = torch.cat([torch.cat([torch.full((len(x), 1), i), x.coords[:, 1:]], dim=1)
                        for i, x in enumerate(batch)])
    return tl.SparseTensor(torch.cat([x.feats for x in batch]), coords, stride=2)


# timeout: a regression fails here instead of hanging the run.
@pytest.mark.parametrize("workers", [1, 2])
def test_dataloader_workers_send_sparse_tensors(workers: int) -> None:
    ds = _Scans()
    got = list(DataLoader(ds, batch_size=None, num_workers=workers, timeout=60))
    assert len(got) == len(ds)
    for i, y in enumerate(got):
        _assert_same_public(ds[i], y)
    batched = list(DataLoader(ds, batch_size=2, num_workers=workers, collate_fn=_collate,
                              timeout=60))
    want = _collate([ds[0], ds[1]])
    _assert_same_public(want, batched[0])
    assert len(batched[1]) == len(ds[2])
    conv = tl.nn.SubmConv3d(2, 2)
    torch.testing.assert_close(conv(batched[0]).feats, conv(want).feats, rtol=0, atol=0)


def test_dataloader_raises_for_a_sample_autograd_cannot_send() -> None:
    # torch refuses to send a non-leaf that requires grad; the refusal must reach the
    # caller, not be dropped in the worker's queue thread (which would hang the loader).
    loader = DataLoader(_Scans(grad=True), batch_size=None, num_workers=1, timeout=60)
    with pytest.raises(RuntimeError, match=r"non-leaf.*detach"):
        next(iter(loader))


def test_rows_sent_to_another_process_are_owned_there() -> None:
    # Sent tensors live in shared memory (the sender's too); the receiving support keeps
    # its own copy, so no edit on the sender's side can reach its cached maps.
    from multiprocessing.reduction import ForkingPickler

    x = _tensor()
    y = ForkingPickler.loads(ForkingPickler.dumps(x))
    _assert_same_public(x, y)
    assert x.coords.is_shared() and not y.coords.is_shared()


def test_the_checkpoint_converter_takes_no_sparse_tensor_for_weights(tmp_path) -> None:
    # Allowing SparseTensor for weights_only loads must not let one pass as a weight.
    from torch_lattice import migration
    from torch_lattice.migration.loading import read_legacy_checkpoint

    x, w = _tensor(), torch.randn(3, 3)
    torch.save({"conv.weight": w, "x": x}, tmp_path / "bare.pt")
    with pytest.raises(migration.ConversionError, match="not tensors"):
        read_legacy_checkpoint(tmp_path / "bare.pt")
    torch.save({"state_dict": {"conv.weight": w}, "x": x}, tmp_path / "wrapped.pt")
    ckpt = read_legacy_checkpoint(tmp_path / "wrapped.pt")
    assert list(ckpt.state_dict) == ["conv.weight"] and ckpt.ignored_keys == ("x",)
