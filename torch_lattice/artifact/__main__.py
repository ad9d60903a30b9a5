"""``python -m torch_lattice.artifact replay PATH``: replay artifacts without a Mac.

PATH is one artifact directory, or a fixture root whose ``manifest.json`` lists
cases (``{"cases": [{"name", "rtol", "atol"}, ...]}``), each a directory holding
the artifact with its ``inputs.safetensors`` and ``expected.safetensors``;
``--case NAME`` (repeatable) replays only the named cases of a fixture root.
One artifact that is a case of a fixture root (``replay ROOT/CASE``) takes that case's
tolerances and coordinate convention from ``ROOT/manifest.json``, as ``replay ROOT --case
CASE`` does; a ``manifest.json`` beside an artifact that is a link, not a fixture
manifest or lists no case of that name is left alone (default tolerances, physical
coordinates).
Exit status 0 when every replayed case matches, 1 otherwise (a case that fails to
load or replay, or whose expected file is missing or not a regular file, counts as a
mismatch), 2 on bad arguments (PATH missing or not a folder included) or a refused
manifest, reported as one ``error:`` line; 130 when Ctrl-C (SIGINT) stops it, also one line.

What is refused, and why (docs/limits.md): a case name must be one plain folder name
inside the fixture folder (no separators, ``.``/``..``, absolute paths, control
characters; the folder must not be a symbolic link), so a manifest cannot reach
folders the user never named; only regular files are read (a FIFO would hang the
replay, a device never ends), each size-checked against the memory budget before it
is read; tolerances must be finite numbers >= 0 (NaN fails every comparison,
infinity passes every one); a manifest object must not repeat a key (JSON would keep
the last). Refusals never list a folder's contents.

``--coordinates auto`` (the default) reads boundary coordinates as logical for a
manifest whose ``schema`` is torch-lattice 0.5's fixture schema (those artifacts
carry logical coordinates) and as physical (IR v2) otherwise; the choice is printed.
"""

from __future__ import annotations

import argparse
import math
import os
import stat
import sys
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load as safetensors_load

from torch_lattice.artifact.conformance import compare_outputs
from torch_lattice.artifact.program import SparseOutput, check_device, load_lattice_program
from torch_lattice.regular_file import describe_file_type, parse_json, read_regular_file

# The manifest schema of torch-lattice 0.5's end-to-end fixtures (logical coordinates).
TORCH_LATTICE_05_FIXTURES = "torch_lattice_e2e_fixtures/v1"
MANIFEST_FILE = "manifest.json"
EXPECTED_FILE = "expected.safetensors"
DEFAULT_TOLERANCE = 1e-5
MAX_MANIFEST_BYTES = 16 * 2**20  # a manifest lists cases; megabytes of it are an attack
MAX_TENSOR_FILE_BYTES = 2**40  # the memory budget is the real bound (see memory_budget)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m torch_lattice.artifact")
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("replay", help="replay an artifact (or a manifest's cases) and compare")
    r.add_argument("path", type=Path,
                   help="artifact directory, or a fixture root with manifest.json")
    r.add_argument("--inputs", type=Path,
                   help="inputs .safetensors (default: PATH/inputs.safetensors)")
    r.add_argument("--expected", type=Path,
                   help="expected .safetensors (default: PATH/expected.safetensors, which "
                   "must exist unless --no-compare is given)")
    r.add_argument("--case", action="append", metavar="NAME",
                   help="with a fixture root: replay only this manifest case (repeatable)")
    r.add_argument("--no-compare", action="store_true",
                   help="only replay and print the output shapes (no expected outputs)")
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
    """The case's (or the command line's) tolerance: a finite number >= 0, else refused."""
    if given is not None:
        value: object = given
        where = f"--{key}"
    else:
        value = case.get(key, DEFAULT_TOLERANCE)
        where = f"manifest case {case.get('name')!r} {key}"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{where} must be a number, got {value!r}")
    if isinstance(value, int) and abs(value) > 2**53:  # beyond float: not a tolerance
        raise ValueError(f"{where} must be finite and >= 0, got an integer of "
                         f"{value.bit_length()} bits")
    if not math.isfinite(value) or value < 0:
        # NaN or a negative tolerance fails every comparison; infinity passes every one.
        raise ValueError(f"{where} must be finite and >= 0, got {value!r}")
    return float(value)


def _load_tensors(path: Path, what: str) -> dict[str, torch.Tensor]:
    """A safetensors file, read only if it is a regular file within the size limits."""
    data = read_regular_file(path, what, max_bytes=MAX_TENSOR_FILE_BYTES)
    try:
        return safetensors_load(data)
    except SafetensorError as exc:
        raise ValueError(f"{what} {str(path)!r} is not a readable safetensors file: {exc}"
                         ) from None


def _expected_path(case_dir: Path, given: Path | None, compare: bool) -> Path | None:
    """The expected-outputs file; a case must have one unless --no-compare is given."""
    if given is not None or not compare:
        return given
    return case_dir / EXPECTED_FILE


def _replay_one(case_dir: Path, case: dict[str, object], args: argparse.Namespace,
                inputs: Path | None, expected: Path | None) -> bool:
    label = case_dir.name
    rtol, atol = _tolerance(args.rtol, case, "rtol"), _tolerance(args.atol, case, "atol")
    inputs = inputs or case_dir / "inputs.safetensors"
    expected = _expected_path(case_dir, expected, not args.no_compare)
    try:
        program = load_lattice_program(case_dir, coordinates=args.coordinates, device=args.device)
        outputs = program(**_load_tensors(inputs, "inputs"))
    except (OSError, RuntimeError, TypeError, ValueError) as exc:
        print(f"{label}: ERROR {type(exc).__name__}: {exc}")
        return False
    if expected is None:
        for name, value in outputs.items():
            shape = tuple(value.features.shape if isinstance(value, SparseOutput) else value.shape)
            print(f"{label}: {name} {shape} (replayed; --no-compare)")
        return True
    try:
        # A missing or non-regular expected file is a failure: nothing was compared.
        checks = compare_outputs(outputs, _load_tensors(expected, "expected outputs"),
                                 rtol=rtol, atol=atol)
    except (OSError, ValueError) as exc:
        print(f"{label}: FAIL {type(exc).__name__}: {exc}")
        return False
    for c in checks:
        verdict = "PASS" if c.ok else "FAIL"
        print(f"{label}: {c.name} {verdict} max|err|={c.max_abs_error:.3g} "
              f"(rtol={rtol:g}, atol={atol:g}; {c.detail})")
    return bool(checks) and all(c.ok for c in checks)


def _manifest(root: Path) -> dict[str, object]:
    where = root / MANIFEST_FILE
    # Inside the fixture folder: a link could lead anywhere, so it is refused.
    text = read_regular_file(where, "manifest", max_bytes=MAX_MANIFEST_BYTES,
                             follow_symlinks=False)
    manifest = parse_json(text, repr(str(where)), "is not UTF-8 JSON")
    cases = manifest.get("cases") if isinstance(manifest, dict) else None
    if not isinstance(cases, list) or not all(isinstance(c, dict) and "name" in c for c in cases):
        raise ValueError(f"{str(where)!r}: needs 'cases': [{{'name': ...}}, ...]")
    for c in cases:
        check_case_name(c["name"], where)
        for key in ("rtol", "atol"):
            if key in c:
                _tolerance(None, c, key)
    return manifest


def _fixture_case(path: Path) -> tuple[dict[str, object] | None, dict[str, object]]:
    """The fixture manifest beside one artifact and its case for it, where PATH is a case
    of a fixture root (``replay ROOT/CASE`` takes that case's tolerances and coordinate
    convention, as the recorded fixtures' README says); else ``(None, {})``.

    A ``manifest.json`` beside an artifact may be anyone's (a web folder's), so it is
    used only when it is a regular file (not a link), is a fixture manifest and lists
    a case of PATH's name; anything else there is left alone, never an error (_manifest
    refuses a link, a FIFO or a missing file without blocking, as a ValueError)."""
    try:
        manifest = _manifest(path.parent)
    except ValueError:
        return None, {}
    case = next((c for c in _cases(manifest) if c["name"] == path.name), None)
    return (manifest, case) if case is not None else (None, {})


def check_case_name(name: object, manifest: Path) -> str:
    """A manifest case name is one plain folder name inside the fixture root.

    Separators, ``.``/``..``, absolute paths and control characters would let a
    manifest reach (and make the loader describe) folders the user never named.
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"{str(manifest)!r}: case name must be a non-empty string, got "
                         f"{name!r}")
    bad = (name in (".", "..") or os.path.isabs(name) or "/" in name or "\\" in name
           or any(ord(ch) < 32 or ord(ch) == 127 for ch in name))
    if bad:
        raise ValueError(f"{str(manifest)!r}: case name {name!r} must be a plain folder name "
                         "inside the fixture folder (no path separators, '.', '..', absolute "
                         "paths or control characters)")
    return name


def _case_dir(root: Path, name: str) -> Path:
    """``root / name``, refused when it is a link (it could lead outside ``root``)."""
    case_dir = root / name
    if case_dir.is_symlink():
        raise ValueError(f"case {name!r}: {str(case_dir)!r} is a symbolic link; a case folder "
                         "must be a real folder inside the fixture folder")
    if case_dir.resolve().parent != root.resolve():
        raise ValueError(f"case {name!r} is not a folder directly inside {str(root)!r}")
    return case_dir


def _cases(manifest: dict[str, object]) -> list[dict[str, object]]:
    cases = manifest["cases"]
    assert isinstance(cases, list)
    return cases


def _selected_cases(manifest: dict[str, object], wanted: list[str] | None,
                    where: Path) -> list[dict[str, object]]:
    """The manifest's cases, or only those ``--case`` names (each must be listed)."""
    cases = _cases(manifest)
    if wanted is None:
        return cases
    by_name = {str(c["name"]): c for c in cases}
    for name in wanted:
        check_case_name(name, where)
        if name not in by_name:
            raise ValueError(f"--case {name!r} is not a case of {str(where)!r}")
    return [by_name[name] for name in dict.fromkeys(wanted)]


def _replay_manifest(path: Path, args: argparse.Namespace) -> int:
    if args.inputs or args.expected:
        raise ValueError("--inputs/--expected apply to one artifact, not a manifest")
    manifest = _manifest(path)
    args.coordinates = _resolve_coordinates(args.coordinates, manifest)
    cases = _selected_cases(manifest, args.case, path / MANIFEST_FILE)
    passed = 0
    for c in cases:
        try:
            case_dir = _case_dir(path, str(c["name"]))
        except ValueError as exc:
            print(f"{c['name']}: ERROR ValueError: {exc}")
            continue
        passed += _replay_one(case_dir, c, args, None, None)
    print(f"{passed}/{len(cases)} cases match ({args.coordinates} coordinates)")
    return 0 if passed == len(cases) and cases else 1


def _run(args: argparse.Namespace) -> int:
    path: Path = args.path
    # A device this torch cannot use is a bad argument (exit 2), not a failing case.
    check_device(args.device, "--device")
    # So is a PATH that is not there, or not a folder: nothing could be replayed.
    if not path.exists():
        raise ValueError(f"PATH {str(path)!r} does not exist; name an artifact directory "
                         f"or a fixture root with {MANIFEST_FILE}")
    if not path.is_dir():
        mode = path.stat().st_mode
        kind = "a file" if stat.S_ISREG(mode) else describe_file_type(mode)
        raise ValueError(f"PATH {str(path)!r} is {kind}, not a folder; name an artifact "
                         f"directory or a fixture root with {MANIFEST_FILE}")
    if (path / MANIFEST_FILE).exists() and not (path / "graph.mlir").exists():
        return _replay_manifest(path, args)
    if args.case:
        raise ValueError("--case selects cases of a fixture root (a folder with "
                         f"{MANIFEST_FILE}); {str(path)!r} is one artifact")
    parent, case = _fixture_case(path)
    args.coordinates = _resolve_coordinates(args.coordinates, parent)
    for flag, value in (("--inputs", args.inputs), ("--expected", args.expected)):
        # Paths the user named: refused outright (exit 2) unless regular files.
        if value is None:
            continue
        if not value.exists():
            raise ValueError(f"{flag} {str(value)!r} does not exist")
        mode = value.stat().st_mode
        if not stat.S_ISREG(mode):
            raise ValueError(f"{flag} {str(value)!r} is {describe_file_type(mode)}; only "
                             "regular files are read")
    for key in ("rtol", "atol"):
        _tolerance(getattr(args, key), case, key)
    ok = _replay_one(path, case, args, args.inputs, args.expected)
    print(f"{'match' if ok else 'MISMATCH'} ({args.coordinates} coordinates)")
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    """Runs the command; returns the exit status (see the module docstring)."""
    args = _parser().parse_args(argv)
    try:
        return _run(args)
    except (TypeError, ValueError) as exc:  # a refused argument, manifest or file
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # replay writes nothing: one line, not a traceback
        print("error: interrupted (Ctrl-C)", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
