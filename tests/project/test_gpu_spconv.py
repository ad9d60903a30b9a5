"""spconv beside the library in the GPU benchmark (benchmarks/gpu_spconv.py), checked here
with spconv's CPU build: its forward is right at one torch thread, and it has no CPU
backward, so the gradients are compared on the GPU machine only (the benchmark checks them
before it times spconv there). The ``spconv`` extra is installed by scripts/setup-env.sh."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

import torch_lattice as tl

# benchmarks/ sits beside tests/; a plain `pytest` run of this file alone does not put the
# repository root on sys.path.
ROOT = str(Path(__file__).resolve().parents[2])
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from benchmarks import gpu, gpu_layers  # noqa: E402
from benchmarks.gpu_layers import rel_error  # noqa: E402
from torch_lattice.backbones import SparseResUNet42  # noqa: E402

sp = pytest.importorskip("spconv.pytorch", reason="the spconv extra (scripts/setup-env.sh)")
gs = pytest.importorskip("benchmarks.gpu_spconv")


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    """spconv's CPU forward returns wrong sums at more than one torch thread."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _coords(n: int = 1500, extent: int = 20, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    c = torch.cat([torch.randint(0, 2, (n, 1), generator=g),
                   torch.randint(0, extent, (n, 3), generator=g)], 1)
    return torch.unique(c, dim=0).int()


@pytest.mark.parametrize("index", range(4))
def test_spconv_layers_compute_the_library_relation(index: int) -> None:
    """SubMConv3d k3, SparseConv3d k2 s2 and k3 s2 p1, SparseInverseConv3d: the same
    output rows (matched by coordinates) and sums, through both the checked and the timed
    call."""
    case = [c for c in gpu_layers.layer_cases(_coords(), 6, "cpu", seed=3)
            if c.target is None][index]
    layer = gs.SpconvLayer(case)
    with torch.no_grad():
        ours = case.ours()
        assert rel_error(layer(case.x.feats, case.module.weight), ours) < 1e-5
        timed = layer.timed(case.x.feats)()
        assert rel_error(timed[layer.perm_out], ours) < 1e-5
    assert layer.strided == case.name.startswith("Conv3d")
    assert ("builds its indices" in layer.note) == layer.strided


def test_spconv_layer_with_another_weight_disagrees() -> None:
    case = gpu_layers.layer_cases(_coords(), 6, "cpu", seed=3)[1]
    layer = gs.SpconvLayer(case)
    with torch.no_grad():
        layer.layer.weight[0, 0, 0, 0, 0] += 1.0
        assert rel_error(layer(case.x.feats, case.module.weight), case.ours()) > 1e-3


@pytest.mark.parametrize("kernel", [(3, 3, 3), (2, 2, 2), (1, 1, 1)])
def test_weight_layouts_round_trip(kernel: tuple[int, int, int]) -> None:
    """canonical -> spconv -> canonical is the identity, for the pointwise layers too
    (spconv 2.3 reads their weight's memory as a (C_in, C_out) matrix)."""
    k = kernel[0] ** 3
    w = torch.randn(k, 3, 5)
    layer = (sp.SubMConv3d(3, 5, kernel, bias=False) if kernel != (2, 2, 2)
             else sp.SparseConv3d(3, 5, kernel, stride=2, bias=False))
    spw = gs.spconv_weight(layer, w)
    assert spw.shape == layer.weight.shape
    assert torch.equal(gs.canonical_weight(layer, spw), w)


def test_match_rows_pairs_rows_by_coordinates_and_refuses_other_rows() -> None:
    src = _coords(200)
    perm = torch.randperm(src.shape[0])
    dst = src[perm]
    p = gs.match_rows(src, dst)
    assert torch.equal(src[p], dst)
    other = dst.clone()
    other[0, 1] += 50
    with pytest.raises(ValueError, match="not the library's"):
        gs.match_rows(src, other)
    with pytest.raises(ValueError, match="rows where the library has"):
        gs.match_rows(src, dst[1:])


@pytest.mark.parametrize("train", [False, True])
def test_spconv_resunet42_is_the_same_network(train: bool) -> None:
    """The spconv build with the library model's weights and batch-norm state: the same
    logits in eval and in train mode (batch statistics), and the check restores both
    models' batch-norm state."""
    coords = _coords(2500, 24)
    torch.manual_seed(0)
    model = SparseResUNet42(4, 20).train(train)
    twin = gs.SpconvResUNet42(model)
    feats = torch.randn(coords.shape[0], 4)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        assert gs.unet_check(model, twin, feats, coords, backward=False) < 1e-4
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert len(twin.conv_pairs(model)) == 42 + 1 + 4  # + head + the decoders' shortcuts
    with torch.no_grad():  # one changed weight shows
        twin.head.weight.mul_(1.5)
        assert gs.unet_check(model, twin, feats, coords, backward=False) > 1e-2


def _fake_implicit_gemm(nbr: torch.Tensor, out_coords: torch.Tensor) -> tuple:
    """spconv's implicit-GEMM result layout (out_inds, _, pair_fwd (K, N_out)) with its
    output rows and kernel rows in another order."""
    rows = torch.randperm(nbr.shape[0])
    cols = torch.randperm(nbr.shape[1])
    return out_coords[rows], None, nbr[rows][:, cols].T.contiguous()


def test_spconv_indices_are_checked_as_a_relation() -> None:
    from torch_lattice.geometry import ConvGeometry
    from torch_lattice.nn.functional.relation import kernel_map

    coords = _coords(800)
    x = tl.SparseTensor(torch.zeros(coords.shape[0], 1), coords)
    nbr = kernel_map(x.support, x.support, ConvGeometry.submanifold((3, 3, 3), (1, 1, 1))).nbr
    gs.check_indices(_fake_implicit_gemm(nbr, coords), nbr, coords)
    wrong = nbr.clone()
    o = int((wrong[:, 0] >= 0).nonzero()[0])
    wrong[o, 0] = -1
    with pytest.raises(ValueError, match="pairs are not the library's"):
        gs.check_indices(_fake_implicit_gemm(wrong, coords), nbr, coords)
    with pytest.raises(ValueError, match="table is"):
        gs.check_indices(_fake_implicit_gemm(nbr[:, :8], coords), nbr, coords)


def test_spconv_index_generation_runs() -> None:
    for name, fn in gs.indice_rows(_coords(300)):
        assert name.endswith("spconv indices")
        assert isinstance(fn(), tuple)


def test_network_rows_check_spconv_before_timing_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """With spconv beside us (forced here on the CPU): its forward is checked, then timed
    with its error; its training step, which its CPU build cannot run, is a row saying so,
    not a time."""
    from benchmarks.scenes import tiny_scene

    monkeypatch.setattr(gpu, "spconv_here", lambda device: None)
    rows = gpu.unet_rows(gpu.Timer("cpu", 1, warm=0), tiny_scene(20).coords, "cpu", ["fp32"])
    theirs = {r.case: r for r in rows if r.impl == "spconv"}
    fwd = theirs["ResUNet42 forward, maps built"]
    assert fwd.ms > 0 and fwd.err is not None and fwd.err < 1e-3
    bwd = theirs["ResUNet42 fwd+bwd, maps built"]
    assert bwd.ms != bwd.ms and bwd.note.startswith("not checked")
