"""The modules' forwards run outside ``torch.compile``'s graphs: :func:`eager_forward`.

A forward reads state that dynamo cannot trace: the ``ContextVar`` of the convolution
configuration, the locks around the coordinate manager's kernel-map cache, whether a
tensor is an inference tensor, a strided layer's range read from its rows. Traced, each
such read breaks the graph, and dynamo compiles the code around every break as a frame
of its own, once per parameter shape (it keeps those static); a forward met with more
than ``torch._dynamo.config.recompile_limit`` (8) layer shapes warns and runs eagerly
from then on. Marked as not traced, a forward is one break in the caller's graph: the
results are the same, nothing warns, and the compile covers the code around the layers
(SparseResUNet42 at width 0.25 on 2 cores: 5 s instead of 15 s).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import torch

_F = TypeVar("_F", bound=Callable[..., object])


def eager_forward(forward: _F) -> _F:
    """``forward``, run eagerly when a ``torch.compile``d caller reaches it.

    ``torch._disable_dynamo`` is ``torch.compiler.disable`` that imports dynamo on the
    first call rather than here: importing dynamo takes about a second, which
    ``import torch_lattice`` should not pay for users who never compile.
    """
    return torch._disable_dynamo(forward)  # type: ignore[return-value]
