"""Dataflow equivalence: every op family x every dataflow x every device
gives the same support, outputs and gradients.

fp64 on the CPU must agree to 1e-12 relative (forward and every gradient).
Each dataflow is deterministic: the same inputs give bitwise the same result
for any thread count.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

import torch_lattice as tl
from torch_lattice.nn import functional as F

DATAFLOWS = list(F.Dataflow)
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
Family = Callable[[tl.SparseTensor, F.ConvConfig], tuple[tl.SparseTensor, list[torch.nn.Module]]]


# The GPU has no fp64 kernels: CUDA runs fp32 and is held to fp32 tolerances.
DTYPE = {"cpu": torch.float64, "cuda": torch.float32}
TOL = {"cpu": 1e-12, "cuda": 1e-4}


def _input(device: str, seed: int = 0, stride: int = 1) -> tl.SparseTensor:
    g = torch.Generator().manual_seed(seed)
    c = torch.randint(0, 10, (500, 4), generator=g)
    c[:, 0] %= 2
    c = torch.unique(c, dim=0)
    c = c[torch.randperm(c.shape[0], generator=g)]
    f = torch.randn(c.shape[0], 5, generator=g, dtype=torch.float64).to(DTYPE[device])
    return tl.SparseTensor(f.to(device).requires_grad_(), c.to(device), stride=stride)


def _mod(cls: type[torch.nn.Module], *args: object, **kw: object) -> torch.nn.Module:
    torch.manual_seed(1)
    return cls(*args, bias=True, **kw).double()


def subm(x: tl.SparseTensor, cfg: F.ConvConfig):
    m = _mod(tl.nn.SubmConv3d, 5, 4, (3, 1, 5), config=cfg).to(x.device, x.dtype)
    return m(x), [m]


def generated(x: tl.SparseTensor, cfg: F.ConvConfig):
    m = _mod(tl.nn.Conv3d, 5, 4, 3, stride=2, padding=1, config=cfg).to(x.device, x.dtype)
    return m(x), [m]


def target(x: tl.SparseTensor, cfg: F.ConvConfig):
    tgt = torch.tensor([[0, 1, 2, 3], [1, 0, 0, 0], [0, 4, 4, 4], [1, 2, 1, 3]], device=x.device)
    m = _mod(tl.nn.Conv3d, 5, 4, 3, stride=2, padding=1, config=cfg).to(x.device, x.dtype)
    return m(x, coordinates=tgt), [m]


def inverse_transpose(x: tl.SparseTensor, cfg: F.ConvConfig):
    down = _mod(tl.nn.Conv3d, 5, 6, 2, stride=2).to(x.device, x.dtype)
    up = _mod(tl.nn.ConvTranspose3d, 6, 4, 2, stride=2, config=cfg).to(x.device, x.dtype)
    return up(down(x)), [down, up]


def target_transpose(x: tl.SparseTensor, cfg: F.ConvConfig):
    up = _mod(tl.nn.ConvTranspose3d, 5, 4, 3, stride=2, padding=1, dilation=1).to(x.device, x.dtype)
    return up(x, x.coords[:, :] * torch.tensor([1, 2, 2, 2], device=x.device)), [up]


def generative(x: tl.SparseTensor, cfg: F.ConvConfig):
    m = _mod(tl.nn.GenerativeConvTranspose3d, 5, 4, (2, 3, 2), stride=(2, 1, 2), config=cfg)
    return m.to(x.device, x.dtype)(x), [m]


def normalized(x: tl.SparseTensor, cfg: F.ConvConfig):
    m = _mod(tl.nn.NormalizedSubmConv3d, 5, 4, 3, config=cfg).to(x.device, x.dtype)
    g = _mod(tl.nn.NormalizedGenerativeConvTranspose3d, 4, 3, 2, stride=2, config=cfg)
    return g.to(x.device, x.dtype)(m(x)), [m, g]


FAMILIES = [subm, generated, target, inverse_transpose, target_transpose, generative, normalized]
INPUT_STRIDE = {target_transpose: 2, generative: 2, normalized: 2}


def _run(family: Family, dataflow: F.Dataflow, device: str):
    x = _input(device, stride=INPUT_STRIDE.get(family, 1))
    with F.conv_config(dataflow=dataflow if family is not target_transpose else None):
        y, mods = family(x, F.ConvConfig())
    g = torch.randn(y.feats.shape, generator=torch.Generator().manual_seed(2), dtype=y.dtype)
    params = [p for m in mods for p in m.parameters()]
    grads = torch.autograd.grad((y.feats * g.to(device)).sum(), [x.feats, *params])
    return y, grads


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.__name__)
def test_dataflows_agree(family: Family, device: str) -> None:
    ref_y, ref_grads = _run(family, F.Dataflow.ImplicitGEMM, "cpu")
    assert ref_y.feats.abs().sum() > 0
    for dataflow in DATAFLOWS:
        y, grads = _run(family, dataflow, device)
        tol = TOL[device]
        assert torch.equal(y.coords.cpu(), ref_y.coords)
        torch.testing.assert_close(y.feats.cpu().double(), ref_y.feats, rtol=tol, atol=tol)
        for a, b in zip(grads, ref_grads, strict=True):
            torch.testing.assert_close(a.cpu().double(), b, rtol=tol, atol=tol)


def test_dataflows_deterministic_across_thread_counts() -> None:
    before = torch.get_num_threads()
    results = []
    try:
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            for dataflow in DATAFLOWS:
                y, grads = _run(generated, dataflow, "cpu")
                results.append((dataflow, y.feats, grads))
    finally:
        torch.set_num_threads(before)
    for dataflow in DATAFLOWS:
        runs = [r for r in results if r[0] is dataflow]
        for _, y, grads in runs[1:]:
            assert torch.equal(y, runs[0][1])
            assert all(torch.equal(a, b) for a, b in zip(grads, runs[0][2], strict=True))


def test_half_types_accumulate_in_fp32() -> None:
    x = _input("cpu")
    m = _mod(tl.nn.SubmConv3d, 5, 4, 3)
    ref = m(x).feats
    for dtype in (torch.float16, torch.bfloat16):
        mh = _mod(tl.nn.SubmConv3d, 5, 4, 3).to(dtype)
        for dataflow in DATAFLOWS:
            with F.conv_config(dataflow=dataflow):
                y = mh(x.detach().to(dtype)).feats
            assert y.dtype == dtype
            tol = 2e-2 if dtype is torch.bfloat16 else 3e-3
            torch.testing.assert_close(y.double(), ref.detach(), rtol=tol, atol=tol)



@pytest.mark.parametrize("family", [subm, generated, inverse_transpose], ids=lambda f: f.__name__)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_cpu_fetch_on_demand_is_implicit_gemm_bitwise(family: Family, dtype: torch.dtype) -> None:
    """On the CPU fetch-on-demand runs implicit GEMM's tiles and weight-gradient blocks
    over the pair lists (tl_implicit_gemm_forward_pairs, _weight_grad_pairs), in the same
    order: the outputs, input gradients (a forward over the reversed pairs) and weight
    gradients are bitwise implicit GEMM's, at any thread count."""
    before = torch.get_num_threads()
    try:
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            out = []
            for dataflow in (F.Dataflow.ImplicitGEMM, F.Dataflow.FetchOnDemand):
                x = _input("cpu", seed=threads)
                x = tl.SparseTensor(x.feats.detach().to(dtype).requires_grad_(), x.coords)
                with F.conv_config(dataflow=dataflow):
                    y, mods = family(x, F.ConvConfig())
                    dy = torch.randn(y.feats.shape, generator=torch.Generator().manual_seed(3))
                    weights = [m.weight for m in mods]
                    grads = torch.autograd.grad(y.feats, [x.feats, *weights], dy.to(dtype))
                out.append((y.feats, *grads))
            assert out[0][0].dtype == dtype and all(t.abs().sum() > 0 for t in out[0])
            for ig, fod in zip(out[0], out[1], strict=True):
                assert torch.equal(ig, fod)
    finally:
        torch.set_num_threads(before)


def test_cpu_pair_backward_reuses_the_reversed_lists(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CPU's reversed pair lists (an argsort of the forward ones) are built once per
    relation and kept with it, not in every backward (the op's own fallback, which sorts
    per call, is never reached); a forward without a gradient builds none."""
    import torch_lattice.ops.conv as conv_ops
    import torch_lattice.ops.kmap as kmap_ops

    calls: dict[str, int] = {"cached": 0, "per_backward": 0}

    def counting(kind: str, original: Callable[..., kmap_ops.PairLists]):
        def reverse(*lists: torch.Tensor) -> kmap_ops.PairLists:
            calls[kind] += 1
            return original(*lists)

        return reverse

    monkeypatch.setattr(kmap_ops, "reverse_pairs", counting("cached", kmap_ops.reverse_pairs))
    monkeypatch.setattr(conv_ops, "reverse_pairs", counting("per_backward", conv_ops.reverse_pairs))
    # subm runs a kernel map's pair lists; generative the pair lists of the support it
    # generates (cached with that support, and built by a reversal themselves).
    for family in (subm, generative):
        for dataflow in (F.Dataflow.FetchOnDemand, F.Dataflow.GatherScatter):
            calls.update(cached=0, per_backward=0)
            x = _input("cpu", stride=INPUT_STRIDE.get(family, 1))
            with F.conv_config(dataflow=dataflow), torch.no_grad():
                family(x, F.ConvConfig())
            built = calls["cached"]
            assert built == (0 if family is subm else 1), (family.__name__, dataflow, built)
            counts = []
            for _ in range(3):
                with F.conv_config(dataflow=dataflow):
                    family(x, F.ConvConfig())[0].feats.sum().backward()
                counts.append(dict(calls))
            # subm's reversed lists come from the map's other table; generative's are
            # its own lists reversed, once.
            extra = 0 if family is subm else 1
            assert counts[0]["cached"] == built + extra, (family.__name__, dataflow, counts)
            assert counts[-1] == counts[0] and calls["per_backward"] == 0, (family, counts)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("channels", [(16, 16), (24, 40), (64, 64), (100, 36)])
def test_cpu_gather_scatter_forward_is_fetch_on_demand_bitwise(
    channels: tuple[int, int], dtype: torch.dtype
) -> None:
    """The CPU's gather-scatter reads each block's rows in place and asks for the next
    rows ahead (csrc/core/tl_dataflow_pairs_impl.h): its forward adds each pair's sum to
    its output row kernel row by kernel row, as fetch-on-demand's tiles do, so the two
    outputs are bitwise equal, at any thread count, over kernel rows of hundreds of pairs
    (blocks of 128 and a partial last one) and widths that leave partial vectors; its
    weight gradient matches a float64 reference and is bitwise the same at 1 and 2
    threads."""
    from torch_lattice.ops.conv import pair_conv, pair_conv_weight_grad
    from torch_lattice.ops.kmap import kernel_pairs

    g = torch.Generator().manual_seed(sum(channels))
    coords = torch.randint(0, 16, (3000, 4), generator=g, dtype=torch.int32)
    coords = torch.unique(coords * torch.tensor([0, 1, 1, 1], dtype=torch.int32), dim=0)
    one = [1, 1, 1]
    nbr, _ = torch.ops.lattice.kernel_map(coords, coords, [3, 3, 3], one, one, one)
    offsets, pin, pout = kernel_pairs(nbr)
    sizes = offsets.diff()
    assert int(sizes.max()) > 300 and bool((sizes % 128 != 0).any())
    cin, cout = channels
    feats = torch.randn(coords.shape[0], cin, generator=g, dtype=torch.float64).to(dtype)
    weight = torch.randn(27, cin, cout, generator=g, dtype=torch.float64).to(dtype)
    dy = torch.randn(coords.shape[0], cout, generator=g, dtype=torch.float64).to(dtype)
    n = coords.shape[0]
    ref_dw = torch.zeros(27, cin, cout, dtype=torch.float64)
    for k in range(27):
        a, b = int(offsets[k]), int(offsets[k + 1])
        ref_dw[k] = feats[pin[a:b].long()].double().T @ dy[pout[a:b].long()].double()
    before = torch.get_num_threads()
    try:
        dws = []
        for threads in (1, 2):
            torch.set_num_threads(threads)
            ys = [pair_conv(feats, weight, offsets, pin, pout, None, None, None, n, gather)
                  for gather in (True, False)]
            assert ys[0].abs().sum() > 0 and torch.equal(ys[0], ys[1])
            dws.append(pair_conv_weight_grad(feats, dy, offsets, pin, pout, True))
    finally:
        torch.set_num_threads(before)
    assert torch.equal(dws[0], dws[1])
    tol = 1e-5 if dtype is torch.float32 else 1e-12
    torch.testing.assert_close(dws[0].double(), ref_dw, rtol=tol, atol=tol * ref_dw.abs().max())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("c_out", [4, 40])
def test_zero_input_channels_give_zeros(dtype: torch.dtype, c_out: int) -> None:
    """No input channels: every output is zero (``x @ w`` over an empty inner dimension),
    on every dataflow, on the first call and over the kept maps and lists after it, through
    a submanifold layer (whose centre rows are written first, never zeroed) and a pointwise
    one; the input gradient of a layer with no output channels likewise."""
    coords = torch.tensor([[0, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0], [0, 5, 5, 5]])
    x = tl.SparseTensor(torch.randn(4, 0, dtype=dtype), coords)
    for dataflow in (F.Dataflow.ImplicitGEMM, F.Dataflow.FetchOnDemand,
                     F.Dataflow.GatherScatter):
        with F.conv_config(dataflow=dataflow):
            for _ in range(3):
                for k in (27, 1):
                    w = torch.randn(k, 0, c_out, dtype=dtype)
                    y = F.subm_conv3d(x, w) if k == 27 else F.conv3d(x, w, kernel_size=1)
                    assert torch.equal(y.feats, torch.zeros(4, c_out, dtype=dtype))
            feats = torch.randn(4, c_out, dtype=dtype, requires_grad=True)
            w = torch.randn(27, c_out, 0, dtype=dtype, requires_grad=True)
            y = F.subm_conv3d(x.replace(feats=feats), w)
            (grad,) = torch.autograd.grad(y.feats.sum(), feats)
            assert torch.equal(grad, torch.zeros_like(feats))
