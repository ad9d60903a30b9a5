"""``convert-checkpoint`` against hostile or careless input (issue 21).

Every refusal is exit status 2 with one ``error:`` line, nothing written and no input
changed: outputs that are inputs (even with ``--force``), corrupted archives (a bad CRC,
duplicate entries), expanded tensors that would materialise gigabytes from a tiny file,
FIFOs and oversized files, sizes beyond the memory budget.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch

import torch_lattice as tl
from torch_lattice import migration
from torch_lattice.migration import cli

try:
    from converter_cli_helpers import files, refused
except ImportError:  # tests/ may become a package; then they are imported through it
    from tests.converter_cli_helpers import files, refused

SPEC = {"enc.kernel": [3, 3, 3]}


def _state() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return {"enc.kernel": torch.randn(27, 2, 4, generator=gen),
            "bn.weight": torch.ones(4)}


@pytest.fixture
def work(tmp_path: Path) -> Path:
    torch.save({"model": _state()}, tmp_path / "legacy.pt")
    (tmp_path / "legacy-kernels.json").write_text(json.dumps(SPEC))
    return tmp_path


def test_the_default_manifest_may_not_replace_the_kernel_spec(
        work: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before = files(work)
    spec = str(work / "legacy-kernels.json")
    # legacy-kernels.safetensors -> default manifest legacy-kernels.json: the spec itself.
    for force in ([], ["--force"]):
        refused(capsys, [str(work / "legacy.pt"), str(work / "legacy-kernels.safetensors"),
                          "--kernel-spec", spec, *force], "would overwrite the kernel spec")
    refused(capsys, [str(work / "legacy.pt"), spec, "--kernel-spec", spec,
                      "--manifest", str(work / "m.json"), "--force"],
             "would overwrite the kernel spec")
    assert files(work) == before


def test_a_link_to_an_input_is_the_input(work: Path, capsys: pytest.CaptureFixture[str]) -> None:
    os.link(work / "legacy.pt", work / "hard.safetensors")
    os.symlink(work / "legacy-kernels.json", work / "soft.json")
    before = files(work)
    spec = str(work / "legacy-kernels.json")
    refused(capsys, [str(work / "legacy.pt"), str(work / "hard.safetensors"), "--kernel-spec",
                      spec, "--manifest", str(work / "m.json"), "--force"],
             "would overwrite the source checkpoint")
    refused(capsys, [str(work / "legacy.pt"), str(work / "out.safetensors"), "--kernel-spec",
                      spec, "--manifest", str(work / "soft.json"), "--force"],
             "would overwrite the kernel spec")
    assert files(work) == before


def _zip_entries(path: Path) -> list[tuple[zipfile.ZipInfo, bytes]]:
    with zipfile.ZipFile(path) as archive:
        return [(info, archive.read(info)) for info in archive.infolist()]


def _write_zip(path: Path, entries: list[tuple[zipfile.ZipInfo, bytes]]) -> None:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as archive:
        for info, data in entries:
            archive.writestr(info, data)


def test_a_bad_crc_is_refused(work: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = work / "legacy.pt"
    raw = bytearray(source.read_bytes())
    ones = torch.ones(4).numpy().tobytes()  # bn.weight's stored bytes
    at = bytes(raw).index(ones)
    raw[at + 3] ^= 0x7F  # 1.0 becomes inf-like garbage: only the CRC can tell
    source.write_bytes(bytes(raw))
    refused(capsys, [str(source), str(work / "out.safetensors"), "--kernel-spec",
                      str(work / "legacy-kernels.json")], "CRC")
    assert not (work / "out.safetensors").exists()


def test_duplicate_entries_are_refused(work: Path, capsys: pytest.CaptureFixture[str]) -> None:
    entries = _zip_entries(work / "legacy.pt")
    pickle_entry = next(e for e in entries if e[0].filename.endswith("data.pkl"))
    with pytest.warns(UserWarning, match="Duplicate name"):
        _write_zip(work / "dup.pt", [*entries, pickle_entry])
    refused(capsys, [str(work / "dup.pt"), str(work / "out.safetensors"), "--kernel-spec",
                      str(work / "legacy-kernels.json")], "appears twice")


@pytest.mark.parametrize("length", [2**28, 2**31])
def test_expanded_tensors_are_refused_before_materialising(
        work: Path, length: int, capsys: pytest.CaptureFixture[str]) -> None:
    state = {**_state(), "bomb": torch.zeros(1).expand(length)}
    torch.save({"model": state}, work / "bomb.pt")
    assert (work / "bomb.pt").stat().st_size < 10_000
    refused(capsys, [str(work / "bomb.pt"), str(work / "out.safetensors"), "--kernel-spec",
                      str(work / "legacy-kernels.json")], "'bomb'")
    assert not (work / "out.safetensors").exists()


def test_an_expanded_tensor_through_the_python_api(tmp_path: Path) -> None:
    state = {**_state(), "bomb": torch.zeros(3, 1).expand(3, 1000)}
    with pytest.raises(migration.ConversionError, match="expanded view"):
        migration.convert_state_dict(state, SPEC)


def test_the_memory_budget_bounds_the_conversion(
        work: Path, capsys: pytest.CaptureFixture[str]) -> None:
    previous = tl.set_memory_budget(64)
    try:
        refused(capsys, [str(work / "legacy.pt"), str(work / "out.safetensors"),
                          "--kernel-spec", str(work / "legacy-kernels.json")], "memory budget")
    finally:
        tl.set_memory_budget(previous)
    assert cli.main([str(work / "legacy.pt"), str(work / "out.safetensors"), "--kernel-spec",
                     str(work / "legacy-kernels.json")]) == 0


def test_a_fifo_source_or_spec_never_blocks(work: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    os.mkfifo(work / "fifo")
    refused(capsys, [str(work / "fifo"), str(work / "out.safetensors"), "--kernel-spec",
                      str(work / "legacy-kernels.json")], "FIFO")
    refused(capsys, [str(work / "legacy.pt"), str(work / "out.safetensors"), "--kernel-spec",
                      str(work / "fifo")], "FIFO")


def test_a_huge_kernel_spec_is_refused_without_reading_it(
        work: Path, capsys: pytest.CaptureFixture[str]) -> None:
    huge = work / "huge.json"
    with open(huge, "wb") as f:  # sparse: 3 GiB of size, no disk used
        f.truncate(3 * 2**30)
    refused(capsys, [str(work / "legacy.pt"), str(work / "out.safetensors"), "--kernel-spec",
                      str(huge)], "at most")


def test_a_good_archive_still_converts(work: Path) -> None:
    # The integrity checks accept what torch.save writes, rewritten entry for entry.
    _write_zip(work / "copy.pt", _zip_entries(work / "legacy.pt"))
    torch.load(io.BytesIO((work / "copy.pt").read_bytes()), weights_only=True)
    assert cli.main([str(work / "copy.pt"), str(work / "out.safetensors"), "--kernel-spec",
                     str(work / "legacy-kernels.json")]) == 0


def test_an_entry_flagged_encrypted_is_a_refusal(work: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    raw = bytearray((work / "legacy.pt").read_bytes())
    # Set the "encrypted" bit (general purpose flag bit 0) of every central directory
    # record: zipfile then raises RuntimeError, which must become a refusal.
    at = raw.find(b"PK\x01\x02")
    assert at >= 0
    while at >= 0:
        raw[at + 8] |= 1
        at = raw.find(b"PK\x01\x02", at + 4)
    (work / "enc.pt").write_bytes(bytes(raw))
    refused(capsys, [str(work / "enc.pt"), str(work / "out.safetensors"), "--kernel-spec",
                      str(work / "legacy-kernels.json")], "corrupted archive")


def test_a_deeply_nested_kernel_spec_is_refused(work: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    (work / "deep.json").write_text("[" * 200_000)
    refused(capsys, [str(work / "legacy.pt"), str(work / "out.safetensors"), "--kernel-spec",
                      str(work / "deep.json")], "nests JSON too deeply")


@pytest.mark.parametrize("kind", ["fifo", "socket", "link"])
def test_force_replaces_only_regular_files(work: Path, capsys: pytest.CaptureFixture[str],
                                           kind: str) -> None:
    # --manifest /dev/null --force once replaced the device with a regular file; a FIFO
    # or a socket (made here: no real device node is touched) stands for it.
    special = work / "special"
    if kind == "fifo":
        os.mkfifo(special)
        what = "a FIFO"
    elif kind == "socket":
        import socket

        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind(str(special))
        except OSError as exc:  # a path too long for AF_UNIX
            pytest.skip(f"cannot bind a socket here: {exc}")
        sock.close()
        what = "a socket"
    else:
        (work / "target.json").write_text("{}")
        os.symlink(work / "target.json", special)
        what = "a symbolic link"
    argv = [str(work / "legacy.pt"), str(work / "out.safetensors"), "--kernel-spec",
            str(work / "legacy-kernels.json")]
    refused(capsys, [*argv, "--manifest", str(special), "--force"],
            f"manifest (--manifest) '{special}' exists and is {what}; --force replaces only "
            "regular files")
    refused(capsys, [str(work / "legacy.pt"), str(special), "--kernel-spec",
                     str(work / "legacy-kernels.json"), "--force"],
            f"output '{special}' exists and is {what}")
    assert os.path.lexists(special) and (special.is_symlink() or not special.is_file())
    assert not (work / "out.safetensors").exists() and not (work / "special.json").exists()
    if kind == "link":
        assert (work / "target.json").read_text() == "{}"
    with pytest.raises(migration.ConversionError, match="only regular files"):
        migration.convert_checkpoint(work / "legacy.pt", work / "out.safetensors", SPEC,
                                     manifest=special, force=True)


def test_a_metadata_key_is_refused(work: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # safetensors keeps "__metadata__" for its header: the file written once could not
    # be loaded ("duplicate field").
    torch.save({"model": {**_state(), "__metadata__": torch.ones(2)}}, work / "meta.pt")
    refused(capsys, [str(work / "meta.pt"), str(work / "out.safetensors"), "--kernel-spec",
                     str(work / "legacy-kernels.json")],
            "model state key '__metadata__' is reserved by the safetensors format")
    assert not (work / "out.safetensors").exists()
    with pytest.raises(migration.ConversionError, match="'__metadata__' is reserved"):
        migration.convert_state_dict({**_state(), "__metadata__": torch.ones(2)}, SPEC)


def test_duplicate_kernel_spec_keys_are_refused(work: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    spec = work / "dup.json"
    spec.write_text('{"enc.kernel": [1, 1, 1], "enc.kernel": [3, 3, 3]}')
    argv = [str(work / "legacy.pt"), str(work / "out.safetensors"), "--kernel-spec", str(spec)]
    refused(capsys, argv, "gives the key 'enc.kernel' twice")
    spec.write_text('{"enc.kernel": {"kernel_size": [1, 1, 1], "kernel_size": [3, 3, 3]}}')
    refused(capsys, argv, "gives the key 'kernel_size' twice")
    assert not (work / "out.safetensors").exists()
    spec.write_text('{"enc.kernel": [3, 3, 3], "enc.kernel": [3, 3, 3]}')
    with pytest.raises(migration.ConversionError, match=r"'enc\.kernel' twice"):
        migration.load_kernel_spec(spec)


@pytest.mark.parametrize(("size", "error", "fragment"), [
    ((-1, 3, 3), ValueError, "kernel_size must be positive"),
    ((0, 3, 3), ValueError, "kernel_size must be positive"),
    ((3, 3), ValueError, "kernel_size must have 3 components"),
    ((3, 3, 3.0), TypeError, "kernel_size must contain ints"),
    ("333", TypeError, "kernel_size must be an int or a 3-tuple"),
])
def test_row_permutation_checks_kernel_size(size: object, error: type[Exception],
                                            fragment: str) -> None:
    with pytest.raises(error, match=fragment):
        migration.row_permutation(size, "x_fastest")  # type: ignore[arg-type]
    assert migration.row_permutation((1, 1, 2), "x_fastest") == [0, 1]
    with pytest.raises(TypeError, match="row_order must be a str"):
        migration.row_permutation((3, 3, 3), ["x_fastest"])  # type: ignore[arg-type]


# Run apart, with its address space capped just above what it has after the import: a
# row_permutation that built its list anyway (8e9 or 1e9 Python ints) fails with a
# MemoryError there instead of taking the machine's memory.
_HUGE_KERNELS = """
import resource
from torch_lattice import migration
with open("/proc/self/status") as status:
    vm = next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmSize:"))
resource.setrlimit(resource.RLIMIT_AS, (vm + 2**29, resource.getrlimit(resource.RLIMIT_AS)[1]))
for size in [(2000, 2000, 2000), (1024, 1024, 1024)]:
    try:
        migration.row_permutation(size, "x_fastest")
    except ValueError as exc:
        print("refused:", exc)
"""


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="needs Linux's /proc")
def test_row_permutation_refuses_huge_kernels_before_building() -> None:
    env = {**os.environ, "TORCH_LATTICE_MEMORY_BUDGET": "1M"}
    run = subprocess.run([sys.executable, "-c", _HUGE_KERNELS], capture_output=True,
                         text=True, env=env, timeout=120, check=False)
    assert run.returncode == 0, run.stderr[-2000:]
    lines = run.stdout.splitlines()
    assert len(lines) == 2, run.stdout
    # Beyond the int32 kernel-row index; then within it but beyond the memory budget.
    assert "kernel_size (2000, 2000, 2000) has 8000000000 rows; at most" in lines[0]
    assert "row_permutation of kernel_size (1024, 1024, 1024)" in lines[1]
    assert "beyond the memory budget" in lines[1]


def test_python_api_checks_argument_types(work: Path) -> None:
    out = work / "out.safetensors"
    migration.convert_checkpoint(work / "legacy.pt", out, SPEC)
    before = out.read_bytes()
    for bad in ("no", 1, None):
        with pytest.raises(TypeError, match="force must be a bool"):
            migration.convert_checkpoint(work / "legacy.pt", out, SPEC,
                                         force=bad)  # type: ignore[arg-type]
    assert out.read_bytes() == before
    with pytest.raises(TypeError, match="kernel_spec must be a path"):
        migration.convert_checkpoint(work / "legacy.pt", out, 3)  # type: ignore[arg-type]
    spec = migration.parse_kernel_spec(SPEC)["enc.kernel"]
    kernel = _state()["enc.kernel"]
    with pytest.raises(TypeError, match="spec must be a KernelSpec"):
        migration.convert_kernel(kernel, spec)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="spec must be a KernelSpec"):
        migration.convert_kernel((3, 3, 3), kernel)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ["source", "output", "manifest", "kernel_spec"])
def test_a_nul_byte_names_the_path_argument(work: Path, name: str) -> None:
    args: dict[str, object] = {"source": work / "legacy.pt", "output": work / "o.safetensors",
                               "manifest": None, "kernel_spec": work / "legacy-kernels.json"}
    args[name] = str(work / "bad\0name")
    with pytest.raises(migration.ConversionError, match=rf"^{name} .* contains a NUL byte"):
        migration.convert_checkpoint(args["source"], args["output"],  # type: ignore[arg-type]
                                     args["kernel_spec"],  # type: ignore[arg-type]
                                     manifest=args["manifest"])  # type: ignore[arg-type]
    with pytest.raises(migration.ConversionError, match=r"kernel spec .* contains a NUL byte"):
        migration.load_kernel_spec(str(work / "a\0.json"))
    with pytest.raises(migration.ConversionError, match=r"source checkpoint .* NUL byte"):
        migration.read_legacy_checkpoint(str(work / "a\0.pt"))
    assert not (work / "o.safetensors").exists()


@pytest.mark.parametrize(("entry", "fragment"), [
    ({"kernel_size": [3, 3, 3], "row_order": ["x_fastest"]},
     "kernel spec for 'enc.kernel': row_order must be one of"),
    ({"kernel_size": [3, 3, 3], "row_order": {"x": 1}},
     "kernel spec for 'enc.kernel': row_order must be one of"),
    ([2**40, 2**40, 2**40], "kernel spec for 'enc.kernel': kernel_size [1099511627776, "),
    ([2**31, 1, 1], "has 2147483648 rows; at most 2147483647"),
], ids=["row_order_list", "row_order_object", "volume_2**120", "volume_2**31"])
def test_a_bad_spec_entry_names_the_key_and_the_rule(
        work: Path, capsys: pytest.CaptureFixture[str], entry: object, fragment: str) -> None:
    """An unhashable row_order made a bare "unhashable type: 'list'"; a kernel volume past
    the kernel-row limit reached the memory budget, whose message names neither."""
    spec = work / "bad.json"
    spec.write_text(json.dumps({"enc.kernel": entry}))
    refused(capsys, [str(work / "legacy.pt"), str(work / "out.safetensors"),
                     "--kernel-spec", str(spec)], fragment)
    with pytest.raises(migration.ConversionError, match=r"kernel spec for 'enc\.kernel'"):
        migration.parse_kernel_spec({"enc.kernel": entry})
    assert not (work / "out.safetensors").exists()


def test_a_key_that_is_not_unicode_is_named(work: Path, capsys: pytest.CaptureFixture[str]
                                            ) -> None:
    """A pickle can hold a lone surrogate; safetensors failed on it after the conversion,
    with an encoder message that named no key."""
    torch.save({"model": {**_state(), "bn.\udc80": torch.ones(1)}}, work / "bad.pt")
    refused(capsys, [str(work / "bad.pt"), str(work / "out.safetensors"), "--kernel-spec",
                     str(work / "legacy-kernels.json")],
            "model state key 'bn.\\udc80' is not valid Unicode")
    assert not (work / "out.safetensors").exists()
