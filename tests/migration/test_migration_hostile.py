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
