"""One SparseResUNet42 call on a scan: the suite's network workload, and each process of
:mod:`benchmarks.memory_reuse`, which may run another checkout's library.

This file imports nothing but torch (the caller passes the network class and the features),
so a process can load it beside any checkout's ``torch_lattice``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


def resunet_step(
    cls: Any, sparse_tensor: Any, coords: torch.Tensor, feats: torch.Tensor, grad: bool,
    dtype: torch.dtype, before_backward: Callable[[], object] | None = None,
) -> Callable[[], object]:  # fmt: skip
    """One call of ``cls(C, 20)`` (SparseResUNet42, C = the features' width) in ``dtype``
    on a new scan (every map built in the call): eval forward, or forward + backward of a
    float32 squared-mean loss, which it returns, calling ``before_backward`` (if given)
    between the two. ``sparse_tensor`` is the library's ``SparseTensor``."""
    torch.manual_seed(0)
    net = cls(feats.shape[1], 20).to(dtype).train(grad)
    feats = feats.to(dtype)

    def fresh() -> Any:
        return sparse_tensor(feats, coords)

    if grad:

        def step() -> torch.Tensor:
            loss = net(fresh()).feats.float().square().mean()
            if before_backward is not None:
                before_backward()
            loss.backward()
            return loss

        return step
    return torch.no_grad()(lambda: net(fresh()))
