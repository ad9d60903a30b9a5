"""torch.compile over the library on the CPU.

The modules' forwards run eagerly under a compiled caller (``eager_forward``,
docs/troubleshooting.md): the results equal eager ones, and a model with more layer
shapes than dynamo's recompile limit compiles without reaching it. The functions of
``tl.nn.functional`` stay traceable: dynamo traces the custom ops through their fake
kernels, whose argument checks must take the symbolic ints it makes of sizes that change
between calls (two kernel sizes in one function, ``dynamic=True``), and ``dynamic=False``
traces each size as constants."""

from __future__ import annotations

import logging
from collections.abc import Callable

import pytest
import torch

import torch_lattice as tl
import torch_lattice.nn.functional as F


def _net() -> torch.nn.Module:
    return torch.nn.Sequential(
        tl.nn.SubmConv3d(3, 4, 3),
        tl.nn.ReLU(),
        tl.nn.SubmConv3d(4, 4, 5),
        tl.nn.Conv3d(4, 5, 2, stride=2),
    )


def _input(n: int, seed: int, channels: int = 3) -> tl.SparseTensor:
    g = torch.Generator().manual_seed(seed)
    coords = torch.randint(0, 10, (n, 4), generator=g) * torch.tensor([0, 1, 1, 1])
    coords = torch.unique(coords, dim=0)
    return tl.SparseTensor(torch.randn(len(coords), channels, generator=g), coords)


@pytest.mark.parametrize("dynamic", [None, True, False], ids=["default", "dynamic", "static"])
def test_compiled_model_matches_eager(dynamic: bool | None) -> None:
    torch.manual_seed(0)
    torch._dynamo.reset()
    net = _net()
    compiled = torch.compile(net, backend="aot_eager", dynamic=dynamic)
    for n, seed in ((200, 1), (260, 2)):  # a second size: dynamo recompiles or generalises
        got = compiled(_input(n, seed))
        (got_grad,) = torch.autograd.grad(got.feats.square().sum(), net[0].weight)
        want = net(_input(n, seed))
        (want_grad,) = torch.autograd.grad(want.feats.square().sum(), net[0].weight)
        assert torch.equal(got.coords, want.coords)
        torch.testing.assert_close(got.feats, want.feats, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(got_grad, want_grad, rtol=1e-5, atol=1e-6)


def _recording_backend() -> tuple[list[torch.fx.GraphModule], Callable[..., object]]:
    """A fresh dynamo and a backend that keeps every graph it compiles (run as traced)."""
    torch.manual_seed(0)
    torch._dynamo.reset()
    graphs: list[torch.fx.GraphModule] = []

    def backend(gm: torch.fx.GraphModule, example_inputs: object) -> object:
        graphs.append(gm)
        return gm.forward

    return graphs, backend


def _targets(graphs: list[torch.fx.GraphModule]) -> list[str]:
    return [str(node.target) for gm in graphs for node in gm.graph.nodes]


class _Dense(torch.nn.Module):
    """A dense head after the sparse layers: the code a compile still covers."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(
            *(
                layer
                for c in range(channels, channels + 10)  # 10 shapes > recompile_limit (8)
                for layer in (tl.nn.SubmConv3d(c, c + 1, 3), tl.nn.BatchNormReLU(c + 1))
            )
        )
        self.head = torch.nn.Linear(channels + 10, 2)

    def forward(self, x: tl.SparseTensor) -> torch.Tensor:
        return self.head(self.body(x).feats).tanh()


def test_layer_shapes_past_the_recompile_limit(caplog: pytest.LogCaptureFixture) -> None:
    # Traced, every forward's graph breaks were compiled once per weight shape, and the
    # ninth shape of SubmConv3d.forward logged "hit config.recompile_limit (8)".
    graphs, backend = _recording_backend()

    net = _Dense(3)
    compiled = torch.compile(net, backend=backend)
    with caplog.at_level(logging.WARNING, logger="torch._dynamo"):
        got = compiled(_input(200, 1))
        want = net(_input(200, 1))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    assert not [r for r in caplog.records if "recompile_limit" in r.getMessage()]
    # the head is compiled, the layers are not traced (no lattice op in any graph)
    targets = _targets(graphs)
    assert any("tanh" in t for t in targets), targets
    assert not any("lattice" in t for t in targets), targets


def test_functional_ops_traced_with_symbolic_sizes() -> None:
    # Under dynamic=True the kernel sizes 3 and 5 reach the ops' fake kernels as
    # symbolic ints, which their checks must accept.
    graphs, backend = _recording_backend()

    w3, w5 = torch.randn(27, 3, 4), torch.randn(125, 4, 4)

    def f(x: tl.SparseTensor) -> torch.Tensor:
        y = F.subm_conv3d(x, w3, kernel_size=3)
        return F.subm_conv3d(y, w5, kernel_size=5).feats

    compiled = torch.compile(f, backend=backend, dynamic=True)
    for n, seed in ((200, 1), (260, 2)):
        torch.testing.assert_close(compiled(_input(n, seed)), f(_input(n, seed)))
    targets = _targets(graphs)
    assert any("lattice.sparse_conv" in t for t in targets), targets


def test_fullgraph_is_refused_as_the_docs_say() -> None:
    # docs/troubleshooting.md: a module's forward is not traced and a functional call
    # breaks the graph, so fullgraph=True stops in dynamo, for either.
    from torch._dynamo.exc import Unsupported

    torch._dynamo.reset()
    layer = tl.nn.SubmConv3d(3, 4, 3)
    with pytest.raises(Unsupported, match="marked as skipped"):
        torch.compile(layer, fullgraph=True, backend="eager")(_input(50, 1))
    w = torch.randn(27, 3, 4)
    with pytest.raises(Unsupported, match="ContextVar"):
        torch.compile(lambda x: F.subm_conv3d(x, w, kernel_size=3).feats, fullgraph=True,
                      backend="eager")(_input(50, 2))  # fmt: skip
