"""The support-rule figures of the docs draw what the library computes.

``docs/figures/support_rules.py`` runs each convolution family on a 2-D slice
and draws input and output rows; these tests check that each panel's output
follows its documented rule (so a figure cannot silently show something else)
and that drawing writes complete PNG files.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import torch

DOCS = Path(__file__).resolve().parents[2] / "docs"
_NAME = "tl_docs_support_rules"
spec = importlib.util.spec_from_file_location(_NAME, DOCS / "figures" / "support_rules.py")
assert spec is not None and spec.loader is not None
support_rules = importlib.util.module_from_spec(spec)
sys.modules[_NAME] = support_rules  # dataclasses look their module up there
spec.loader.exec_module(support_rules)


def _rows(t: torch.Tensor) -> list[tuple[int, ...]]:
    return [tuple(r) for r in t.tolist()]


def test_panels_follow_their_support_rules() -> None:
    panels = {p.name: p for p in support_rules.panels()}
    assert set(panels) == {
        "submanifold", "strided", "strided-k3", "transposed", "target", "generative"
    }
    x = support_rules.scene()
    assert all(r[3] == 0 for r in _rows(x.coords))  # a slice: z = 0 only

    subm = panels["submanifold"]
    assert torch.equal(subm.output.coords, subm.input.coords)

    strided = panels["strided"]  # kernel 2, stride 2: every cell holding an input
    expected = sorted({(b, px // 2, py // 2, 0) for b, px, py, _ in _rows(x.coords)})
    assert _rows(strided.output.coords) == expected
    assert strided.output.stride == (2, 2, 1)

    assert len(panels["strided-k3"].output) >= len(strided.output)

    transposed = panels["transposed"]  # back onto the strided conv's input support
    assert torch.equal(transposed.output.coords, x.coords)
    assert transposed.output.stride == (1, 1, 1)

    target = panels["target"]
    assert target.empty_targets is not None and len(target.empty_targets) >= 1
    reached = set(expected)
    assert all(r not in reached for r in _rows(target.empty_targets))
    assert any(r in reached for r in _rows(target.output.coords))

    gen = panels["generative"]  # kernel 3, stride 2, never clipped
    rule = sorted(
        {
            (b, qx * 2 + rx, qy * 2 + ry, 0)
            for b, qx, qy, _ in _rows(gen.input.coords)
            for rx in range(3)
            for ry in range(3)
        }
    )
    assert _rows(gen.output.coords) == rule
    assert max(r[1] for r in rule) >= support_rules.SIZE  # it leaves the input's range


def test_draw_all_writes_png_files(tmp_path: Path) -> None:
    paths = support_rules.draw_all(tmp_path)
    assert len(paths) == 6
    for path in paths:
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in paths)
