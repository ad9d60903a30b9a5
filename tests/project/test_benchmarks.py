"""Benchmarks package: a tiny CLI run writes its files, and every baseline computes the
library's numbers (so a speed-up is never measured against different math); a baseline
that disagrees is reported and not timed, the check runs before timing, spconv runs at its
own thread count with torch's restored after, and ``benchmarks`` imports an installed
torch_lattice when the source tree's has no ``_C``.

No timing is asserted here; speed is measured by ``python -m benchmarks``.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any, ClassVar

import pytest
import torch
from cpu_isa_helpers import widest_isa

import torch_lattice as tl
from torch_lattice.geometry import ConvGeometry
from torch_lattice.ops.conv import sparse_conv
from torch_lattice.ops.kmap import build_kernel_map, generate_support

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks import baselines as bl  # noqa: E402
from benchmarks import checks, package_path, report, scenes, workloads  # noqa: E402
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


@contextlib.contextmanager
def _drawn_figures() -> Iterator[list[Any]]:
    """The figures the plots close meanwhile, kept open for the test to read."""
    import matplotlib.pyplot as plt

    close, figures = plt.close, []
    plt.close = figures.append
    try:
        yield figures
    finally:
        plt.close = close
        for figure in figures:
            close(figure)


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
    assert data["meta"]["peak"]["threads"] == torch.get_num_threads()
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
        # throughput.png draws the run's own fp32 peak beside the rates
        with _drawn_figures() as figures:
            report.write_plots(out, data["results"], data["meta"]["peak"])
            peak = data["meta"]["peak"]["fp32_gflops"]
            lines = [ln for ax in figures[2].axes for ln in ax.get_lines()
                     if ln.get_label().startswith("fp32 FMA peak")]
            assert lines and all(list(ln.get_ydata()) == [peak, peak] for ln in lines)
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


@pytest.mark.parametrize("name", ["large.json", "large.md"])
def test_large_check_never_writes_through_a_link(tmp_path: Path, name: str) -> None:
    """``large``'s outputs are replaced atomically and only where they are regular files:
    a link planted as ``large.json`` or ``large.md`` stops the run before any timing, and
    the file it points to (outside ``--out``) is left as it was; a failed run leaves
    neither output behind."""
    out = tmp_path / "large"
    out.mkdir()
    outside = tmp_path / "outside.txt"
    outside.write_text("kept")
    (out / name).symlink_to(outside)
    args = ["large", "--voxels", "64", "--repeats", "1", "--no-memory", "--no-backward",
            "--out", str(out)]
    with pytest.raises(SystemExit, match=f"--out: .*{name}.* is a symbolic link; only a "
                       "regular file is replaced"):
        main(args)
    assert outside.read_text() == "kept"
    assert sorted(p.name for p in out.iterdir()) == [name]


@pytest.mark.parametrize(("content", "message"), [
    (b"\xff\xfe", "is not UTF-8 JSON"),
    (b'{"meta": 1, "results": []}', "meta must be an object, got int"),
    (b'{"meta": {}, "results": 5}', "results must be a list, got int"),
    (b'{"meta": {}, "results": [{"x": 1}]}', r"results\[0\] needs workload, scene, impl"),
    (None, "is a character device; only regular files are read"),
])
def test_report_refuses_a_foreign_results_file_in_one_line(
        tmp_path: Path, content: bytes | None, message: str) -> None:
    """``report`` redraws from a results.json anyone may have edited: a file that is not
    one (not UTF-8, wrong shapes, rows without their keys, a link to /dev/zero) stops
    with one ``--out`` line naming it, not a traceback, and writes nothing."""
    src = tmp_path / "results.json"
    if content is None:
        src.symlink_to("/dev/zero")
    else:
        src.write_bytes(content)
    with pytest.raises(SystemExit, match=f"--out: .*results.json.*{message}"):
        main(["report", "--no-plots", "--out", str(tmp_path)])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.json"]


def test_spconv_pair_lists_are_compared_as_the_library_relation() -> None:
    """spconv's submanifold indices list one pair of each mirror pair and no centre; its
    check adds both back, so a faithful result has exactly the library's pairs and a
    result missing one pair does not."""
    coords = scenes.tiny_scene(6).coords
    one = [1, 1, 1]
    nbr, _ = torch.ops.lattice.kernel_map(coords, coords, [3, 3, 3], one, one, one)
    half = [torch.nonzero(nbr[:, k] >= 0).flatten() for k in range(13)]
    width = max(int(h.numel()) for h in half)
    pairs = torch.full((2, 27, width), -1, dtype=torch.int32)
    counts = torch.zeros(27, dtype=torch.int32)
    for k, outs in enumerate(half):
        pairs[0, k, : outs.numel()] = nbr[outs, k]
        pairs[1, k, : outs.numel()] = outs.to(torch.int32)
        counts[k] = outs.numel()
    n = coords.shape[0]
    want = bl.pair_keys(nbr)
    assert torch.equal(bl.spconv_pair_keys((None, pairs, counts), n), want)
    counts[int(torch.nonzero(counts)[0])] -= 1
    assert not torch.equal(bl.spconv_pair_keys((None, pairs, counts), n), want)


def test_two_builds_side_by_side(capsys: pytest.CaptureFixture[str]) -> None:
    """``python -m benchmarks.builds`` against a second copy of this very build: every
    group runs on the tiny scene (the network in bfloat16 too) and reports bitwise-equal
    outputs; a build that computes other numbers stops the run before anything is
    timed."""
    from benchmarks import builds
    from torch_lattice.ops._runtime import _C

    args = ["--base", _C.__file__, "--scenes", "tiny", "--channels", "4", "--repeats", "1"]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("sys.argv", ["builds", *args])
        assert builds.main() == 0
    out = capsys.readouterr().out
    assert out.count("| bitwise |") == 4  # forward, weight gradient, eval, training step
    assert "| tiny | " in out and "| equal |" in out
    assert builds._C.conv_forward is _C.conv_forward  # the swap was undone
    strided = [*args, "--groups", "layers", "--maps", *builds.MAPS[1:]]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("sys.argv", ["builds", *strided])
        assert builds.main() == 0
    out = capsys.readouterr().out
    for name in builds.MAPS[1:]:
        assert out.count(f"| {name} |") == 2  # forward and weight gradient
    assert out.count("| bitwise |") == 2 * len(builds.MAPS[1:])
    half = [*args, "--groups", "unet", "--dtype", "bfloat16"]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("sys.argv", ["builds", *half])
        assert builds.main() == 0
    out = capsys.readouterr().out
    assert "bfloat16" in out and out.count("| bitwise |") == 2  # eval, training step
    with pytest.raises(SystemExit, match="disagree"):
        builds._agreement(torch.ones(3), torch.ones(3) * 1.01)
    norm = [*args[:4], "--channels", "4", "96", "--repeats", "1", "--groups", "norm"]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("sys.argv", ["builds", *norm, "--reuse-cpu-memory"])
        assert builds.main() == 0
    out = capsys.readouterr().out
    assert out.count("| bitwise |") == 8  # four passes at two widths
    assert builds._C.batch_norm_apply is _C.batch_norm_apply
    # Over tile lists: C = 128 in float32 keeps none (conv_list_rows 0), so it runs as the
    # op does there, listing the table, instead of stopping.
    listed = [*args[:4], "--channels", "4", "128", "--repeats", "1", "--groups", "layers",
              "--maps", "subm3", "--listed"]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("sys.argv", ["builds", *listed])
        assert builds.main() == 0
    assert capsys.readouterr().out.count("| bitwise |") == 4  # two kernels at two widths
    # bfloat16 over lists: the weight gradient's blocks are not whole forward tiles there,
    # so it lists the table (as the op does) instead of being refused by the kernel.
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("sys.argv", ["builds", *listed, "--dtype", "bfloat16"])
        assert builds.main() == 0
    assert capsys.readouterr().out.count("| bitwise |") == 4
    # The pair kernels run float32 only: another dtype is refused before anything runs.
    pairs = [*args, "--groups", "layers", "--kernels", "pairs_forward", "--dtype", "float16"]
    with pytest.MonkeyPatch.context() as mp, pytest.raises(SystemExit):
        mp.setattr("sys.argv", ["builds", *pairs])
        builds.main()
    assert "run in float32 only" in capsys.readouterr().err


def test_two_builds_time_gather_scatter_when_asked(capsys: pytest.CaptureFixture[str]) -> None:
    """``--pair-dataflow gather_scatter``: the pair kernels of both builds run in that
    mode (fetch-on-demand without it), and their outputs are compared first."""
    from benchmarks import builds
    from torch_lattice.ops._runtime import _C
    from torch_lattice.ops.conv import FETCH_ON_DEMAND, GATHER_SCATTER

    modes: list[int] = []

    def recording(name: str) -> Any:
        def call(mode: int, *rest: int) -> None:
            modes.append(mode)
            getattr(_C, name)(mode, *rest)

        return call

    base = SimpleNamespace(**{k: recording(k) for k in builds.PAIR_KERNELS})
    for flag, mode in (("gather_scatter", GATHER_SCATTER), ("fetch_on_demand", FETCH_ON_DEMAND)):
        modes.clear()
        builds.layers(base, ["tiny"], [4], 1, ["subm3"], builds.PAIR_KERNELS,  # type: ignore[arg-type]
                      torch.float32, mode)
        assert modes and set(modes) == {mode}, flag
        out = capsys.readouterr().out
        assert out.count("| bitwise |") == 2  # forward and weight gradient
    args = ["--base", _C.__file__, "--scenes", "tiny", "--channels", "4", "--repeats", "1",
            "--groups", "layers", "--kernels", *builds.PAIR_KERNELS,
            "--pair-dataflow", "gather_scatter"]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("sys.argv", ["builds", *args])
        assert builds.main() == 0
    assert capsys.readouterr().out.count("| bitwise |") == 2


def test_two_builds_norm_group_stops_on_other_numbers() -> None:
    """A base whose normalize + ReLU leaves out the ReLU computes other numbers: the
    norm group stops before timing it."""
    from benchmarks import builds
    from torch_lattice.ops._runtime import _C

    apply = _C.batch_norm_apply  # the swap points _C's name at the base's

    def no_relu(code: int, n: int, c: int, relu: int, *rest: int) -> None:
        apply(code, n, c, 0, *rest)

    base = SimpleNamespace(**{k: getattr(_C, k) for k in builds.NORM_ENTRY_POINTS})
    base.batch_norm_apply = no_relu
    with pytest.raises(SystemExit, match="apply \\+ ReLU: the two builds' outputs differ"):
        builds.norms(base, ["tiny"], [8], 1, torch.float32)  # type: ignore[arg-type]
    assert builds._C.batch_norm_apply is _C.batch_norm_apply


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


# --------------------------------------------------------------------------------------
# Output checks before timing, spconv's thread count, which torch_lattice is imported
# --------------------------------------------------------------------------------------


def test_compare_names_the_worst_difference() -> None:
    a = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    assert checks.compare({"out": a}, {"out": a + 1e-6}) is None
    why = checks.compare({"out": a}, {"out": a + torch.tensor([[0.0, 0.0], [0.0, 0.5]])})
    assert why is not None and why.startswith("disagrees: max |diff| = 0.5 (out;")
    assert "shape (4,)" in str(checks.compare({"out": a}, {"out": a.flatten()}))
    bad = a.clone()
    bad[0, 0] = float("nan")
    assert "non-finite" in str(checks.compare({"out": a}, {"out": bad}))
    nbr = torch.tensor([[0, -1], [1, 0]], dtype=torch.int32)
    assert checks.compare({"nbr": nbr}, {"nbr": nbr.clone()}) is None
    assert "max |diff| = 1" in str(checks.compare({"nbr": nbr}, {"nbr": nbr + (nbr == 0)}))
    # Only shared names are compared; none shared is a disagreement.
    assert checks.compare({"out": a, "grad_w": a}, {"out": a}) is None
    assert "no output in common" in str(checks.compare({"out": a}, {"other": a}))
    with pytest.raises(ValueError, match="reference"):
        checks.disagreements("lattice", {"other": lambda: a})
    with pytest.raises(TypeError, match="check: expected a tensor"):
        checks.outputs_of(3)


def _fake_measure(events: list[str], wrong: bool) -> list[dict]:
    """``_measure`` over a fake library and two fake baselines, logging every call."""
    x = torch.arange(6.0).reshape(3, 2)

    def impl(name: str, value: torch.Tensor, phase: str):
        def fn() -> torch.Tensor:
            events.append(f"{phase}:{name}")
            return value

        return fn

    good, bad = "good_baseline", "bad_baseline"
    fns = {
        workloads.LATTICE: impl(workloads.LATTICE, x, "time"),
        good: impl(good, x + 1e-7, "time"),
        bad: impl(bad, x + (0.25 if wrong else 0.0), "time"),
    }
    checked = {
        workloads.LATTICE: impl(workloads.LATTICE, x, "check"),
        good: impl(good, x + 1e-7, "check"),
        bad: impl(bad, x + (0.25 if wrong else 0.0), "check"),
    }
    opts = workloads.Options(repeats=2, warmup=1, memory=False)
    return workloads._measure("w", scenes.tiny_scene(4), 2, opts, fns, {}, checked)


def test_a_disagreeing_baseline_is_reported_and_not_timed() -> None:
    events: list[str] = []
    rows = {r["impl"]: r for r in _fake_measure(events, wrong=True)}
    assert rows["bad_baseline"]["status"] == (
        "disagrees: max |diff| = 0.25 (out; tolerance 0.00501)"
    )
    assert "median_ms" not in rows["bad_baseline"]
    assert "time:bad_baseline" not in events  # neither warmed up nor timed
    assert events.count("check:bad_baseline") == 1
    for name in (workloads.LATTICE, "good_baseline"):
        assert rows[name]["status"] == "ok" and len(rows[name]["times_ms"]) == 2
        assert events.count(f"time:{name}") == 3  # 1 warm-up + 2 timed
    # The same baseline, right this time, is timed.
    events.clear()
    rows = {r["impl"]: r for r in _fake_measure(events, wrong=False)}
    assert rows["bad_baseline"]["status"] == "ok"
    assert events.count("time:bad_baseline") == 3


def test_the_check_runs_before_any_timing() -> None:
    events: list[str] = []
    _fake_measure(events, wrong=False)
    first_timed = min(i for i, e in enumerate(events) if e.startswith("time:"))
    assert events[:first_timed] == [
        "check:torch_lattice",
        "check:good_baseline",
        "check:bad_baseline",
    ]
    assert not [e for e in events[first_timed:] if e.startswith("check:")]


def test_a_wrong_torch_baseline_is_caught_in_a_real_workload(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """subm3_fwd with a gather-scatter that drops the last kernel row: reported, untimed."""
    real = bl.gather_scatter_conv
    calls = []

    def dropping(x: torch.Tensor, weight: torch.Tensor, pairs: list, n_out: int) -> torch.Tensor:
        calls.append(1)
        return real(x, weight, pairs[:-1], n_out)

    monkeypatch.setattr(bl, "gather_scatter_conv", dropping)
    opts = workloads.Options(repeats=2, warmup=1, memory=False, spconv=False)
    rows = {
        r["impl"]: r for r in workloads.WORKLOADS["subm3_fwd"].run(scenes.tiny_scene(8), 4, opts)
    }
    assert rows[workloads.TORCH]["status"].startswith("disagrees: max |diff| = ")
    assert len(calls) == 1  # the check only
    assert rows[workloads.LATTICE]["status"] == "ok"
    assert rows[workloads.DENSE]["status"] == "ok"  # right, so timed
    text = report.markdown({"threads": 2, "checked": True}, list(rows.values()))
    line = next(x for x in text.splitlines() if x.startswith("| subm3_fwd | tiny-8 |"))
    assert "disagrees: max |diff| = " in line


def test_thread_override_restores_the_thread_count() -> None:
    before = torch.get_num_threads()
    seen = []

    def record() -> int:
        seen.append(torch.get_num_threads())
        return 7

    def fail() -> None:
        seen.append(torch.get_num_threads())
        raise RuntimeError("boom")

    torch.set_num_threads(2)
    try:
        assert bl.with_threads(record, 1)() == 7
        assert torch.get_num_threads() == 2
        with pytest.raises(RuntimeError, match="boom"):
            bl.with_threads(fail, 1)()
        assert torch.get_num_threads() == 2
        assert seen == [1, 1]
    finally:
        torch.set_num_threads(before)
    for bad in (0, -1, 1.0, True):
        with pytest.raises(ValueError, match="threads: must be an int >= 1"):
            bl.with_threads(record, bad)  # type: ignore[arg-type]


class _FakeSpconv:
    """Stands in for spconv: the right sums at one thread, a dropped kernel row above."""

    threads_seen: ClassVar[list[int]] = []

    def __init__(self, coords: torch.Tensor, weight: torch.Tensor) -> None:
        self.pairs = bl.pairs_from_nbr(bl.torch_kernel_map(coords, coords, SUBM3))
        self.weight = weight
        _FakeSpconv.threads_seen.append(torch.get_num_threads())

    def __call__(self, feats: torch.Tensor) -> torch.Tensor:
        n = torch.get_num_threads()
        _FakeSpconv.threads_seen.append(n)
        pairs = self.pairs if n == 1 else self.pairs[:-1]
        return bl.gather_scatter_conv(feats, self.weight, pairs, feats.shape[0])


@pytest.mark.parametrize("spconv_threads", [1, 2])
def test_spconv_runs_at_its_own_thread_count(
    monkeypatch: pytest.MonkeyPatch, spconv_threads: int
) -> None:
    monkeypatch.setattr(bl, "spconv_status", lambda: None)
    monkeypatch.setattr(bl, "SpconvSubm", _FakeSpconv)
    _FakeSpconv.threads_seen = []
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        opts = workloads.Options(
            repeats=1, warmup=0, memory=False, dense=False, spconv_threads=spconv_threads
        )
        rows = workloads.WORKLOADS["subm3_fwd"].run(scenes.tiny_scene(8), 4, opts)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
    row = next(r for r in rows if r["impl"] == workloads.SPCONV)
    assert set(_FakeSpconv.threads_seen) == {spconv_threads}
    if spconv_threads == 1:
        assert row["status"] == "ok" and row["threads"] == 1
        lat = next(r for r in rows if r["impl"] == workloads.LATTICE)
        assert lat["threads"] == 2
        text = report.markdown({"threads": 2, "checked": True}, rows)
        assert "Timed at their own thread count (shown in their cells): spconv." in text
        line = next(x for x in text.splitlines() if x.startswith("| subm3_fwd | tiny-8 |"))
        assert ", 1 thread)" in line
    else:
        assert row["status"].startswith("disagrees: max |diff| = ")


def _package(where: Path, built: bool) -> None:
    (where / "torch_lattice").mkdir(parents=True)
    (where / "torch_lattice" / "__init__.py").write_text("")
    if built:
        (where / "torch_lattice" / "_C.abi3.so").write_bytes(b"")


def test_package_path_prefers_a_built_source_tree(tmp_path: Path) -> None:
    root, site = tmp_path / "repo", tmp_path / "site-packages"
    _package(root, built=True)
    _package(site, built=True)
    path = ["", str(site)]
    assert package_path.resolve(root, path, cwd=root) == path


def test_package_path_uses_the_installed_package_over_unbuilt_source(tmp_path: Path) -> None:
    root, site = tmp_path / "repo", tmp_path / "site-packages"
    _package(root, built=False)
    _package(site, built=True)
    other = str(tmp_path / "elsewhere")
    path = ["", other, str(root), ".", str(site)]
    got = package_path.resolve(root, path, cwd=root)
    assert got == [other, str(site)]
    assert path == ["", other, str(root), ".", str(site)]  # the input is not changed
    # Run from another folder: '' is not the root, only the root's own entry goes.
    assert package_path.resolve(root, ["", str(root), str(site)], cwd=tmp_path) == [
        "",
        str(site),
    ]


def test_package_path_leaves_paths_alone_when_nothing_shadows(tmp_path: Path) -> None:
    root, site = tmp_path / "repo", tmp_path / "site-packages"
    root.mkdir()
    _package(site, built=True)
    # No torch_lattice/ in the root (a copy of the tests beside an installed wheel).
    assert package_path.resolve(root, ["", str(site)], cwd=root) == ["", str(site)]
    # The root is not on the path at all.
    _package(root, built=False)
    assert package_path.resolve(root, [str(site)], cwd=tmp_path) == [str(site)]


def test_package_path_says_what_to_do_when_nothing_is_built(tmp_path: Path) -> None:
    root = tmp_path / "repo"
    _package(root, built=False)
    with pytest.raises(package_path.PackageNotBuilt, match=r"no built _C .*pip install \."):
        package_path.resolve(root, ["", str(tmp_path / "empty")], cwd=root)


@pytest.mark.parametrize(
    "name",
    ["kmap_subm3", "conv_k2s2", "convtr_k2s2_inverse", "convtr_k2s2_target", "gen_convtr_k2s2"],
)
def test_every_real_baseline_passes_its_check(name: str) -> None:
    """The check compares like with like in each workload: right baselines are timed."""
    opts = workloads.Options(repeats=1, warmup=0, memory=False, spconv=False)
    rows = workloads.WORKLOADS[name].run(scenes.tiny_scene(10), 4, opts)
    timed = [r for r in rows if r["impl"] != workloads.SPCONV]
    assert len(timed) == 2
    assert [r["status"] for r in timed] == ["ok", "ok"], rows
    # spconv, switched off here, is a note saying so (the kernel map has it as a baseline)
    assert [r["status"] for r in rows if r["impl"] == workloads.SPCONV] in ([], ["disabled"])


def test_report_voids_spconv_times_taken_at_several_threads() -> None:
    """An old results.json (no check, spconv at the run's 2 threads) is marked as such."""
    base = {"workload": "subm3_fwd", "scene": "s", "voxels": 10, "batch": 1, "channels": 8}
    rows = [
        {**base, "impl": workloads.LATTICE, "status": "ok", "median_ms": 1.0},
        {**base, "impl": workloads.SPCONV, "status": "ok", "median_ms": 2.0},
    ]
    old = report.markdown({"threads": 2}, rows)
    assert "This run predates the output check" in old
    assert "spconv was timed at 2 threads" in old and "its times are void" in old
    rows[1]["threads"] = 1
    new = report.markdown({"threads": 2, "checked": True}, rows)
    assert "predates" not in new and "void" not in new
    assert "| subm3_fwd | s | 10 | 8 | 1.0 | - | - | 2.0 (2.00x, 1 thread) |" in new


def test_python_m_benchmarks_uses_an_installed_package_over_unbuilt_source(
    tmp_path: Path,
) -> None:
    """The scenario of a non-editable install, without pip: a repository copy whose
    torch_lattice/ has no _C, and a built copy on PYTHONPATH standing in for site-packages.
    ``python -m benchmarks`` from the copy's root must import the built one."""
    built = Path(tl.__file__).resolve().parent
    assert package_path.has_built_extension(built)
    skip = shutil.ignore_patterns("__pycache__", "*.so", "*.pyd")
    repo, site = tmp_path / "repo", tmp_path / "site"
    shutil.copytree(ROOT / "benchmarks", repo / "benchmarks", ignore=skip)
    shutil.copytree(built, repo / "torch_lattice", ignore=skip)
    shutil.copytree(built, site / "torch_lattice", ignore=shutil.ignore_patterns("__pycache__"))
    assert not package_path.has_built_extension(repo / "torch_lattice")
    out = tmp_path / "out"
    args = ["run", "--suite", "smoke", "--only", "kmap_subm3", "--no-plots", "--no-memory"]
    args += ["--repeats", "1", "--warmup", "0", "--out", str(out)]
    env = {**os.environ, "PYTHONPATH": str(site), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks", *args],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    meta = json.loads((out / "results.json").read_text())["meta"]
    assert Path(meta["torch_lattice"]) == (site / "torch_lattice").resolve()


def test_smooth_activations_swaps_every_relu_and_nothing_else() -> None:
    from benchmarks.gpu_accuracy import BatchNormSiLU, smooth_activations
    from torch_lattice.nn.modules.activation import ReLU, SiLU

    net = tl.backbones.SparseResUNet42(3, 5, width=0.25)
    keys = list(net.state_dict())
    relu_types = (ReLU, tl.nn.BatchNormReLU)
    relus = sum(isinstance(m, relu_types) for m in net.modules())
    assert relus > 40 and any(isinstance(m, tl.nn.BatchNormReLU) for m in net.modules())
    assert smooth_activations(net) is net
    assert not any(isinstance(m, relu_types) for m in net.modules())
    assert sum(isinstance(m, (SiLU, BatchNormSiLU)) for m in net.modules()) == relus
    assert list(net.state_dict()) == keys
    coords = scenes.tiny_scene(12).coords
    y = net.eval()(tl.SparseTensor(torch.randn(coords.shape[0], 3), coords))
    assert y.feats.shape == (coords.shape[0], 5) and torch.isfinite(y.feats).all()


def test_gpu_accuracy_crop_and_errors() -> None:
    from benchmarks.gpu_accuracy import compare, crop, rel

    coords = scenes.tiny_scene(24).coords
    slab = crop(coords, 100)
    assert slab.shape[0] >= 100
    assert slab[:, 1].max() <= coords[:, 1].kthvalue(100).values
    assert torch.equal(crop(coords, 10**6), coords)
    ref = torch.tensor([2.0, -4.0])
    assert rel(torch.tensor([2.0, -3.0]), ref) == 0.25 and rel(ref[:0], ref[:0]) == 0.0
    grads = {"a": torch.ones(2), "b": torch.tensor([1.0, 1.5])}
    out = compare((ref, ref, grads), (ref, ref, {"a": torch.ones(2), "b": torch.ones(2)}))
    assert out == (0.0, 0.0, 0.5, "b")


def test_gpu_tools_say_when_there_is_no_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    from benchmarks import gpu, gpu_accuracy

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert gpu_accuracy.main([]) == 2
    assert gpu.main([]) == 2
    with pytest.raises(SystemExit):
        gpu_accuracy.main(["--voxels", "0"])


def test_peak_probe_measures_the_widest_fma_this_cpu_runs() -> None:
    from benchmarks.peak import measure_peak

    flags = set()
    if Path("/proc/cpuinfo").is_file():
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    p = measure_peak(1, seconds=0.01, tries=1)
    if "avx512f" in flags:
        assert p.fp32_isa == "avx512f"
    elif {"avx2", "fma"} <= flags:
        assert p.fp32_isa == "avx2+fma"
    if p.fp32_isa is not None:
        assert p.fp32_gflops is not None and p.fp32_gflops > 0
    assert (p.bf16_gflops is not None) == ("avx512_bf16" in flags)
    # The tile probe runs where the library's own AMX kernels would (the CPU has them
    # and the operating system grants the tile state).
    assert (p.amx_bf16_gflops is not None) == (widest_isa() == "amx_bf16")
    if p.amx_bf16_gflops is not None:
        assert p.amx_bf16_gflops > 0
    with pytest.raises(ValueError, match="threads"):
        measure_peak(0)


def test_report_divides_by_the_measured_peak() -> None:
    row = {"workload": "subm3_fwd", "scene": "tiny-8", "channels": 4, "impl": workloads.LATTICE,
           "status": "ok", "voxels": 8, "median_ms": 1.0, "gflops": 50.0, "threads": 2}
    peak = {"threads": 2, "fp32_isa": "avx2+fma", "fp32_gflops": 200.0, "bf16_gflops": None}
    text = report.markdown({"threads": 2, "checked": True, "peak": peak}, [row])
    assert "fp32 FMA (avx2+fma) 200 GFLOP/s" in text
    line = next(x for x in text.splitlines() if x.startswith("| subm3_fwd | tiny-8 |"))
    assert "| 50.0 | 25% |" in line
    old = report.markdown({"threads": 2, "checked": True}, [row])
    assert "older than the peak probe" in old


def test_report_divides_bf16_rows_by_the_peak_their_kernels_ran_on() -> None:
    row = {"workload": "subm3_fwd_bf16", "scene": "tiny-8", "channels": 4,
           "impl": workloads.LATTICE, "status": "ok", "voxels": 8, "median_ms": 1.0,
           "gflops": 100.0, "threads": 2}
    peak = {"threads": 2, "fp32_isa": "avx512f", "fp32_gflops": 400.0, "bf16_gflops": 200.0,
            "amx_bf16_gflops": 2000.0}
    for kernels, share in (("amx_bf16", "5%"), ("avx512_bf16", "50%")):
        meta = {"threads": 2, "checked": True, "peak": peak, "kernels": kernels}
        text = report.markdown(meta, [row])
        assert "bf16 AMX tiles 2000 GFLOP/s" in text
        line = next(x for x in text.splitlines() if x.startswith("| subm3_fwd_bf16 | tiny-8 |"))
        assert f"| 100.0 | {share} |" in line


def test_gpu_benchmark_rehearses_on_the_cpu(tmp_path: Path) -> None:
    """The device check's benchmark, run on the CPU: every baseline and dataflow is
    checked (output and gradients) and timed, and the report says so."""
    from benchmarks import gpu

    out = tmp_path / "bench.md"
    args = ["--device", "cpu", "--scene", "tiny-10", "--channels", "4",
            "--precisions", "fp32,bf16", "--reps", "1", "--no-unet", "--out", str(out)]
    assert gpu.main(args) == 0
    text = out.read_text()
    for case in ("SubmConv3d k3 C=4", "Conv3d k2s2 C=4", "Conv3d k3s2p1 C=4",
                 "ConvTranspose3d k2s2 inverse C=4", "ConvTranspose3d k2s2 target C=4"):
        for impl in ("torch loop", "torch im2col", "gather_scatter"):
            line = next(x for x in text.splitlines() if f"| {case} | bf16 | {impl} |" in x)
            assert "disagrees" not in line and "FAILED" not in line
    assert "| kernel map | Conv3d k2s2: support | - | lattice |" in text
    assert text.count("| peak | mm 512^3 |") == 4


@pytest.mark.parametrize(
    ("pending", "prec", "previous"),
    [
        ("1", "fp32", {"implicit_gemm": ("pair_weight_grad", "pipelined_fp32"),
                       "fetch_on_demand": ("pipelined_fp32",)}),
        ("pipelined_fp32", "tf32", {}),
        ("1", "tf32", {"implicit_gemm": ("pipelined_forward", "pair_weight_grad"),
                       "fetch_on_demand": ("pipelined_wgrad", "pipelined_fod_forward")}),
        ("1", "fp16", {"implicit_gemm": ("pipelined_forward", "pair_weight_grad"),
                       "fetch_on_demand": ("pipelined_wgrad", "pipelined_fod_forward")}),
        ("pipelined_wgrad", "bf16", {"fetch_on_demand": ("pipelined_wgrad",)}),
        ("pipelined_wgrad", "fp32", {}),
        ("0", "fp16", {}),
    ],
)
def test_gpu_benchmark_times_the_previous_kernels_beside_pending_ones(
    pending: str, prec: str, previous: dict[str, tuple[str, ...]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A "(previous kernel)" row for each dataflow whose pending changes are on at this
    precision, with exactly those changes left off."""
    from benchmarks import gpu
    from torch_lattice.ops import conv_cuda

    monkeypatch.setenv(conv_cuda.PENDING_ENV, pending)
    rows = gpu._layer_variants(prec)
    assert [r for r in rows if r[2] == ()] == [(df, df, ()) for df in gpu.DATAFLOWS]
    got = {df: set(off) for label, df, off in rows if off}
    assert got == {df: set(off) for df, off in previous.items()}
    assert all(label == f"{df} (previous kernel)" for label, df, off in rows if off)


def test_gpu_benchmark_keeps_what_ran_when_interrupted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The device check stops the benchmark at its time limit with SIGINT: the report then
    holds every row that ran, says where it was cut, and the exit status is not 0."""
    from benchmarks import gpu

    def cut(timer, coords, device, channels, precisions, into):
        into.append(gpu.Row("layer", "SubmConv3d k3 C=4", "fp32", "ran first", 1.0, 1.0,
                            1.0, 8.0))
        raise KeyboardInterrupt

    monkeypatch.setattr(gpu, "layer_rows", cut)
    out = tmp_path / "bench.md"
    args = ["--device", "cpu", "--scene", "tiny-10", "--channels", "4", "--precisions", "fp32",
            "--reps", "1", "--groups", "kmap,layers,unet", "--out", str(out)]
    assert gpu.main(args) == 130
    text = out.read_text()
    assert "cut short: interrupted during the layers group" in text.splitlines()[0]
    assert "| kernel map | SubmConv3d k3: nbr | - | lattice |" in text
    assert "| SubmConv3d k3 C=4 | fp32 | ran first |" in text
    assert "ResUNet42" not in text  # the group after the cut did not run


def test_gpu_benchmark_refuses_a_baseline_that_disagrees(monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    from benchmarks import gpu, gpu_layers
    from benchmarks.scenes import tiny_scene

    real = gpu_layers.baselines

    def wrong(case: gpu_layers.LayerCase) -> dict:
        fns = real(case)
        loop = fns["torch im2col"]
        fns["torch im2col"] = lambda x, w: loop(x, w) * 1.01
        return fns

    monkeypatch.setattr(gpu_layers, "baselines", wrong)
    rows = gpu.layer_rows(gpu.Timer("cpu", 1, warm=0), tiny_scene(8).coords, "cpu", [4], ["fp32"])
    bad = [r for r in rows if r.impl == "torch im2col"]
    assert bad and all(r.note == "disagrees: not timed" and r.ms != r.ms for r in bad)
    assert all(r.ms == r.ms for r in rows if r.impl == "torch loop")


def test_gpu_benchmark_network_rows_on_the_cpu() -> None:
    from benchmarks import gpu
    from benchmarks.scenes import tiny_scene

    rows = gpu.unet_rows(gpu.Timer("cpu", 1, warm=0), tiny_scene(24).coords, "cpu", ["fp32"])
    assert {r.case for r in rows} == {"ResUNet42 forward, cached maps",
                                      "ResUNet42 forward, maps built",
                                      "ResUNet42 fwd+bwd, maps built"}
    assert len(rows) == 12 and all(r.ms > 0 for r in rows)
    assert {r.impl for r in rows} == {*gpu.DATAFLOWS, "default"}  # no spconv on a CPU


def test_cpu_targets_report_every_target(tmp_path: Path) -> None:
    """benchmarks.cpu_targets: the issue's targets, each with its threshold and verdict,
    against the peak measured in the same run (times are not asserted)."""
    from benchmarks import cpu_targets

    out = tmp_path / "targets.md"
    assert cpu_targets.main(["--scenes", "tiny", "--repeats", "1", "--widths", "16,64",
                             "--strided-widths", "4", "--odd-widths", "24,32",
                             "--out", str(out)]) == 0
    text = out.read_text()
    assert "fp32 FMA peak measured in this run:" in text
    # each SubmConv3d width's kernels, in GFLOP/s and % of the same peak
    kernels = [line for line in text.splitlines() if line.startswith("| tiny-24 | ")]
    assert [line.split(" | ")[1] for line in kernels] == ["16", "64"]
    assert all(line.count("%)") == len(cpu_targets.KERNELS) for line in kernels)
    rows = [line for line in text.splitlines() if line.startswith("| tiny-24: ")]
    assert any("forward, C = 16 |" in r and "| >= 40% |" in r for r in rows)
    assert any("forward + backward, C = 64 |" in r and "| >= 70% |" in r for r in rows)
    assert any("bf16 forward against fp32, C = 64" in r and "| >= 1.60x |" in r for r in rows)
    assert any("fp16 forward against fp32, C = 64" in r and "| >= 1.00x |" in r for r in rows)
    assert sum("s2" in r for r in rows) == 3  # k2 s2, k3 s2 p1 and the inverse transpose
    # 24 against 32, forward and weight gradient; 32 is a multiple of 16 and is skipped
    odd = [r for r in rows if "against C = 32 (item 2" in r]
    assert len(odd) == 2 and all("C = 24 against" in r and "| >= 1.00x |" in r for r in odd)
    assert all(r.endswith(("| met |", "| not met |")) for r in rows)
    target = cpu_targets.Target("x", 0.7, 0.7, "% of peak")
    assert target.met and target.row() == "| x | 70% | >= 70% | met |"
    # just below a threshold: one more digit, never the threshold itself
    assert cpu_targets.Target("x", 0.6496, 0.65, "% of peak").row() == (
        "| x | 64.9% | >= 65% | not met |")
    assert cpu_targets.Target("x", 0.6449, 0.65, "% of peak").row() == (
        "| x | 64% | >= 65% | not met |")
    assert cpu_targets.Target("r", 0.998, 1.0, "x").row() == "| r | 0.998x | >= 1.00x | not met |"


def test_cpu_targets_plot_draws_each_kernel_against_the_peak(tmp_path: Path) -> None:
    """benchmarks.cpu_targets --plot: every kernel's rate as a fraction of the run's fp32
    peak, the peak itself (100%, with its GFLOP/s) and the thresholds; a whole PNG."""
    from benchmarks import cpu_targets

    points = [cpu_targets.Point("lidar", kernel, c, 0.25 * i)
              for i, kernel in enumerate(cpu_targets.KERNELS) for c in (16, 32)]
    points.append(cpu_targets.Point("lidar", "Conv3d k2 s2 forward", 64, 0.7))
    run = cpu_targets.Run([], 512.0, points)
    path = tmp_path / "targets.png"
    if not _have_matplotlib():
        with pytest.raises(ImportError, match="benchmarks"):
            cpu_targets.plot(run, path, "a run")
        assert not path.exists()
        return
    with _drawn_figures() as figures:
        cpu_targets.plot(run, path, "a run")
        (figure,) = figures
        lines = {ln.get_label(): list(ln.get_ydata()) for ln in figure.axes[0].get_lines()}
    for i, kernel in enumerate(cpu_targets.KERNELS):
        assert lines[f"SubmConv3d {kernel}"] == [25.0 * i, 25.0 * i]
    assert lines["Conv3d k2 s2 forward"] == [70.0]
    assert lines["fp32 FMA peak: 512 GFLOP/s (this run)"] == [100, 100]
    assert lines["target: SubmConv3d forward >= 65% (C = 16: 40%)"] == [65.0, 65.0]
    assert lines["target: forward + backward >= 70%"] == [70.0, 70.0]
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [p.name for p in tmp_path.iterdir()] == ["targets.png"]  # no temporary left
    with pytest.raises(ValueError, match="no kernels"):
        cpu_targets.plot(cpu_targets.Run([], 512.0, []), tmp_path / "empty.png", "none")
    assert not (tmp_path / "empty.png").exists()


def test_weight_gradient_benchmark_checks_then_reports() -> None:
    """benchmarks.wgrad: the weight gradient is checked against its gather-mm reference
    before the two ops are timed; a row reports both rates and their ratio."""
    from benchmarks import wgrad

    (row,) = wgrad.run("tiny", [5], repeats=1)
    assert row["channels"] == 5 and row["err"] < 1e-5
    assert row["wgrad"] > 0 and row["forward"] > 0
    assert row["ratio"] == pytest.approx(row["wgrad"] / row["forward"])


def test_memory_reuse_runs_every_side_beside_a_base_checkout(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """benchmarks.memory_reuse with --base (here this checkout itself): a row per step,
    the base beside the default and reuse sides, each in its own process."""
    from benchmarks import memory_reuse

    argv = ["--scenes", "tiny", "--rounds", "1", "--steps", "1", "--base", str(ROOT)]
    assert memory_reuse.main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("| scene | step | base s | default s | reuse s | base / default")
    rows = [line.split(" | ") for line in lines[2:]]
    assert [(r[0], r[1]) for r in rows] == [("| tiny", "eval"), ("| tiny", "train")]
    assert all(cell.endswith("x") for r in rows for cell in r[5:7])


def test_network_rates_counts_every_kernel_beside_a_base_checkout(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """benchmarks.network_rates with --base (here this checkout itself): for each side a
    row per kind of kernel and one for all, whose calls and GFLOP add up, and a row per
    layer shape; both sides count the same network's work."""
    from benchmarks import network_rates

    argv = ["--scenes", "tiny", "--steps", "1", "--base", str(ROOT), "--layers"]
    assert network_rates.main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    summary = [line.split(" | ") for line in lines if line.startswith("| tiny | train |")]
    assert [(r[2], r[4]) for r in summary] == [
        (side, kind) for side in ("base", "this")
        for kind in ("forward", "input gradient", "weight gradient", "all")]  # fmt: skip
    for side in (summary[:4], summary[4:]):
        assert sum(int(r[5]) for r in side[:3]) == int(side[3][5])
        assert sum(float(r[7]) for r in side[:3]) == pytest.approx(float(side[3][7]), abs=0.2)
        assert float(side[3][7]) > 0 and side[3][9].endswith("% |")
    assert summary[3][5] == summary[7][5] and summary[3][7] == summary[7][7]
    layers = [line for line in lines if line.startswith("| tiny | this |")]
    assert sum(int(line.split(" | ")[7]) for line in layers) == int(summary[7][5])


def test_memory_reuse_refuses_a_base_that_is_not_a_checkout(tmp_path: Path) -> None:
    from benchmarks import memory_reuse

    argv = ["--scenes", "tiny", "--rounds", "1", "--steps", "1", "--base", str(tmp_path)]
    with pytest.raises(SystemExit, match="torch_lattice was imported from"):
        memory_reuse.main(argv)


def test_gpu_benchmark_counts_syncs_and_launches_per_dataflow() -> None:
    """The overhead group: one row per dataflow for a forward and a forward+backward on a
    cached map, with the counted host syncs and kernel launches (zero on a CPU)."""
    from benchmarks import gpu
    from benchmarks.scenes import tiny_scene

    rows = gpu.overhead_rows(tiny_scene(10).coords, "cpu", channels=4)
    assert [(r.impl, r.case.split(",")[0]) for r in rows] == [
        (df, f"SubmConv3d k3 C=4 {what}") for df in gpu.DATAFLOWS
        for what in ("forward", "fwd+bwd")]
    assert all(r.note == "0 host syncs, 0 kernel launches" for r in rows)
    assert torch.is_grad_enabled()


def test_two_builds_time_fetch_on_demand(capsys: pytest.CaptureFixture[str]) -> None:
    """``--kernels pairs_forward pairs_weight_grad``: fetch-on-demand over the map's pair
    lists, both builds' outputs compared first."""
    from benchmarks import builds
    from torch_lattice.ops._runtime import _C

    args = ["--base", _C.__file__, "--scenes", "tiny", "--channels", "4", "--repeats", "1",
            "--groups", "layers", "--kernels", *builds.PAIR_KERNELS]  # fmt: skip
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("sys.argv", ["builds", *args])
        assert builds.main() == 0
    out = capsys.readouterr().out
    assert out.count("| bitwise |") == 2
    assert "| pairs_forward |" in out and "| pairs_weight_grad |" in out


def test_cpu_dataflows_check_then_time(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """benchmarks.cpu_dataflows: every dataflow's output and gradients against implicit
    GEMM's first (fetch-on-demand bitwise), then one row per step; a dataflow that
    computes other numbers stops the run before anything is timed."""
    from benchmarks import cpu_dataflows
    from torch_lattice.nn import functional as F

    cpu_dataflows.run(["tiny"], [4], repeats=1)
    out = capsys.readouterr().out
    assert out.count("| tiny | 4 |") == 2 and out.count("| bitwise / ") == 2
    call = cpu_dataflows.layer_outputs

    def off(conv, x, flow, backward):  # type: ignore[no-untyped-def]
        got = call(conv, x, flow, backward)
        return [t * 1.01 for t in got] if flow is F.Dataflow.GatherScatter else got

    monkeypatch.setattr(cpu_dataflows, "layer_outputs", off)
    monkeypatch.setattr(cpu_dataflows, "time_side_by_side", lambda *a, **k: pytest.fail("timed"))
    with pytest.raises(SystemExit, match="gather_scatter: differs from implicit GEMM"):
        cpu_dataflows.run(["tiny"], [4], repeats=1)


def test_tile_lists_check_then_time(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """benchmarks.tile_lists: every case with and without kept tile lists checked bitwise
    equal first, then one row each; a side that computes other numbers stops the run
    before anything is timed, and the setting is restored after each call."""
    from benchmarks import tile_lists
    from torch_lattice.ops.conv import keep_tile_lists

    tile_lists.run(["tiny"], [4], [0.25], repeats=1)
    out = capsys.readouterr().out
    assert out.count("| tiny SubmConv3d C = 4 ") == 2
    assert out.count("| tiny SparseResUNet42 width 0.25 ") == 2
    assert out.count("| bitwise |") == 4
    tile_lists.run(["tiny"], [4], [], repeats=1, dtype=torch.bfloat16)
    assert capsys.readouterr().out.count("| bitwise |") == 2
    assert keep_tile_lists(True) is True
    sided = tile_lists._sided

    def off(fn, keep):  # type: ignore[no-untyped-def]
        got = sided(fn, keep)
        return [t * 1.01 for t in got] if keep else got

    monkeypatch.setattr(tile_lists, "_sided", off)
    monkeypatch.setattr(tile_lists, "time_side_by_side", lambda *a, **k: pytest.fail("timed"))
    with pytest.raises(SystemExit, match="differs with and without tile lists"):
        tile_lists.run(["tiny"], [4], [], repeats=1)
