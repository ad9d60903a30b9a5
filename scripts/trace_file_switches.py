"""How many Python calls, files and file switches one layer call walks through.

Traces (``sys.setprofile``) a cold-cache CPU ``SubmConv3d(16, 32, 3)`` forward on a
small random SparseTensor: the module and the tensor are made before tracing, and the
tensor is new, so its coordinate manager builds the kernel map inside the traced call.
Counted are the Python function calls whose code lives in a file under
``torch_lattice/`` (a comprehension or generator expression counts as part of the
function it is written in), and the switches: consecutive counted calls in different files.
A switch is a hop a reader takes between files to follow the call, so the count is a
property of the layout (issue 22 asks for at most 15), not of speed.

    .venv/bin/python scripts/trace_file_switches.py [--verbose]
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from types import FrameType
from typing import Any


@dataclass(frozen=True)
class Trace:
    """The counted calls of one traced forward, in call order: ``(file, function)``."""

    calls: tuple[tuple[str, str], ...]

    @property
    def files(self) -> int:
        """Distinct files the calls ran in."""
        return len({f for f, _ in self.calls})

    @property
    def switches(self) -> int:
        """Consecutive calls in different files."""
        return sum(a[0] != b[0] for a, b in pairwise(self.calls))


def trace_subm_conv_forward(rows: int = 64, seed: int = 0) -> Trace:
    """Traces one cold-cache CPU ``SubmConv3d(16, 32, 3)`` forward (see the module doc)."""
    import torch

    import torch_lattice as tl

    root = Path(tl.__file__).resolve().parent
    gen = torch.Generator().manual_seed(seed)

    def fresh() -> tl.SparseTensor:
        flat = torch.randperm(16**3, generator=gen)[:rows]
        coords = torch.stack(
            [torch.zeros_like(flat), flat // 256, flat // 16 % 16, flat % 16], dim=1
        )
        return tl.SparseTensor(torch.randn(rows, 16, generator=gen), coords.int())

    layer = tl.nn.SubmConv3d(16, 32, 3)
    layer(fresh())  # first use: op registration and lazy imports stay out of the count
    x = fresh()
    names: dict[str, str | None] = {}
    calls: list[tuple[str, str]] = []

    def inside(filename: str) -> str | None:
        if filename not in names:
            path = Path(filename).resolve()
            names[filename] = str(path.relative_to(root)) if path.is_relative_to(root) else None
        return names[filename]

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        code = frame.f_code
        # A comprehension or generator expression is part of the function it is written in.
        if event == "call" and not code.co_name.startswith("<"):
            name = inside(code.co_filename)
            if name is not None:
                calls.append((name, getattr(code, "co_qualname", code.co_name)))

    previous = sys.getprofile()  # a profiler or coverage tool running the caller
    sys.setprofile(profile)
    try:
        layer(x)
    finally:
        sys.setprofile(previous)
    return Trace(tuple(calls))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--verbose", action="store_true", help="print the call sequence")
    args = parser.parse_args(argv)
    trace = trace_subm_conv_forward()
    if args.verbose:
        for file, function in trace.calls:
            print(f"{file}: {function}")
    print(f"calls {len(trace.calls)}, files {trace.files}, file switches {trace.switches}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
