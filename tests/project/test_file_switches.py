"""The layout a layer call walks through (issue 22): ``scripts/trace_file_switches.py``.

A cold-cache CPU ``SubmConv3d(16, 32, 3)`` forward is traced and the switches between
files of consecutive ``torch_lattice`` calls are counted.  The count is a property of
the layout (where each step lives), not of speed, so it is asserted: at most 15 (issue
22; 28 before the redesign). The path: module -> functional (the module's geometry was
checked at construction) -> tensor (features, support) -> config -> relation -> the
coordinate manager's cache -> the kmap op (memory budget, native call) -> the conv op
(native call) -> the output tensor.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "trace_file_switches.py"
MAX_FILE_SWITCHES = 15


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("trace_file_switches", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_subm_conv_forward_file_switches() -> None:
    trace = _load().trace_subm_conv_forward()
    # The traced call really built the map: the cold path is what is measured.
    assert ("ops/kmap.py", "build_kernel_map") in trace.calls
    assert trace.switches <= MAX_FILE_SWITCHES, "\n".join(f"{f}: {n}" for f, n in trace.calls)


def test_switches_count_consecutive_calls_in_different_files() -> None:
    trace = _load().Trace((("a.py", "f"), ("a.py", "g"), ("b.py", "h"), ("a.py", "f")))
    assert (trace.files, trace.switches) == (2, 2)
