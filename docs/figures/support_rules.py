"""Figures of the support rules, drawn on a 2-D slice (z = 0).

Every output support shown is computed by torch_lattice itself: the kernels
are ``(k, k, 1)`` and the strides ``(s, s, 1)``, so each convolution stays in
the z = 0 plane and the slice shows the whole support.  Cells are drawn in
physical units: a row ``q`` of a stride-``s`` tensor covers
``[q*s, q*s + s)`` on each axis.

Run by ``docs/conf.py`` at build time; ``python docs/figures/support_rules.py
OUT_DIR`` draws them by hand.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

import torch_lattice as tl
from torch_lattice.atomic_file import atomic_write

SIZE = 12  # the slice is SIZE x SIZE fine cells

INPUT_COLOUR = "#b9b9b9"
OUTPUT_COLOUR = "#1f77b4"
TARGET_EMPTY_COLOUR = "#d62728"


def scene() -> tl.SparseTensor:
    """A broken ring and a small blob on the fine lattice: one batch, z = 0, stride 1."""
    rows = []
    for x in range(SIZE):
        for y in range(SIZE):
            r2 = (x - 5.0) ** 2 + (y - 5.5) ** 2
            on_ring = 9 <= r2 <= 19 and not (x > 5 and y < 4)
            on_blob = 9 <= x <= 10 and 0 <= y <= 1
            if on_ring or on_blob:
                rows.append([0, x, y, 0])
    coords = torch.tensor(rows, dtype=torch.int32)
    return tl.SparseTensor(torch.ones(len(rows), 1), coords, spatial_range=(1, SIZE, SIZE, 1))


def planar(k: int) -> tuple[int, int, int]:
    return (k, k, 1)


@dataclass(frozen=True)
class Panel:
    """One figure: the input, the output the library computed, and the story."""

    name: str
    title: str
    input: tl.SparseTensor
    output: tl.SparseTensor
    caption: str
    empty_targets: torch.Tensor | None = None  # target rows that no input reaches


def panels() -> list[Panel]:
    """Runs each convolution family on the scene and keeps its output."""
    torch.manual_seed(0)
    x = scene()
    subm = tl.nn.SubmConv3d(1, 1, kernel_size=planar(3))
    down = tl.nn.Conv3d(1, 1, kernel_size=planar(2), stride=planar(2))
    down3 = tl.nn.Conv3d(1, 1, kernel_size=planar(3), stride=planar(2))
    up = tl.nn.ConvTranspose3d(1, 1, kernel_size=planar(2), stride=planar(2))
    gen = tl.nn.GenerativeConvTranspose3d(1, 1, kernel_size=planar(3), stride=planar(2))
    with torch.no_grad():
        d = down(x)
        d3 = down3(x)
        # Two rows the input reaches and two it does not, in no sorted order.
        target_rows = torch.tensor([[0, 5, 5, 0], [0, 1, 1, 0], [0, 2, 1, 0], [0, 4, 0, 0]])
        target = tl.SparseTensor(torch.zeros(4, 1), target_rows.int(), stride=planar(2))
        t = down(x, coordinates=target)
        reached = {tuple(r) for r in d.coords.tolist()}
        empty = torch.tensor([r for r in t.coords.tolist() if tuple(r) not in reached])
        empty = empty.reshape(-1, 4)
        return [
            Panel("submanifold", "SubmConv3d, kernel 3", x, subm(x),
                  "output rows = input rows, same order"),
            Panel("strided", "Conv3d, kernel 2, stride 2", x, d,
                  "every stride-2 cell that some input reaches"),
            Panel("strided-k3", "Conv3d, kernel 3, stride 2", x, d3,
                  "a wider kernel reaches more stride-2 cells"),
            Panel("transposed", "ConvTranspose3d(d), kernel 2, stride 2", d, up(d),
                  "back onto the input support of the Conv3d that made d"),
            Panel("target", "Conv3d(x, coordinates=target)", x, t,
                  "exactly the target's rows; red: no input reaches it (bias only)", empty),
            Panel("generative", "GenerativeConvTranspose3d, kernel 3, stride 2", d, gen(d),
                  "every src*2 + r, never clipped (dotted: the input range)"),
        ]


def _cells(ax: object, t: tl.SparseTensor | torch.Tensor, stride: int, **style: object) -> None:
    from matplotlib.patches import Rectangle

    coords = t.coords if isinstance(t, tl.SparseTensor) else t
    for _, x, y, _z in coords.tolist():
        ax.add_patch(Rectangle((x * stride, y * stride), stride, stride, **style))  # type: ignore[attr-defined]


def draw(panel: Panel, path: Path) -> None:
    """Draws one panel to ``path`` (PNG), atomically."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt
    from matplotlib.patches import Patch

    s_in, s_out = panel.input.stride[0], panel.output.stride[0]
    fig, ax = plt.subplots(figsize=(4.2, 5.2), dpi=110)
    try:
        extent = max(SIZE, *(int(v) * s_out + s_out for v in panel.output.coords[:, 1:3].flatten()))
        ax.set_xlim(0, extent)
        ax.set_ylim(0, extent)
        ax.set_xticks(range(0, extent + 1, 2))
        ax.set_yticks(range(0, extent + 1, 2))
        ax.grid(True, color="#e6e6e6", linewidth=0.6)
        ax.set_axisbelow(True)
        ax.set_aspect("equal")
        _cells(ax, panel.input, s_in, facecolor=INPUT_COLOUR, edgecolor="white", linewidth=0.8)
        _cells(ax, panel.output, s_out, facecolor=OUTPUT_COLOUR, alpha=0.35,
               edgecolor=OUTPUT_COLOUR, linewidth=1.2)
        handles = [
            Patch(facecolor=INPUT_COLOUR, label=f"input rows (stride {s_in})"),
            Patch(facecolor=OUTPUT_COLOUR, alpha=0.35, edgecolor=OUTPUT_COLOUR,
                  label=f"output rows (stride {s_out}): {len(panel.output)}"),
        ]
        if panel.empty_targets is not None:
            _cells(ax, panel.empty_targets, s_out, facecolor="none",
                   edgecolor=TARGET_EMPTY_COLOUR, linewidth=2.0, hatch="//")
            handles.append(Patch(facecolor="none", edgecolor=TARGET_EMPTY_COLOUR, hatch="//",
                                 label="target row that no input reaches"))
            # The output keeps the target's order: number its rows.
            for i, (_, qx, qy, _z) in enumerate(panel.output.coords.tolist()):
                ax.text((qx + 0.5) * s_out, (qy + 0.5) * s_out, str(i), ha="center",
                        va="center", fontsize=9, weight="bold")
        if SIZE < extent:
            ax.axvline(SIZE, color="#555555", linestyle=":", linewidth=1)
            ax.axhline(SIZE, color="#555555", linestyle=":", linewidth=1)
        ax.set_title(f"{panel.title}\n{panel.caption}", fontsize=9)
        ax.set_xlabel("x (fine cells)", fontsize=8)
        ax.set_ylabel("y (fine cells)", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.13), fontsize=7,
                  ncol=1, frameon=False)
        fig.tight_layout()
        atomic_write(path, lambda temp: fig.savefig(temp, format="png"))
    finally:
        plt.close(fig)


def draw_all(folder: Path, draw_one: Callable[[Panel, Path], None] = draw) -> list[Path]:
    """Draws every panel into ``folder`` as ``<name>.png``; returns the paths."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for panel in panels():
        path = folder / f"{panel.name}.png"
        draw_one(panel, path)
        paths.append(path)
    return paths


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: python docs/figures/support_rules.py OUT_DIR")
    for p in draw_all(Path(sys.argv[1])):
        print(p)
