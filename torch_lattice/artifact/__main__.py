"""``python -m torch_lattice.artifact replay PATH``: replay artifacts without a Mac.

PATH is one artifact directory, or a fixture root whose ``manifest.json`` lists
cases (``{"cases": [{"name", "rtol", "atol"}, ...]}``), each a directory holding
the artifact with its ``inputs.safetensors`` and ``expected.safetensors``.
Exit status 0 when every replayed case matches, 1 otherwise, 2 on bad arguments.

``--coordinates auto`` (the default) reads boundary coordinates as logical for a
manifest whose ``schema`` is torch-lattice 0.5's fixture schema (those artifacts
carry logical coordinates) and as physical (IR v2) otherwise; the choice is printed.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from safetensors import SafetensorError
from safetensors.torch import load_file

from torch_lattice.artifact.conformance import compare_outputs
from torch_lattice.artifact.program import SparseOutput, load_lattice_program

# The manifest schema of torch-lattice 0.5's end-to-end fixtures (logical coordinates).
TORCH_LATTICE_05_FIXTURES = "torch_lattice_e2e_fixtures/v1"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m torch_lattice.artifact")
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("replay", help="replay an artifact (or a manifest's cases) and compare")
    r.add_argument("path", type=Path,
                   help="artifact directory, or a fixture root with manifest.json")
    r.add_argument("--inputs", type=Path,
                   help="inputs .safetensors (default: PATH/inputs.safetensors)")
    r.add_argument("--expected", type=Path,
                   help="expected .safetensors (default: PATH/expected.safetensors if present)")
    r.add_argument("--coordinates", choices=("auto", "physical", "logical"), default="auto",
                   help="boundary coordinate convention; auto: logical for a manifest of "
                   f"schema {TORCH_LATTICE_05_FIXTURES!r} (written by torch-lattice 0.5), "
                   "else physical (IR v2)")
    r.add_argument("--device", default=None, help="torch device (default: cpu)")
    r.add_argument("--rtol", type=float, default=None, help="default: the manifest's, else 1e-5")
    r.add_argument("--atol", type=float, default=None, help="default: the manifest's, else 1e-5")
    return p


def _resolve_coordinates(choice: str, manifest: dict[str, object] | None) -> str:
    if choice != "auto":
        return choice
    if manifest is not None and manifest.get("schema") == TORCH_LATTICE_05_FIXTURES:
        return "logical"
    return "physical"


def _tolerance(given: float | None, case: dict[str, object], key: str) -> float:
    if given is not None:
        return given
    value = case.get(key, 1e-5)
    return float(value) if isinstance(value, (int, float)) else 1e-5


def _replay_one(case_dir: Path, case: dict[str, object], args: argparse.Namespace,
                inputs: Path | None, expected: Path | None) -> bool:
    label = case_dir.name
    inputs = inputs or case_dir / "inputs.safetensors"
    if expected is None and (case_dir / "expected.safetensors").is_file():
        expected = case_dir / "expected.safetensors"
    try:
        program = load_lattice_program(case_dir, coordinates=args.coordinates, device=args.device)
        outputs = program(**load_file(str(inputs)))
    except (OSError, RuntimeError, TypeError, ValueError, SafetensorError) as exc:
        print(f"{label}: ERROR {type(exc).__name__}: {exc}")
        return False
    if expected is None:
        for name, value in outputs.items():
            shape = tuple(value.features.shape if isinstance(value, SparseOutput) else value.shape)
            print(f"{label}: {name} {shape} (no expected outputs to compare)")
        return True
    rtol, atol = _tolerance(args.rtol, case, "rtol"), _tolerance(args.atol, case, "atol")
    try:
        checks = compare_outputs(outputs, load_file(str(expected)), rtol=rtol, atol=atol)
    except (OSError, ValueError, SafetensorError) as exc:  # a malformed expected file
        print(f"{label}: ERROR {type(exc).__name__}: {exc}")
        return False
    for c in checks:
        verdict = "PASS" if c.ok else "FAIL"
        print(f"{label}: {c.name} {verdict} max|err|={c.max_abs_error:.3g} "
              f"(rtol={rtol:g}, atol={atol:g}; {c.detail})")
    return all(c.ok for c in checks)


def _manifest(root: Path) -> dict[str, object]:
    manifest = json.loads((root / "manifest.json").read_text(encoding="utf-8"))
    cases = manifest.get("cases") if isinstance(manifest, dict) else None
    if not isinstance(cases, list) or not all(isinstance(c, dict) and "name" in c for c in cases):
        raise ValueError(f"{root / 'manifest.json'}: needs 'cases': [{{'name': ...}}, ...]")
    return manifest


def _cases(manifest: dict[str, object]) -> list[dict[str, object]]:
    cases = manifest["cases"]
    assert isinstance(cases, list)
    return cases


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    path: Path = args.path
    if (path / "manifest.json").is_file() and not (path / "graph.mlir").exists():
        if args.inputs or args.expected:
            print("--inputs/--expected apply to one artifact, not a manifest", file=sys.stderr)
            return 2
        manifest = _manifest(path)
        args.coordinates = _resolve_coordinates(args.coordinates, manifest)
        cases = _cases(manifest)
        passed = sum(_replay_one(path / str(c["name"]), c, args, None, None) for c in cases)
        print(f"{passed}/{len(cases)} cases match ({args.coordinates} coordinates)")
        return 0 if passed == len(cases) else 1
    case: dict[str, object] = {}
    parent = _manifest(path.parent) if (path.parent / "manifest.json").is_file() else None
    if parent is not None:
        case = next((c for c in _cases(parent) if c["name"] == path.name), {})
    args.coordinates = _resolve_coordinates(args.coordinates, parent)
    ok = _replay_one(path, case, args, args.inputs, args.expected)
    print(f"{'match' if ok else 'MISMATCH'} ({args.coordinates} coordinates)")
    return 0 if ok else 1

if __name__ == "__main__":
    sys.exit(main())
