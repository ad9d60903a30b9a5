"""The compiler and linker command lines setup.py produces (issue 13).

setup.py's build_ext runs with CC and LDSHARED pointing at a stand-in compiler
that records its arguments and writes an empty output file, so each case takes
about a second and compiles nothing.  The user's CFLAGS/LDFLAGS must come
after setup.py's own flags (the last -O wins), and TORCH_LATTICE_SANITIZE=1
must add the sanitizer flags and leave CUDA out.  A stand-in nvcc and nvidia-smi
show what TORCH_LATTICE_CUDA=auto|1 compiles with and without a visible GPU
(issue 25: auto compiles CUDA only where it can run).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# The C sources setup.py compiles: the core, then its CPython binding.
C_SOURCE_DIRS = (ROOT / "csrc" / "core", ROOT / "csrc" / "python")

FAKE_CC = """\
import json, os, sys, time
args = sys.argv[1:]
start = time.monotonic()
# TL_FAKE_CC_SECONDS: how long a compile takes; TL_FAKE_CC_FAIL: a source that fails.
if "-c" in args:
    time.sleep(float(os.environ.get("TL_FAKE_CC_SECONDS", "0")))
    failing = os.environ.get("TL_FAKE_CC_FAIL")
    if failing and any(a.endswith(failing) for a in args):
        sys.exit("fake_cc: error: cannot compile " + failing)
with open(os.environ["TL_FAKE_CC_LOG"], "a") as log:
    log.write(json.dumps(args) + "\\n")
if "-c" in args:  # one line per compile, written whole (compiles run in parallel)
    with open(os.environ["TL_FAKE_CC_LOG"] + ".compiles", "a") as log:
        log.write(json.dumps([start, time.monotonic()]) + "\\n")
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
        # the caller's build choices, not the environment's (CI exports TORCH_LATTICE_CUDA=1)
        if k
        not in ("CFLAGS", "LDFLAGS", "CPPFLAGS", "TORCH_LATTICE_SANITIZE", "TORCH_LATTICE_CUDA")
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
        # Signed overflow is checked: Python's own -fwrapv (first on the line) is undone.
        assert [a for a in cmd if a in ("-fwrapv", "-fno-wrapv")][-1] == "-fno-wrapv", cmd
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
    sources = sorted(str(p.relative_to(ROOT)) for d in C_SOURCE_DIRS for p in d.glob("*.c"))
    lines = [ln for ln in result.stdout.splitlines() if ln.startswith("[torch_lattice build] ")]
    counted = [ln.split(" ", 3)[2:] for ln in lines if "/" in ln.split(" ")[2]]
    n = len(sources)
    assert counted == [[f"{i}/{n}", src] for i, src in enumerate(sources, start=1)], lines
    assert lines[-1].startswith("[torch_lattice build] built torch_lattice._C in ")
    assert len(_split(cmds)[0]) == n


def test_sources_compile_one_per_core(tmp_path: Path) -> None:
    """With more than one core, compiles overlap (each stand-in compile sleeps 0.3 s),
    and no more run at once than there are cores; the lines still come in order."""
    cores = len(os.sched_getaffinity(0))
    result, _ = _commands(tmp_path, TORCH_LATTICE_CUDA="0", TL_FAKE_CC_SECONDS="0.3")
    assert result.returncode == 0, result.stderr
    compiles = (tmp_path / "cc.log.compiles").read_text().splitlines()
    spans = [json.loads(line) for line in compiles]
    most = max(sum(1 for s, e in spans if s <= start < e) for start, _ in spans)
    assert (most == 1) if cores == 1 else (2 <= most <= cores), (most, cores)
    lines = [ln for ln in result.stdout.splitlines() if ln.startswith("[torch_lattice build] ")]
    numbers = [ln.split(" ")[2] for ln in lines if "/" in ln.split(" ")[2]]
    assert numbers == [f"{i}/{len(spans)}" for i in range(1, len(spans) + 1)], lines


def test_a_failed_compile_fails_the_build_and_links_nothing(tmp_path: Path) -> None:
    result, cmds = _commands(tmp_path, TORCH_LATTICE_CUDA="0", TL_FAKE_CC_FAIL="tl_hash.c")
    assert result.returncode != 0
    assert "cannot compile tl_hash.c" in result.stderr + result.stdout
    assert not _split(cmds)[1], "linked after a failed compile"
    assert not any(a.endswith("tl_hash.c") for cmd in cmds for a in cmd)


FAKE_NVCC = """\
#!/bin/sh
# Stands in for nvcc: creates the object file named after -o.
while [ $# -gt 0 ]; do
    if [ "$1" = "-o" ]; then : > "$2"; fi
    shift
done
"""


def _no_gpu_here() -> bool:
    return not list(Path("/dev").glob("nvidia[0-9]*")) and not any(
        Path("/proc/driver/nvidia/gpus").glob("*")
    )


FAKE_NVIDIA_SMI = """\
#!/bin/sh
# Stands in for nvidia-smi -L: {listing}
{body}
"""


def _fake_cuda(tmp_path: Path, gpu_listed: bool) -> tuple[Path, str]:
    """A CUDA_HOME with a stand-in nvcc, and a PATH whose first entry holds a stand-in
    nvidia-smi that lists one GPU (gpu_listed) or none, as on a machine without a driver."""
    cuda_home = tmp_path / "cuda"
    (cuda_home / "bin").mkdir(parents=True)
    nvcc = cuda_home / "bin" / "nvcc"
    nvcc.write_text(FAKE_NVCC)
    nvcc.chmod(0o755)
    smi_dir = tmp_path / "smi"
    smi_dir.mkdir()
    smi = smi_dir / "nvidia-smi"
    if gpu_listed:
        body = 'echo "GPU 0: NVIDIA H200 (UUID: GPU-00000000-0000-0000-0000-000000000000)"'
        smi.write_text(FAKE_NVIDIA_SMI.format(listing="one GPU", body=body))
    else:
        body = 'echo "NVIDIA-SMI has failed because it could not find a driver"; exit 9'
        smi.write_text(FAKE_NVIDIA_SMI.format(listing="no driver", body=body))
    smi.chmod(0o755)
    return cuda_home, f"{smi_dir}{os.pathsep}{os.environ.get('PATH', '')}"


def _cuda_compiled(result: subprocess.CompletedProcess, cmds: list[list[str]]) -> bool:
    """Whether the build compiled and linked the CUDA sources (seen in its output and in
    the C compiles' -DTL_WITH_CUDA=1)."""
    n_cu = len(list((ROOT / "csrc" / "cuda").glob("*.cu")))
    said = f"compiling {n_cu} CUDA sources with nvcc" in result.stdout
    defined = any("-DTL_WITH_CUDA=1" in c for c in _split(cmds)[0])
    assert said == defined, result.stdout
    return said


def test_auto_without_gpu_builds_the_c_core_and_says_how_to_include_cuda(tmp_path: Path) -> None:
    """auto with nvcc found but no GPU visible: no nvcc run, one line naming
    TORCH_LATTICE_CUDA=1.  On a machine that has a GPU device node, auto compiles CUDA."""
    cuda_home, path = _fake_cuda(tmp_path, gpu_listed=False)
    result, cmds = _commands(
        tmp_path, TORCH_LATTICE_CUDA="auto", CUDA_HOME=str(cuda_home), PATH=path
    )
    assert result.returncode == 0, result.stderr
    if _no_gpu_here():
        assert not _cuda_compiled(result, cmds)
        said = [ln for ln in result.stdout.splitlines() if "GPU" in ln or "CUDA" in ln]
        assert said == [
            "[torch_lattice build] no NVIDIA GPU visible: building the C core only (CPU); "
            f"TORCH_LATTICE_CUDA=1 includes the CUDA kernels (nvcc is at {cuda_home}/bin/nvcc)"
        ], result.stdout
    else:
        assert _cuda_compiled(result, cmds)


def test_auto_with_a_gpu_listed_by_nvidia_smi_compiles_cuda_in_parallel(tmp_path: Path) -> None:
    """A GPU in `nvidia-smi -L` is enough for auto; each .cu gets a counted line with its
    time, the step says how many nvcc run at once (one per core) and its measured time."""
    cuda_home, path = _fake_cuda(tmp_path, gpu_listed=True)
    result, cmds = _commands(
        tmp_path, TORCH_LATTICE_CUDA="auto", CUDA_HOME=str(cuda_home), PATH=path
    )
    assert result.returncode == 0, result.stderr
    assert _cuda_compiled(result, cmds)
    out = result.stdout
    n_cu = len(list((ROOT / "csrc" / "cuda").glob("*.cu")))
    workers = os.cpu_count() or 1
    assert f"({workers} at a time, one per core)" in out
    counted = re.findall(r"CUDA (\d+)/(\d+) csrc/cuda/\S+\.cu \(\d+ s\)", out)
    assert counted == [(str(i), str(n_cu)) for i in range(1, n_cu + 1)], out
    assert re.search(r"CUDA compiled in \d+ s", out), out
    assert "no NVIDIA GPU visible" not in out


def test_cuda_1_compiles_without_a_gpu(tmp_path: Path) -> None:
    """TORCH_LATTICE_CUDA=1 (wheels, the device check) compiles CUDA whatever the machine."""
    cuda_home, path = _fake_cuda(tmp_path, gpu_listed=False)
    result, cmds = _commands(tmp_path, TORCH_LATTICE_CUDA="1", CUDA_HOME=str(cuda_home), PATH=path)
    assert result.returncode == 0, result.stderr
    assert _cuda_compiled(result, cmds)
    assert "no NVIDIA GPU visible" not in result.stdout


def test_no_message_about_gpus_when_cuda_is_off(tmp_path: Path) -> None:
    result, _ = _commands(tmp_path, TORCH_LATTICE_CUDA="0")
    assert result.returncode == 0, result.stderr
    assert "nvcc" not in result.stdout and "CUDA" not in result.stdout
