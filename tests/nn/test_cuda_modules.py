"""Modules and networks on CUDA against the CPU in float64 (skipped without a GPU).

Each case builds the same module twice: a float64 copy on the CPU (the reference) and a
copy on the GPU in the storage dtype under test, fed the same inputs rounded to that dtype.
Outputs, input gradients and weight gradients must agree within, relative to the largest
reference value:

- float32: ``1e-4`` (fp32 accumulation, different summation order);
- TF32 (``ConvConfig(allow_tf32=True)``): ``1e-2`` (10-bit mantissa products);
- float16: ``5e-3`` and bfloat16: ``3e-2`` (fp32 accumulation; one rounding of each result
  to the storage type, plus the rounding of the intermediate gradient the backward reads).

Every dataflow runs forward and both gradients, so the pair dataflows' input gradient goes
through the reversed pair lists (``rev``). SparseResUNet42's gradients are compared with its
ReLUs replaced by SiLU (``cuda_helpers.smooth_activations`` says why).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import nn

import torch_lattice as tl
from torch_lattice.nn.functional import ConvConfig, Dataflow

try:
    from cuda_helpers import random_coords as _coords
    from cuda_helpers import smooth_activations
except ImportError:  # tests/ may become a package; then it is imported through it
    from tests.cuda_helpers import random_coords as _coords
    from tests.cuda_helpers import smooth_activations

pytestmark = pytest.mark.cuda
needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

F64 = torch.float64
PRECISIONS = {
    "fp32": (torch.float32, False, 1e-4),
    "tf32": (torch.float32, True, 1e-2),
    "fp16": (torch.float16, False, 5e-3),
    "bf16": (torch.bfloat16, False, 3e-2),
}
DATAFLOWS = [Dataflow.ImplicitGEMM, Dataflow.FetchOnDemand, Dataflow.GatherScatter]


class DownUp(nn.Module):
    """Strided Conv3d, then a transpose (plain or generative) back up."""

    def __init__(self, cin: int, cout: int, generative: bool, config: ConvConfig) -> None:
        super().__init__()
        self.down = tl.nn.Conv3d(cin, cout, kernel_size=2, stride=2, bias=True, config=config)
        up = tl.nn.GenerativeConvTranspose3d if generative else tl.nn.ConvTranspose3d
        self.up = up(cout, cin, kernel_size=2, stride=2, config=config)

    def forward(self, x: tl.SparseTensor) -> tl.SparseTensor:
        return self.up(self.down(x))


FAMILIES: dict[str, Callable[[int, int, ConvConfig], nn.Module]] = {
    "SubmConv3d": lambda i, o, c: tl.nn.SubmConv3d(i, o, kernel_size=3, bias=True, config=c),
    "Conv3d-s2": lambda i, o, c: tl.nn.Conv3d(i, o, kernel_size=3, stride=2, padding=1, config=c),
    "ConvTranspose3d": lambda i, o, c: DownUp(i, o, False, c),
    "GenerativeConvTranspose3d": lambda i, o, c: DownUp(i, o, True, c),
    "NormalizedSubmConv3d": lambda i, o, c: tl.nn.NormalizedSubmConv3d(
        i, o, kernel_size=3, config=c
    ),
}


def _scale(t: torch.Tensor) -> float:
    return max(t.abs().max().item(), 1e-6) if t.numel() else 1.0


def _close(actual: torch.Tensor, expected: torch.Tensor, tol: float, what: str) -> None:
    expected = expected.detach().cpu().to(F64)
    actual = actual.detach().cpu().to(F64)
    assert actual.shape == expected.shape, what
    err = (actual - expected).abs().max().item() if expected.numel() else 0.0
    assert err <= tol * _scale(expected), f"{what}: max|diff| {err:.3e} > {tol} * max|ref|"


def _run(model: nn.Module, feats: torch.Tensor, coords: torch.Tensor, grad_seed: int):
    x = tl.SparseTensor(feats.clone().requires_grad_(True), coords)
    y = model(x)
    g = torch.Generator().manual_seed(grad_seed)
    dy = torch.randn(y.feats.shape, generator=g, dtype=F64).to(y.feats.dtype)
    (y.feats * dy.to(y.feats.device)).sum().backward()
    return y, x.feats.grad


@needs_gpu
@pytest.mark.parametrize("precision", sorted(PRECISIONS))
@pytest.mark.parametrize("dataflow", DATAFLOWS, ids=lambda d: d.value)
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_module_forward_and_gradients(family: str, dataflow: Dataflow, precision: str) -> None:
    dtype, tf32, tol = PRECISIONS[precision]
    config = ConvConfig(dataflow=dataflow, allow_tf32=tf32)
    torch.manual_seed(0)
    ref_model = FAMILIES[family](6, 10, config).to(F64)
    gpu_model = FAMILIES[family](6, 10, config)
    gpu_model.load_state_dict(ref_model.state_dict())
    gpu_model = gpu_model.to("cuda", dtype)
    # Weights and inputs rounded to the storage type, so both sides see the same numbers.
    with torch.no_grad():
        for p_ref, p_gpu in zip(ref_model.parameters(), gpu_model.parameters(), strict=True):
            p_ref.copy_(p_gpu.to(F64))
    coords = _coords(1500, 14, 1)
    feats = torch.randn(coords.shape[0], 6, generator=torch.Generator().manual_seed(2))
    feats = feats.to(dtype)
    y_ref, dx_ref = _run(ref_model, feats.to(F64), coords, 3)
    y, dx = _run(gpu_model, feats.cuda(), coords.cuda(), 3)
    assert y.feats.dtype == dtype and y.feats.device.type == "cuda"
    assert torch.equal(y.coords.cpu(), y_ref.coords), "output support differs from the CPU's"
    _close(y.feats, y_ref.feats, tol, "output")
    _close(dx, dx_ref, tol, "input gradient")
    for (name, p_ref), p_gpu in zip(
        ref_model.named_parameters(), gpu_model.parameters(), strict=True
    ):
        assert p_gpu.grad is not None, name
        _close(p_gpu.grad, p_ref.grad, tol, f"gradient of {name}")


def _unet_scene(seed: int) -> torch.Tensor:
    """A bumpy floor with posts: about 4k voxels in two batches."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for b in range(2):
        xs, ys = torch.meshgrid(torch.arange(40), torch.arange(40), indexing="ij")
        z = (3 * torch.sin(xs / 5.0 + b) + 2 * torch.cos(ys / 7.0)).round().long() + 6
        floor = torch.stack([torch.full_like(xs, b), xs, ys, z], -1).reshape(-1, 4)
        posts = floor[torch.randperm(floor.shape[0], generator=g)[:30]]
        rows += [floor] + [posts + torch.tensor([0, 0, 0, h]) for h in range(1, 6)]
    return torch.unique(torch.cat(rows), dim=0).to(torch.int32)


@needs_gpu
@pytest.mark.parametrize("dataflow", DATAFLOWS, ids=lambda d: d.value)
def test_resunet42_forward_backward_matches_cpu(dataflow: Dataflow) -> None:
    from torch_lattice.nn.functional import conv_config

    coords = _unet_scene(0)
    torch.manual_seed(0)
    ref = tl.backbones.SparseResUNet42(3, 5, width=0.25).to(F64)
    gpu = tl.backbones.SparseResUNet42(3, 5, width=0.25)
    gpu.load_state_dict(ref.state_dict())
    # Batch norm in eval mode: in training mode its backward divides by each channel's
    # batch deviation, which amplifies fp32 rounding beyond any fixed tolerance.
    ref.eval()
    gpu = gpu.cuda().eval()
    feats = torch.randn(coords.shape[0], 3, generator=torch.Generator().manual_seed(1))
    with conv_config(ConvConfig(dataflow=dataflow)):
        y_ref, _ = _run(ref, feats.to(F64), coords, 4)
        y, _ = _run(gpu, feats.cuda(), coords.cuda(), 4)
        assert torch.equal(y.coords.cpu(), y_ref.coords)
        _close(y.feats, y_ref.feats, 1e-4, "output")
        # Gradients through smooth activations (see smooth_activations): with ReLU a
        # rounding-level difference flips masks, and GPU run 3 saw 2.6e-3 in one bias.
        for model in (ref, gpu):
            smooth_activations(model).zero_grad(set_to_none=True)
        y_ref, dx_ref = _run(ref, feats.to(F64), coords, 4)
        y, dx = _run(gpu, feats.cuda(), coords.cuda(), 4)
    _close(y.feats, y_ref.feats, 1e-4, "output with SiLU")
    _close(dx, dx_ref, 1e-4, "input gradient")
    for (name, p_ref), p_gpu in zip(ref.named_parameters(), gpu.parameters(), strict=True):
        _close(p_gpu.grad, p_ref.grad, 1e-4, f"gradient of {name}")


@needs_gpu
def test_torch_compile_small_network() -> None:
    torch.manual_seed(0)
    net = nn.Sequential(
        tl.nn.SubmConv3d(4, 16, kernel_size=3),
        tl.nn.ReLU(),
        tl.nn.SubmConv3d(16, 8, kernel_size=3),
    ).cuda()
    coords = _coords(2000, 16, 5).cuda()
    feats = torch.randn(coords.shape[0], 4, device="cuda")
    eager = net(tl.SparseTensor(feats, coords)).feats
    compiled = torch.compile(net)
    got = compiled(tl.SparseTensor(feats, coords)).feats
    _close(got, eager, 1e-5, "compiled output")


@needs_gpu
def test_bad_inputs_on_the_gpu() -> None:
    coords = _coords(300, 8, 6)
    conv = tl.nn.SubmConv3d(3, 4, kernel_size=3).cuda()
    x_cpu = tl.SparseTensor(torch.randn(coords.shape[0], 3), coords)
    with pytest.raises((ValueError, RuntimeError), match=r"is on cpu|device"):
        conv(x_cpu)  # weights on the GPU, input on the CPU
    x64 = tl.SparseTensor(torch.randn(coords.shape[0], 3, dtype=F64).cuda(), coords.cuda())
    with pytest.raises(TypeError, match=r"float64|dtype"):
        conv.to(F64)(x64)
    ops = torch.ops.lattice
    nbr = torch.zeros((4, 27), dtype=torch.int32, device="cuda")
    with pytest.raises(ValueError, match="device"):
        ops.sparse_conv(torch.randn(4, 3, device="cuda"), torch.randn(27, 3, 4), nbr, nbr, False)
    with pytest.raises(ValueError, match=r"kernel rows"):
        ops.sparse_conv(
            torch.randn(4, 3, device="cuda"), torch.randn(8, 3, 4, device="cuda"), nbr, nbr
        )
    dup = torch.tensor([[0, 1, 1, 1], [0, 1, 1, 1]], dtype=torch.int32, device="cuda")
    with pytest.raises(ValueError, match="must be unique"):
        tl.nn.SubmConv3d(1, 1).cuda()(tl.SparseTensor(torch.ones(2, 1, device="cuda"), dup))
