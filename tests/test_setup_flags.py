"""The compiler and linker command lines setup.py produces (issue 13).

setup.py's build_ext runs with CC and LDSHARED pointing at a stand-in compiler
that records its arguments and writes an empty output file, so each case takes
about a second and compiles nothing.  The user's CFLAGS/LDFLAGS must come
after setup.py's own flags (the last -O wins), and TORCH_LATTICE_SANITIZE=1
must add the sanitizer flags and leave CUDA out.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

FAKE_CC = """\
import json, os, sys
args = sys.argv[1:]
with open(os.environ["TL_FAKE_CC_LOG"], "a") as log:
    log.write(json.dumps(args) + "\\n")
if "-o" in args:
    out = args[args.index("-o") + 1]
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    open(out, "wb").close()
"""


def _commands(tmp_path: Path, **env: str) -> tuple[subprocess.CompletedProcess, list[list[str]]]:
    """Runs setup.py build_ext with the stand-in compiler; returns the result and
    every recorded command line (arguments after the program name)."""
    fake = tmp_path / "fake_cc.py"
    fake.write_text(FAKE_CC)
    log = tmp_path / "cc.log"
    full_env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("CFLAGS", "LDFLAGS", "CPPFLAGS", "TORCH_LATTICE_SANITIZE")
    }
    cc = f"{sys.executable} {fake}"
    full_env.update(CC=cc, LDSHARED=f"{cc} -shared", TL_FAKE_CC_LOG=str(log))
    full_env.update(env)
    build = tmp_path / "build"
    result = subprocess.run(
        [sys.executable, "setup.py", "-q", "build_ext", "-b", str(build), "-t", str(build)],
        cwd=ROOT,
        env=full_env,
        capture_output=True,
        text=True,
    )
    lines = log.read_text().splitlines() if log.exists() else []
    return result, [json.loads(line) for line in lines]


def _split(cmds: list[list[str]]) -> tuple[list[list[str]], list[list[str]]]:
    compiles = [c for c in cmds if "-c" in c]
    links = [c for c in cmds if "-shared" in c]
    return compiles, links


def _last_opt(cmd: list[str]) -> str:
    return [a for a in cmd if a.startswith("-O")][-1]


def test_user_cflags_and_ldflags_come_last(tmp_path: Path) -> None:
    result, cmds = _commands(
        tmp_path,
        TORCH_LATTICE_CUDA="0",
        CFLAGS="-O0 -DTL_USER_FLAG=1",
        LDFLAGS="-Wl,--tl-user-flag",
    )
    assert result.returncode == 0, result.stderr
    compiles, links = _split(cmds)
    assert len(compiles) >= 10 and len(links) == 1, cmds
    for cmd in compiles:
        assert _last_opt(cmd) == "-O0", cmd
        # setup.py's own flags are present, and the user's come after all of them.
        assert "-O3" in cmd and "-Werror" in cmd
        assert cmd.index("-DTL_USER_FLAG=1", cmd.index("-fvisibility=hidden")) > 0
    link = links[0]
    assert link.index("-Wl,--tl-user-flag", link.index("-Wl,--exclude-libs,ALL")) > 0


def test_sanitize_build_flags(tmp_path: Path) -> None:
    result, cmds = _commands(tmp_path, TORCH_LATTICE_SANITIZE="1", TORCH_LATTICE_CUDA="auto")
    assert result.returncode == 0, result.stderr
    compiles, links = _split(cmds)
    assert compiles and len(links) == 1
    for cmd in compiles:
        assert cmd[0] != "nvcc" and not any(a.endswith(".cu") for a in cmd), cmd
        for flag in (
            "-fsanitize=address,undefined",
            "-fsanitize=float-cast-overflow",
            "-fno-sanitize-recover=undefined,float-cast-overflow",
            "-fno-omit-frame-pointer",
            "-g",
        ):
            assert flag in cmd, (flag, cmd)
        assert _last_opt(cmd) == "-O1", cmd
        assert "-DTL_WITH_CUDA=1" not in cmd
    assert "-fsanitize=address,undefined" in links[0]
    assert not any("cudart" in a for a in links[0])
    # The user's CFLAGS still win over the sanitizer build's -O1.
    (tmp_path / "o0").mkdir()
    result, cmds = _commands(tmp_path / "o0", TORCH_LATTICE_SANITIZE="1", CFLAGS="-O0")
    assert result.returncode == 0, result.stderr
    assert all(_last_opt(c) == "-O0" for c in _split(cmds)[0])


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"TORCH_LATTICE_SANITIZE": "1", "TORCH_LATTICE_CUDA": "1"}, "TORCH_LATTICE_SANITIZE=1"),
        ({"TORCH_LATTICE_SANITIZE": "yes"}, "TORCH_LATTICE_SANITIZE must be 0 or 1"),
    ],
)
def test_sanitize_refuses_bad_settings(tmp_path: Path, env: dict[str, str], message: str) -> None:
    result, _ = _commands(tmp_path, **env)
    assert result.returncode != 0
    assert message in result.stderr + result.stdout


def test_build_prints_one_counted_line_per_source(tmp_path: Path) -> None:
    """A person watching the build sees each C source as it starts, with a counter."""
    result, cmds = _commands(tmp_path, TORCH_LATTICE_CUDA="0")
    assert result.returncode == 0, result.stderr
    sources = sorted(f"csrc/{p.name}" for p in (ROOT / "csrc").glob("*.c"))
    lines = [ln for ln in result.stdout.splitlines() if ln.startswith("[torch_lattice build] ")]
    counted = [ln.split(" ", 3)[2:] for ln in lines if "/" in ln.split(" ")[2]]
    n = len(sources)
    assert counted == [[f"{i}/{n}", src] for i, src in enumerate(sources, start=1)], lines
    assert lines[-1].startswith("[torch_lattice build] built torch_lattice._C in ")
    assert len(_split(cmds)[0]) == n


FAKE_NVCC = """\
#!/bin/sh
# Stands in for nvcc: creates the object file named after -o.
while [ $# -gt 0 ]; do
    if [ "$1" = "-o" ]; then : > "$2"; fi
    shift
done
"""


def _no_gpu_here() -> bool:
    return not list(Path("/dev").glob("nvidia[0-9]*"))


def test_cuda_without_gpu_says_why_and_how_to_skip(tmp_path: Path) -> None:
    """With nvcc found and auto mode, the build compiles CUDA and, on a machine with no
    GPU, says so and names TORCH_LATTICE_CUDA=0; each .cu gets a counted line."""
    cuda_home = tmp_path / "cuda"
    (cuda_home / "bin").mkdir(parents=True)
    nvcc = cuda_home / "bin" / "nvcc"
    nvcc.write_text(FAKE_NVCC)
    nvcc.chmod(0o755)
    result, _ = _commands(tmp_path, TORCH_LATTICE_CUDA="auto", CUDA_HOME=str(cuda_home))
    assert result.returncode == 0, result.stderr
    out = result.stdout
    n_cu = len(list((ROOT / "csrc" / "cuda").glob("*.cu")))
    assert f"compiling {n_cu} CUDA sources with nvcc" in out
    assert f"CUDA {n_cu}/{n_cu} csrc/cuda/" in out
    explained = f"nvcc found ({nvcc}) but no NVIDIA GPU on this machine" in out
    assert explained == _no_gpu_here(), out
    if explained:
        assert "TORCH_LATTICE_CUDA=0 skips them" in out


def test_no_message_about_gpus_when_cuda_is_off(tmp_path: Path) -> None:
    result, _ = _commands(tmp_path, TORCH_LATTICE_CUDA="0")
    assert result.returncode == 0, result.stderr
    assert "nvcc" not in result.stdout and "CUDA" not in result.stdout
