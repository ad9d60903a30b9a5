"""CUDA-versus-CPU parity of the artifact building blocks: pool_transpose3d,
trilinear_upsample3d, global_pool, reindex_sparse, sparse_cat and sparse_binary.

They are device-agnostic torch code over the kernel maps and pooling ops, so on a GPU the
rows (and their order) must equal the CPU's exactly and float64 features must agree to
rounding; gradients likewise.  Skipped without a GPU.
"""

from __future__ import annotations

import pytest
import torch

import torch_lattice as tl
from torch_lattice.nn import functional as F

try:
    from sparse_tensor_helpers import random_sparse
except ImportError:  # tests/ may become a package; then it is imported through it
    from tests.sparse_tensor_helpers import random_sparse

pytestmark = pytest.mark.cuda
needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _same(cpu: tl.SparseTensor | torch.Tensor, gpu: tl.SparseTensor | torch.Tensor) -> None:
    if isinstance(cpu, tl.SparseTensor):
        assert torch.equal(cpu.coords, gpu.coords.cpu())
        assert cpu.stride == gpu.stride
        cpu, gpu = cpu.feats, gpu.feats
    torch.testing.assert_close(gpu.cpu(), cpu, rtol=1e-12, atol=1e-12)


def _run_both(fn, *tensors):
    """``fn`` on CPU tensors and on their CUDA copies, plus the gradients of a sum."""
    outs, grads = [], []
    for device in ("cpu", "cuda"):
        moved = [t.to(device) for t in tensors]
        leaves = [t.feats.detach().clone().requires_grad_(True) for t in moved]
        out = fn(*[t.replace(f) for t, f in zip(moved, leaves, strict=True)])
        feats = out.feats if isinstance(out, tl.SparseTensor) else out
        (
            feats * torch.arange(feats.numel(), device=device).reshape(feats.shape).double()
        ).sum().backward()
        outs.append(out)
        grads.append([f.grad for f in leaves])
    _same(outs[0], outs[1])
    for a, b in zip(grads[0], grads[1], strict=True):
        assert (a is None) == (b is None)  # a target's features get no gradient
        if a is not None:
            _same(a, b)


@needs_gpu
def test_pool_transpose_parity():
    x = random_sparse(60, 6, seed=1)
    fine = random_sparse(80, 6, seed=2, channels=1)

    def with_history(v):
        return F.pool_transpose3d(F.avg_pool3d(v, 3, 2, 1), 3, 2, 1)

    _run_both(with_history, x)
    coarse = random_sparse(30, 6, seed=3, stride=2)
    _run_both(lambda c, t: F.pool_transpose3d(c, 3, 2, 1, target=t), coarse, fine)
    _run_both(lambda c: F.pool_transpose3d(c, 2), coarse)


@needs_gpu
def test_trilinear_parity():
    coarse = random_sparse(30, 6, seed=4, stride=2, lo=1)
    fine = random_sparse(80, 6, seed=5, channels=1)
    _run_both(lambda c, t: F.trilinear_upsample3d(c, 2, target=t), coarse, fine)
    _run_both(lambda c: F.trilinear_upsample3d(c, (2, 1, 2)), coarse)


@needs_gpu
@pytest.mark.parametrize("mode", ["sum", "avg", "max"])
def test_global_pool_parity(mode):
    _run_both(lambda v: F.global_pool(v, mode, batch_size=2), random_sparse(50, 6, seed=6))


@needs_gpu
@pytest.mark.parametrize("join", ["inner", "left", "right", "outer"])
def test_join_parity(join):
    a, b = random_sparse(40, 6, seed=7, channels=2), random_sparse(40, 6, seed=8, channels=2)
    _run_both(lambda u, v: tl.sparse_cat([u, v], join=join), a, b)
    for op in ("add", "sub", "mul", "maximum", "minimum"):
        _run_both(lambda u, v, op=op: tl.sparse_binary(u, v, op, join, 0.5, -1.0), a, b)
    _run_both(lambda u, v: tl.reindex_sparse(u, v, fill=2.0), a, b)
