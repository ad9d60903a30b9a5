"""Determinism (issue 13, item 6; docs/determinism.md).

CPU: every dataflow gives bitwise the same forward and backward run to run and at any
thread count (1, 2 and 3 threads here), for every layer family.

CUDA: with ``torch.use_deterministic_algorithms(True)`` the functional layer selects
implicit GEMM (no atomics in its forward or input gradient) and the weight gradient runs
the gather-scatter kernel (per-kernel-row ``torch.mm``); the CUDA kernels with float
atomics raise (or warn with ``warn_only=True``) when called directly.  The selection and
the refusal are tested here without a GPU; the GPU tests check the bits.
"""

from __future__ import annotations

import os
import warnings

import pytest
import torch

import torch_lattice as tl
from torch_lattice.nn import functional as F
from torch_lattice.nn.functional.config import CUDA_DEFAULT, resolve_config
from torch_lattice.ops import _runtime, conv_cuda, kmap_cuda

try:
    import network_helpers as nh
except ImportError:  # run as a package
    from tests import network_helpers as nh

if torch.cuda.is_available():
    # torch refuses cuBLAS GEMMs in deterministic mode without it (set before cuBLAS starts)
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.fixture
def deterministic():
    """torch.use_deterministic_algorithms(True) for one test (restored after)."""
    before = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
    )
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])


@pytest.fixture
def warn_only():
    before = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
    )
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])


# --- CPU: run to run and across thread counts ---------------------------------------


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["fp64", "fp32"])
@pytest.mark.parametrize("dataflow", nh.DATAFLOWS, ids=lambda d: d.name)
def test_cpu_bitwise_across_thread_counts_and_runs(dataflow, dtype):
    net = nh.Net(dataflow, width=16).to(dtype)
    before = torch.get_num_threads()
    results = []
    try:
        for threads in (1, 2, 3, 2):
            torch.set_num_threads(threads)
            # a fresh tensor each time: supports and maps are rebuilt at this thread count
            results.append((threads, nh.run(net, nh.make_input(rows=2000, dtype=dtype))))
    finally:
        torch.set_num_threads(before)
    for threads, r in results[1:]:
        nh.assert_bitwise_equal(r, results[0][1], f"{threads} threads vs 1")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_cpu_half_types_bitwise_across_thread_counts(dtype):
    before = torch.get_num_threads()
    runs = []
    try:
        for threads in (1, 3):
            torch.set_num_threads(threads)
            x = nh.make_input(rows=2000, dtype=dtype)
            for dataflow in nh.DATAFLOWS:
                torch.manual_seed(4)
                m = tl.nn.SubmConv3d(6, 16, 3, config=F.ConvConfig(dataflow=dataflow)).to(dtype)
                y = m(x)
                (gx, gw) = torch.autograd.grad(y.feats.float().square().sum(), [x.feats, m.weight])
                runs.append((threads, dataflow, y.feats, gx, gw))
    finally:
        torch.set_num_threads(before)
    for threads, dataflow, *tensors in runs:
        ref = next(r for r in runs if r[0] == 1 and r[1] is dataflow)
        for a, b in zip(tensors, ref[2:], strict=True):
            assert torch.equal(a, b), (threads, dataflow)


# --- CUDA selection, without a GPU -----------------------------------------------------


@pytest.mark.parametrize(
    "requested", [None, *nh.DATAFLOWS], ids=lambda d: getattr(d, "name", "unset")
)
@pytest.mark.parametrize("target_transpose", [False, True])
def test_cuda_deterministic_mode_selects_implicit_gemm(deterministic, requested, target_transpose):
    if target_transpose and requested not in (None, F.Dataflow.GatherScatter):
        pytest.skip("an explicit non-gather-scatter target transpose raises (test_config)")
    cfg = F.ConvConfig(dataflow=requested)
    for device in ("cuda", torch.device("cuda", 0)):
        got = resolve_config(cfg, target_transpose=target_transpose, device=device)
        assert got.dataflow is F.Dataflow.ImplicitGEMM
    assert F.resolved_dataflow(cfg, target_transpose=target_transpose, device="cuda") is (
        F.Dataflow.ImplicitGEMM
    )
    # the CPU keeps what was asked for: every CPU dataflow is deterministic
    cpu = resolve_config(cfg, target_transpose=target_transpose, device="cpu").dataflow
    expected = requested or (
        F.Dataflow.GatherScatter if target_transpose else F.Dataflow.ImplicitGEMM
    )
    assert cpu is expected


def test_cuda_selection_unchanged_without_deterministic_mode():
    assert not torch.are_deterministic_algorithms_enabled()
    for d in nh.DATAFLOWS:
        assert resolve_config(F.ConvConfig(dataflow=d), device="cuda").dataflow is d
    assert resolve_config(None, device="cuda").dataflow is CUDA_DEFAULT.dataflow
    assert _runtime.weight_grad_dataflow() == "implicit_gemm"


def test_weight_grad_dataflow_in_deterministic_mode(deterministic):
    assert _runtime.weight_grad_dataflow() == "gather_scatter"
    _runtime.check_deterministic("conv_weight_grad", _runtime.weight_grad_dataflow())  # no raise


ATOMIC = sorted(_runtime.ATOMIC_KERNELS)
ATOMIC_FREE = [("conv_forward", "implicit_gemm"), ("conv_weight_grad", "gather_scatter")]


def test_atomic_kernel_list_matches_the_sources():
    """Every (op, dataflow) is either known atomic or known atomic-free."""
    every = {(op, d) for op in ("conv_forward", "conv_weight_grad") for d in conv_cuda.DATAFLOWS}
    assert every == set(ATOMIC) | set(ATOMIC_FREE)
    assert not set(ATOMIC) & set(ATOMIC_FREE)


@pytest.mark.parametrize("op,dataflow", ATOMIC)
def test_atomic_kernels_raise_in_deterministic_mode(deterministic, op, dataflow):
    with pytest.raises(RuntimeError, match=rf"{op} with dataflow '{dataflow}'.*deterministic"):
        _runtime.check_deterministic(op, dataflow)


@pytest.mark.parametrize("op,dataflow", ATOMIC)
def test_atomic_kernels_warn_with_warn_only(warn_only, op, dataflow):
    with pytest.warns(UserWarning, match=rf"{op} with dataflow '{dataflow}'"):
        _runtime.check_deterministic(op, dataflow)


@pytest.mark.parametrize("op,dataflow", ATOMIC + ATOMIC_FREE)
def test_no_refusal_outside_deterministic_mode(op, dataflow):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _runtime.check_deterministic(op, dataflow)


@pytest.mark.parametrize("op,dataflow", ATOMIC_FREE)
def test_atomic_free_kernels_allowed_in_deterministic_mode(deterministic, op, dataflow):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _runtime.check_deterministic(op, dataflow)


def test_cpu_runs_unchanged_in_deterministic_mode(deterministic):
    """Deterministic mode changes nothing on the CPU (same bits as without it)."""
    for dataflow in nh.DATAFLOWS:
        net = nh.Net(dataflow).double()
        a = nh.run(net, nh.make_input(rows=600))
        torch.use_deterministic_algorithms(False)
        b = nh.run(net, nh.make_input(rows=600))
        torch.use_deterministic_algorithms(True)
        nh.assert_bitwise_equal(a, b, dataflow.name)


# --- CUDA, on a GPU ---------------------------------------------------------------------


def _cuda_run(dataflow):
    net = nh.Net(dataflow).float().cuda()
    x = nh.make_input(rows=3000, dtype=torch.float32)
    x = tl.SparseTensor(x.feats.detach().cuda().requires_grad_(), x.coords.cuda(), stride=x.stride)
    coords, feats, grads = nh.run(net, x)
    torch.cuda.synchronize()
    return [c.cpu() for c in coords], [f.cpu() for f in feats], [g.cpu() for g in grads]


@pytest.mark.cuda
@CUDA
@pytest.mark.parametrize("dataflow", nh.DATAFLOWS, ids=lambda d: d.name)
def test_cuda_deterministic_mode_bitwise_run_to_run(deterministic, dataflow):
    runs = [_cuda_run(dataflow) for _ in range(3)]
    for r in runs[1:]:
        nh.assert_bitwise_equal(r, runs[0], dataflow.name)
    # every requested dataflow ran implicit GEMM: the same bits whichever was asked for
    nh.assert_bitwise_equal(_cuda_run(F.Dataflow.ImplicitGEMM), runs[0], "vs ImplicitGEMM")
    # and it is the convolution: close to the fp64 CPU result
    torch.use_deterministic_algorithms(False)
    net = nh.Net(dataflow).double()
    ref = nh.run(net, nh.make_input(rows=3000))
    for a, b in zip(runs[0][1] + runs[0][2], ref[1] + ref[2], strict=True):
        torch.testing.assert_close(a.double(), b, rtol=1e-3, atol=1e-3)


@pytest.mark.cuda
@CUDA
@pytest.mark.parametrize("op,dataflow", ATOMIC)
def test_cuda_atomic_kernels_refused_when_called(deterministic, op, dataflow):
    g = torch.Generator().manual_seed(0)
    nbr = torch.randint(-1, 50, (40, 27), generator=g, dtype=torch.int32).cuda()
    feats = torch.randn(50, 8, generator=g).cuda()
    pairs = kmap_cuda.kernel_pairs(nbr)
    with pytest.raises(RuntimeError, match=f"dataflow '{dataflow}'"):
        if op == "conv_forward":
            w = torch.randn(27, 8, 4, generator=g).cuda()
            use_nbr = nbr if dataflow == "implicit_gemm" else None
            use_pairs = None if dataflow == "implicit_gemm" else pairs
            conv_cuda.conv_forward(dataflow, feats, w, nbr=use_nbr, pairs=use_pairs, n_out=40)
        else:
            dy = torch.randn(40, 4, generator=g).cuda()
            use_nbr = nbr if dataflow == "implicit_gemm" else None
            use_pairs = None if dataflow == "implicit_gemm" else pairs
            conv_cuda.conv_weight_grad(dataflow, feats, dy, nbr=use_nbr, pairs=use_pairs)
