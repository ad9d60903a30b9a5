"""Benchmarks package: a tiny CLI run writes its files, and every baseline computes the
library's numbers (so a speed-up is never measured against different math).

No timing is asserted here; speed is measured by ``python -m benchmarks``.
"""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

import pytest
import torch

import torch_lattice as tl
from torch_lattice.geometry import ConvGeometry
from torch_lattice.ops.conv import sparse_conv
from torch_lattice.ops.kernel_map import build_kernel_map, generate_support

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks import baselines as bl  # noqa: E402
from benchmarks import report, scenes, workloads  # noqa: E402
from benchmarks.cli import main  # noqa: E402

SUBM3 = ConvGeometry.submanifold((3, 3, 3), (1, 1, 1))
DOWN2 = ConvGeometry.create(2, 2)


def _coords(n: int = 300, extent: int = 9, batches: int = 2, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    raw = torch.randint(0, extent, (n, 3), generator=g)
    b = torch.randint(0, batches, (n, 1), generator=g)
    return torch.unique(torch.cat([b, raw], dim=1), dim=0).to(torch.int32)


def _generated(coords: torch.Tensor, geometry: ConvGeometry) -> torch.Tensor:
    rng = (coords[:, 1:].amax(dim=0) + 1).tolist()
    out_range = list(geometry.output_range(rng))
    nb = int(coords[:, 0].max()) + 1
    return generate_support(coords, *map(list, geometry.as_c()), out_range, nb)


@pytest.mark.parametrize(
    "geometry",
    [
        SUBM3,
        DOWN2,
        ConvGeometry.create((3, 2, 1), (2, 1, 1), (1, 0, 0), (1, 2, 1)),
        ConvGeometry.submanifold((3, 3, 3), (2, 1, 2)),
    ],
)
def test_torch_kernel_map_equals_library_nbr(geometry: ConvGeometry) -> None:
    """torch_kernel_map(in, out)[o, n] == nbr[o, n] for every (o, n), -1 included."""
    coords = _coords()
    is_subm = geometry.stride == (1, 1, 1) and geometry.padding != (0, 0, 0)
    out = coords if is_subm else _generated(coords, geometry)
    lib = build_kernel_map(coords, out, geometry).nbr
    assert torch.equal(bl.torch_kernel_map(coords, out, geometry), lib)


def test_gather_scatter_equals_library_forward_and_backward() -> None:
    coords = _coords()
    kmap = build_kernel_map(coords, coords, SUBM3)
    pairs = bl.pairs_from_nbr(bl.torch_kernel_map(coords, coords, SUBM3))
    n = coords.shape[0]
    x = torch.randn(n, 5, dtype=torch.float64, requires_grad=True)
    w = torch.randn(27, 5, 7, dtype=torch.float64, requires_grad=True)
    g = torch.randn(n, 7, dtype=torch.float64)
    ours = sparse_conv(x, w, kmap.nbr, kmap.rev)
    dx, dw = torch.autograd.grad(ours, (x, w), g)
    ref = bl.gather_scatter_conv(x, w, pairs, n)
    rdx, rdw = torch.autograd.grad(ref, (x, w), g)
    torch.testing.assert_close(ref, ours, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(rdx, dx, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(rdw, dw, rtol=1e-10, atol=1e-10)


def test_dense_baseline_equals_library() -> None:
    coords = _coords()
    x = torch.randn(coords.shape[0], 4, dtype=torch.float64)
    conv = tl.nn.SubmConv3d(4, 6, 3).double()
    with torch.no_grad():
        ours = conv(tl.SparseTensor(x, coords)).feats
        grid = bl.dense_grid(coords, 4)
        assert grid is not None
        w5 = bl.dense_weight(conv.weight, (3, 3, 3))
        ref = bl.dense_subm_conv(x, coords.long(), w5, grid)
    torch.testing.assert_close(ref, ours, rtol=1e-10, atol=1e-10)


def test_transpose_baseline_equals_library() -> None:
    """Swapped k2 s2 pairs reproduce ConvTranspose3d(src, target)."""
    coords = _coords()
    down = tl.nn.Conv3d(3, 3, 2, stride=2).double()
    up = tl.nn.ConvTranspose3d(3, 5, 2, stride=2).double()
    x = tl.SparseTensor(torch.randn(coords.shape[0], 3, dtype=torch.float64), coords)
    with torch.no_grad():
        src = down(x)
        ours = up(src, x).feats
        pairs = bl.swap_pairs(bl.pairs_from_nbr(bl.torch_kernel_map(coords, src.coords, DOWN2)))
        ref = bl.gather_scatter_conv(src.feats, up.weight, pairs, coords.shape[0])
    torch.testing.assert_close(ref, ours, rtol=1e-10, atol=1e-10)


def test_mm_proxy_has_the_convolution_flops() -> None:
    assert bl.mm_proxy(1000, 16, 32, square=False).flops == 2 * 1000 * 16 * 32
    sq = bl.mm_proxy(1000, 16, 32, square=True).flops
    assert abs(sq - 2 * 1000 * 16 * 32) / (2 * 1000 * 16 * 32) < 0.05


def test_missing_module_is_reported_not_failed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(workloads, "lookup", lambda path: None)
    rows = workloads.WORKLOADS["convtr_k2s2_target"].run(
        scenes.tiny_scene(6), 4, workloads.Options(repeats=1, warmup=0)
    )
    assert [r["status"] for r in rows] == ["not available (tl.nn.ConvTranspose3d)"]


def test_scene_arguments_are_checked() -> None:
    with pytest.raises(ValueError, match="scene: unknown kind"):
        scenes.make_scene("forest")
    with pytest.raises(ValueError, match="batch"):
        scenes.make_scene("surface", 0)


def _have_matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def test_cli_smoke_run_writes_json_markdown_and_plots(tmp_path: Path) -> None:
    out = tmp_path / "bench"
    args = ["run", "--suite", "smoke", "--out", str(out), "--no-spconv", "--no-memory"]
    args += ["--only", "kmap_subm3,subm3_fwd,subm3_fwdbwd", "--repeats", "1", "--warmup", "0"]
    if not _have_matplotlib():
        with pytest.raises(SystemExit, match="matplotlib"):
            main(args)
        assert not out.exists()
        args.append("--no-plots")
    assert main(args) == 0
    data = json.loads((out / "results.json").read_text())
    assert data["meta"]["command"].startswith("python -m benchmarks run --suite smoke")
    ok = {(r["workload"], r["impl"]) for r in data["results"] if r["status"] == "ok"}
    for pair in [
        ("kmap_subm3", workloads.LATTICE),
        ("kmap_subm3", workloads.TORCH_KMAP),
        ("subm3_fwd", workloads.LATTICE),
        ("subm3_fwd", workloads.TORCH),
        ("subm3_fwd", workloads.DENSE),
        ("subm3_fwdbwd", workloads.TORCH),
    ]:
        assert pair in ok
    assert all(r["median_ms"] > 0 for r in data["results"] if r["status"] == "ok")
    text = (out / "results.md").read_text()
    assert "## Targets" in text and "| subm3_fwd | tiny-24 |" in text
    assert "## Size sweep" in text
    if _have_matplotlib():
        for name in report.PLOTS:
            assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not [p.name for p in out.iterdir() if p.name.startswith(".")]
    (out / "results.md").unlink()
    redraw = ["report", "--out", str(out)] + ([] if _have_matplotlib() else ["--no-plots"])
    assert main(redraw) == 0
    assert (out / "results.md").read_text() == text


def test_large_check_runs_at_a_tiny_size(tmp_path: Path) -> None:
    """``python -m benchmarks large`` (5M voxels by default) runs end to end on 400 voxels."""
    from benchmarks import large

    out = tmp_path / "large"
    args = ["large", "--voxels", "400", "--repeats", "1", "--out", str(out)]
    assert main(args) == 0
    data = json.loads((out / "large.json").read_text())
    assert data["meta"]["command"] == "python -m benchmarks " + " ".join(args)
    assert data["scene"]["voxels"] == 400  # a 20 x 20 height field
    assert data["scene"]["pairs_subm3"] >= 400  # every voxel is its own centre neighbour
    steps = {r["step"]: r for r in data["steps"]}
    assert list(steps) == ["scene", "kmap_subm3", "subm3_fwd_cold", "subm3_fwd", "subm3_fwdbwd"]
    for r in data["steps"]:
        assert r["median_ms"] > 0 and r["maxrss_mb"] > 0
    assert steps["subm3_fwd"]["peak_rss_growth_mb"] is not None
    text = (out / "large.md").read_text()
    assert "| subm3_fwd |" in text and "400 voxels" in text
    # Without backward or memory runs, those columns are absent / empty.
    small = large.run_large(
        voxels=64, channels=2, repeats=1, backward=False, memory=False, log=lambda line: None
    )
    assert [r["step"] for r in small["steps"]][-1] == "subm3_fwd"
    assert all(r["peak_rss_growth_mb"] is None for r in small["steps"])
    with pytest.raises(ValueError, match="voxels: must be an int >= 1"):
        large.run_large(voxels=0)
    with pytest.raises(SystemExit, match="--channels: must be >= 1"):
        main(["large", "--channels", "0"])


@pytest.mark.parametrize("mask", [0o022, 0o077])
def test_report_files_follow_the_umask(tmp_path: Path, mask: int) -> None:
    """Reports go through torch_lattice.atomic_file: mode ``0o666 & ~umask``, no temp."""
    old = os.umask(mask)
    try:
        report.write_json(tmp_path / "r" / "results.json", {"command": "x"}, [])
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "r" / "results.json").stat().st_mode) == 0o666 & ~mask
    assert [p.name for p in (tmp_path / "r").iterdir()] == ["results.json"]
