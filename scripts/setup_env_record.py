"""What scripts/setup-env.sh installed into its venv, and whether that is still there.

The scripts' venv (./.venv) is also the folder `uv run` and `uv sync` use, and uv installs
torch from uv.lock (on Linux, a CUDA build of several GB) over the one the scripts chose.
setup-env.sh therefore records the torch it installed, and before using the venv again
asks this file whether the venv's torch is still that one; when it is not, the set-up
stops, changes nothing and prints the command that restores the environment (issue 25).

Runs with the venv's interpreter and the standard library only (torch is imported in a
child process, so a broken torch is reported, not raised):

    python scripts/setup_env_record.py write --record R --requirement "torch==2.13.0"
    python scripts/setup_env_record.py check --record R --requirement "torch==2.13.0"

``check`` exits 0 when the venv's torch is the recorded one and the requirement is the
recorded one or met by it (or, with no record yet, when the torch meets the requirement),
and 3 with a message on stderr otherwise: with the command that restores the recorded
torch when something replaced it, with the command that starts afresh when the
requirement (TORCH_LATTICE_TORCH) changed.  Setting TORCH_LATTICE_ACCEPT_TORCH=1 accepts
a replaced torch and records it instead.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import subprocess
import sys
from pathlib import Path

EXIT_REPLACED = 3
_PROBE = "import json, torch; print(json.dumps([torch.__version__, torch.version.cuda]))"


def installed_torch(python: str) -> tuple[str, str | None] | None:
    """(version, CUDA version or None) of the torch `python` imports; None without one."""
    probe = subprocess.run([python, "-c", _PROBE], capture_output=True, text=True)
    if probe.returncode != 0:
        return None
    version, cuda = json.loads(probe.stdout.strip().splitlines()[-1])
    return str(version), (str(cuda) if cuda else None)


def _release(version: str) -> tuple[int, ...]:
    """The release numbers of a version: "2.13.0+cpu" -> (2, 13, 0)."""
    match = re.match(r"\d+(\.\d+)*", version)
    return tuple(int(p) for p in match.group(0).split(".")) if match else ()


def meets(requirement: str, version: str) -> bool | None:
    """Whether `version` meets a pip requirement pinned with ==, as setup-env.sh's default
    "torch==2.13.0" (a local label such as +cpu is ignored, as in PEP 440).  None when the
    requirement is not a plain pin, which this file does not judge."""
    match = re.fullmatch(r"\s*torch\s*==\s*([0-9][0-9.]*)\s*", requirement)
    if match is None:
        return None
    want = _release(match.group(1))
    have = _release(version)
    width = max(len(want), len(have))
    return want + (0,) * (width - len(want)) == have + (0,) * (width - len(have))


def _describe(version: str, cuda: str | None) -> str:
    return f"torch {version} ({f'CUDA {cuda} build' if cuda else 'CPU build'})"


def write(record: Path, requirement: str, python: str) -> int:
    found = installed_torch(python)
    if found is None:
        print(f"[setup] no importable torch in {python}; nothing recorded", file=sys.stderr)
        return 1
    version, cuda = found
    entry = {
        "written_by": "scripts/setup-env.sh",
        "requirement": requirement,
        "torch": version,
        "torch_cuda": cuda,
        "python": python,
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    }
    record.write_text(json.dumps(entry, indent=2) + "\n")
    return 0


def restore_command(venv: str) -> str:
    """The command that rebuilds the scripts' environment from scratch."""
    prefix = "" if venv == ".venv" else f"TORCH_LATTICE_VENV={venv} "
    return f"rm -rf {venv} && {prefix}scripts/setup-env.sh"


def _refuse(venv: str, lines: list[str]) -> int:
    accept_prefix = "" if venv == ".venv" else f"TORCH_LATTICE_VENV={venv} "
    body = [
        f"STOP: the torch in {venv} is not the one scripts/setup-env.sh installed.",
        *lines,
        f"Something else installed torch into {venv}: `uv run` and `uv sync` do that, from",
        "uv.lock (README, 'The scripts or uv'). Nothing was changed.",
        "To restore the environment the scripts set up, run:",
        f"    {restore_command(venv)}",
        f"To keep the torch now in {venv} and record it instead:",
        f"    TORCH_LATTICE_ACCEPT_TORCH=1 {accept_prefix}scripts/setup-env.sh",
    ]
    print("\n".join(f"[setup] {line}" for line in body), file=sys.stderr)
    return EXIT_REPLACED


def _other_requirement(
    venv: str, requirement: str, version: str, cuda: str | None, entry: dict[str, str]
) -> int:
    """TORCH_LATTICE_TORCH names another torch than the venv's: the set-up installs torch
    only into a new venv, so say how to make one instead of carrying on with the old."""
    prefix = "" if venv == ".venv" else f"TORCH_LATTICE_VENV={venv} "
    lines = [
        f"STOP: the requirement {requirement} (TORCH_LATTICE_TORCH) does not match the",
        f"  {_describe(version, cuda)} that scripts/setup-env.sh installed into {venv}",
        f"  for {entry.get('requirement')}. Nothing was changed. For {requirement}, start afresh:",
        f"    rm -rf {venv} && {prefix}TORCH_LATTICE_TORCH='{requirement}' scripts/setup-env.sh",
    ]
    print("\n".join(f"[setup] {line}" for line in lines), file=sys.stderr)
    return EXIT_REPLACED


def check(record: Path, requirement: str, python: str, venv: str = ".venv") -> int:
    found = installed_torch(python)
    if found is None:
        return 0  # setup-env.sh installs torch next (the recorded requirement)
    version, cuda = found
    accept = os.environ.get("TORCH_LATTICE_ACCEPT_TORCH") == "1"
    if not record.is_file():
        if meets(requirement, version) is False and not accept:
            return _refuse(
                venv,
                [
                    f"  {venv} holds {_describe(version, cuda)}, which scripts/setup-env.sh did",
                    f"  not install and which does not meet its requirement {requirement}.",
                ]
            )
        return write(record, requirement, python)
    entry = json.loads(record.read_text())
    if entry.get("torch") == version:
        # An accepted torch need not meet the requirement it was accepted under.
        if entry.get("requirement") != requirement and meets(requirement, version) is False:
            return _other_requirement(venv, requirement, version, cuda, entry)
        return 0
    if accept:
        print(f"[setup] accepting {_describe(version, cuda)} (TORCH_LATTICE_ACCEPT_TORCH=1)")
        return write(record, requirement, python)
    return _refuse(
        venv,
        [
            f"  scripts/setup-env.sh installed {_describe(entry['torch'], entry.get('torch_cuda'))}"
            f" ({entry.get('requirement')}, {entry.get('date')});",
            f"  {venv} now holds {_describe(version, cuda)}.",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=["write", "check"])
    parser.add_argument("--record", type=Path, required=True)
    parser.add_argument("--requirement", required=True)
    parser.add_argument("--python", default=sys.executable, help="the venv's interpreter")
    parser.add_argument("--venv", default=".venv", help="the venv's folder, for messages")
    args = parser.parse_args(argv)
    if args.action == "write":
        return write(args.record, args.requirement, args.python)
    return check(args.record, args.requirement, args.python, args.venv)


if __name__ == "__main__":
    sys.exit(main())
