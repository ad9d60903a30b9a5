"""Threads sharing tensors and layers (issue 13, item 4 and defect 3).

- Threads that share one input tensor and one set of layers, across every dataflow, give
  bitwise the single-threaded results, forward and backward (gradients through
  ``torch.autograd.grad``, so no thread accumulates into another's ``.grad``).
- A cold shared tensor builds each generated support, generative support, kernel map and
  pair list once, however many threads reach it at the same time: the coordinate
  manager's cache and a kernel map's pair-list cache are filled under a lock.  The
  builders are wrapped with a short sleep so that, without the lock, every thread would
  miss the cache and build the entry itself.
"""

from __future__ import annotations

import collections
import os
import threading
import time

import pytest
import torch

import torch_lattice as tl
from torch_lattice.nn.functional.relation import kernel_map
from torch_lattice.ops import kmap as km

try:
    import network_helpers as nh
except ImportError:  # run as a package
    from tests import network_helpers as nh

THREADS = 6


def _in_threads(fn, n: int = THREADS):
    """Runs ``fn(i)`` in ``n`` threads released together; returns results in order."""
    barrier = threading.Barrier(n)
    results: list[object] = [None] * n
    errors: list[BaseException] = []

    def body(i: int) -> None:
        try:
            barrier.wait()
            results[i] = fn(i)
        except BaseException as e:  # reported in the main thread
            errors.append(e)

    workers = [threading.Thread(target=body, args=(i,)) for i in range(n)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    if errors:
        raise errors[0]
    return results


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("dataflow", nh.DATAFLOWS, ids=lambda d: d.name)
def test_shared_tensor_and_layers_match_single_thread(dataflow, dtype):
    net = nh.Net(dataflow).to(dtype)
    ref = nh.run(net, nh.make_input(rows=1000, dtype=dtype))
    shared = nh.make_input(rows=1000, dtype=dtype)  # cold: the threads build its maps
    results = _in_threads(lambda i: nh.run(net, shared))
    for i, r in enumerate(results):
        nh.assert_bitwise_equal(r, ref, f"thread {i}")
    # and the warm tensor once more, from threads again
    for i, r in enumerate(_in_threads(lambda i: nh.run(net, shared))):
        nh.assert_bitwise_equal(r, ref, f"warm thread {i}")


def test_threads_mixing_dataflows_on_one_tensor():
    """Threads running different dataflows share one tensor's maps."""
    nets = {d: nh.Net(d).double() for d in nh.DATAFLOWS}
    refs = {d: nh.run(n, nh.make_input(rows=800)) for d, n in nets.items()}
    shared = nh.make_input(rows=800)
    order = [nh.DATAFLOWS[i % len(nh.DATAFLOWS)] for i in range(THREADS)]
    results = _in_threads(lambda i: nh.run(nets[order[i]], shared))
    for i, r in enumerate(results):
        nh.assert_bitwise_equal(r, refs[order[i]], f"thread {i} ({order[i].name})")


class _Counter:
    """Wraps builder functions of torch_lattice.ops.kmap; counts calls per key."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, delay: float = 0.02) -> None:
        self.calls: collections.Counter[tuple] = collections.Counter()
        self._lock = threading.Lock()
        self.delay = delay
        for name, key in (
            ("build_kernel_map", lambda a, b, g: (a.data_ptr(), b.data_ptr(), g)),
            ("build_transpose_pairs", lambda a, b, g: (a.data_ptr(), b.data_ptr(), g)),
            ("generate_support", lambda c, *rest: (c.data_ptr(), repr(rest))),
            ("generative_support", lambda c, *rest: (c.data_ptr(), repr(rest))),
            ("kernel_pairs", lambda nbr: (nbr.data_ptr(), tuple(nbr.shape))),
        ):
            monkeypatch.setattr(km, name, self._wrap(name, getattr(km, name), key))

    def _wrap(self, name, fn, key):
        def wrapped(*args):
            time.sleep(self.delay)  # widen the window a missing lock would leave open
            out = fn(*args)
            with self._lock:
                self.calls[(name, key(*args))] += 1
            return out

        return wrapped

    def by_name(self) -> collections.Counter[str]:
        out: collections.Counter[str] = collections.Counter()
        for (name, _), n in self.calls.items():
            out[name] += n
        return out


@pytest.mark.parametrize("dataflow", nh.DATAFLOWS, ids=lambda d: d.name)
def test_cold_shared_tensor_builds_each_map_once(dataflow, monkeypatch):
    net = nh.Net(dataflow).double()
    counter = _Counter(monkeypatch)
    shared = nh.make_input(rows=600)
    _in_threads(lambda i: nh.run(net, shared))
    repeated = {k: n for k, n in counter.calls.items() if n != 1}
    assert not repeated, f"built more than once: {repeated}"
    names = counter.by_name()
    # every builder ran (so the test watches them all) ...
    assert names["build_kernel_map"] >= 6 and names["generate_support"] >= 3
    assert names["generative_support"] == 2
    if dataflow is not tl.nn.functional.Dataflow.ImplicitGEMM:
        assert names["kernel_pairs"] >= 1
    # ... and the manager counted the same kernel-map and transpose pair-list builds
    # (the generative transposes' pair lists, built without a kernel map on the pair
    # dataflows)
    assert shared.coordinate_manager.builds == (names["build_kernel_map"]
                                                + names["build_transpose_pairs"])
    # single-threaded on a fresh tensor: the same number of builds
    single = _Counter(monkeypatch, delay=0.0)
    nh.run(net, nh.make_input(rows=600))
    assert single.by_name() == names


def test_kernel_map_pairs_built_once_under_threads(monkeypatch):
    x = nh.make_input(rows=500)
    geometry = tl.geometry.ConvGeometry.submanifold((3, 3, 3), (1, 1, 1))
    counter = _Counter(monkeypatch)
    maps = _in_threads(lambda i: kernel_map(x.support, x.support, geometry))
    assert all(k is maps[0] for k in maps)
    pairs = _in_threads(lambda i: maps[0].pairs(i % 2 == 0))
    assert all(p is pairs[i % 2] for i, p in enumerate(pairs))
    rel = _in_threads(lambda i: maps[0].relation_pairs(True))
    assert all(p is rel[0] for p in rel)
    assert counter.by_name() == {"build_kernel_map": 1, "kernel_pairs": 2}
    assert all(n == 1 for n in counter.calls.values())


def _to_cuda(x: tl.SparseTensor) -> tl.SparseTensor:
    return tl.SparseTensor(
        x.feats.detach().float().cuda().requires_grad_(), x.coords.cuda(), stride=x.stride
    )


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("dataflow", nh.DATAFLOWS, ids=lambda d: d.name)
def test_cuda_cold_shared_tensor_builds_once(dataflow, monkeypatch):
    """CUDA: threads on one cold tensor build each map once; results match one thread
    (to fp32 rounding: the atomic dataflows order their sums by scheduling)."""
    net = nh.Net(dataflow).float().cuda()
    ref = nh.run(net, _to_cuda(nh.make_input(rows=2000)))
    counter = _Counter(monkeypatch)
    shared = _to_cuda(nh.make_input(rows=2000))
    results = _in_threads(lambda i: nh.run(net, shared))
    torch.cuda.synchronize()
    repeated = {k: n for k, n in counter.calls.items() if n != 1}
    assert not repeated, f"built more than once: {repeated}"
    for r in results:
        for a, b in zip(r[0], ref[0], strict=True):
            assert torch.equal(a, b)
        for a, b in zip(r[1] + r[2], ref[1] + ref[2], strict=True):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_threads_bitwise_in_deterministic_mode():
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    before = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
    )
    torch.use_deterministic_algorithms(True)
    try:
        net = nh.Net(nh.DATAFLOWS[0]).float().cuda()
        ref = nh.run(net, _to_cuda(nh.make_input(rows=2000)))
        shared = _to_cuda(nh.make_input(rows=2000))
        results = _in_threads(lambda i: nh.run(net, shared))
        torch.cuda.synchronize()
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])
    for i, r in enumerate(results):
        nh.assert_bitwise_equal(r, ref, f"thread {i}")
