"""``convert-checkpoint``: exit statuses, safety, atomic output and the manifest.

Contract: status 0 converts; status 2 refuses an input with one ``error: ...`` line on
stderr, no traceback, and nothing written; an untrusted pickle never runs; a failure
while writing leaves neither the outputs nor temporary files.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import pickle
import pickletools
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from torch_lattice import migration
from torch_lattice.migration import cli, writing

PERM_333 = [0, 9, 18, 3, 12, 21, 6, 15, 24, 1, 10, 19, 4, 13, 22, 7, 16, 25, 2, 11, 20, 5,
            14, 23, 8, 17, 26]  # fmt: skip
SPEC = {"enc.kernel": [3, 3, 3], "down.kernel": [2, 2, 2], "head.kernel": [1, 1, 1]}


def legacy_sd() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return {
        "enc.kernel": torch.randn(27, 2, 4, generator=gen),
        "bn.weight": torch.rand(4, generator=gen),
        "bn.bias": torch.rand(4, generator=gen),
        "bn.running_mean": torch.rand(4, generator=gen),
        "bn.running_var": torch.rand(4, generator=gen),
        "bn.num_batches_tracked": torch.tensor(3),
        "down.kernel": torch.randn(8, 4, 4, generator=gen),
        "head.kernel": torch.randn(4, 5, generator=gen),
        "head.bias": torch.randn(5, generator=gen),
    }


@pytest.fixture
def work(tmp_path: Path) -> Path:
    """A folder with legacy.pt ({"model": sd}) and spec.json."""
    torch.save({"model": legacy_sd(), "epoch": 4}, tmp_path / "legacy.pt")
    (tmp_path / "spec.json").write_text(json.dumps(SPEC))
    return tmp_path


def files(folder: Path) -> set[str]:
    return {p.name for p in folder.iterdir()}


def run_installed(*args: str, module: bool = False) -> subprocess.CompletedProcess[str]:
    """Runs the console script from this interpreter's venv (or ``python -m``)."""
    if module:
        cmd = [sys.executable, "-m", "torch_lattice.migration.cli", *args]
    else:
        cmd = [str(Path(sys.executable).parent / "convert-checkpoint"), *args]
    return subprocess.run(cmd, capture_output=True, text=True, check=False)


def assert_refused(code: int, err: str, match: str) -> None:
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert match in lines[0], err
    assert "Traceback" not in err


# ---------------------------------------------------------------- success paths


def test_python_m_cli_converts(work: Path) -> None:
    """``python -m torch_lattice.migration.cli`` (the console script itself runs in
    test_migration_equivalence and in the optimizer refusal below)."""
    out = work / "weights.safetensors"
    run = run_installed(str(work / "legacy.pt"), str(out), "--kernel-spec",
                        str(work / "spec.json"), module=True)  # fmt: skip
    assert run.returncode == 0, run.stderr
    summary = json.loads(run.stdout)
    assert summary == {
        "output": str(out),
        "manifest": str(work / "weights.json"),
        "tensor_count": 12,
        "kernel_count": 3,
    }
    state = load_file(str(out))
    sd = legacy_sd()
    assert torch.equal(state["enc.weight"], sd["enc.kernel"][PERM_333])
    assert torch.equal(state["head.weight"], sd["head.kernel"][None])
    assert torch.equal(state["down.weight"], sd["down.kernel"])
    assert files(work) == {"legacy.pt", "spec.json", "weights.safetensors", "weights.json"}


def test_manifest_contents(work: Path) -> None:
    out, manifest = work / "w.safetensors", work / "sub" / "m.json"
    args = [str(work / "legacy.pt"), str(out), "--kernel-spec", str(work / "spec.json")]
    assert cli.main([*args, "--manifest", str(manifest)]) == 0
    text = manifest.read_text()
    doc = json.loads(text)
    assert text == json.dumps(doc, indent=2, sort_keys=True) + "\n"
    assert doc["schema"] == "lattice-checkpoint-conversion/v2"
    assert doc["source_checkpoint"] == str(work / "legacy.pt")
    assert doc["source_sha256"] == hashlib.sha256((work / "legacy.pt").read_bytes()).hexdigest()
    assert doc["source_kernel_layout_policy"] == "torchsparse_k_i_o_volume_parity"
    assert doc["target_kernel_layout"] == "lattice_k_i_o_z_fastest"
    assert doc["target_artifact_weight_layout"] == "conv3d_o_xyz_i"
    assert (doc["source_container"], doc["ignored_source_keys"]) == ("model", ["epoch"])
    state = load_file(str(out))
    assert doc["tensor_count"] == len(state) == 12
    kernels = {k["source_key"]: k for k in doc["kernels"]}
    assert kernels["enc.kernel"] | {"kernel_positions_key": None} == {
        "source_key": "enc.kernel",
        "target_key": "enc.weight",
        "kernel_size": [3, 3, 3],
        "source_layout": "torchsparse_k_i_o_x_fastest",
        "row_permutation": PERM_333,
        "source_shape": [27, 2, 4],
        "kernel_positions_key": None,
    }
    assert kernels["down.kernel"]["source_layout"] == "torchsparse_k_i_o_z_fastest"
    assert kernels["down.kernel"]["row_permutation"] == list(range(8))
    assert kernels["head.kernel"]["source_shape"] == [4, 5]
    tensors = {t["target_key"]: t for t in doc["tensors"]}
    assert set(tensors) == set(state)
    assert tensors["enc.weight"]["row_permutation"] == PERM_333
    assert tensors["bn.running_var"]["action"] == "unchanged"
    assert tensors["bn.running_var"]["row_permutation"] is None
    assert tensors["down.kernel_positions"]["action"] == "generated_kernel_positions"


def test_legacy_torch_format_converts(tmp_path: Path) -> None:
    """Checkpoints written by torch < 1.6 (non-zip serialization) are read too."""
    torch.save(legacy_sd(), tmp_path / "old.pt", _use_new_zipfile_serialization=False)
    done = migration.convert_checkpoint(tmp_path / "old.pt", tmp_path / "w.safetensors", SPEC)
    assert done.manifest["source_container"] == "bare"
    state = load_file(str(tmp_path / "w.safetensors"))
    assert torch.equal(state["enc.weight"], legacy_sd()["enc.kernel"][PERM_333])


def test_force_overwrites(work: Path) -> None:
    out = work / "w.safetensors"
    out.write_bytes(b"old")
    args = [str(work / "legacy.pt"), str(out), "--kernel-spec", str(work / "spec.json")]
    assert cli.main([*args, "--force"]) == 0
    assert "enc.weight" in load_file(str(out))


# ---------------------------------------------------------------- refusals


def test_optimizer_state_refused_by_installed_script(tmp_path: Path) -> None:
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.ones(1, 2)).sum().backward()
    opt.step()
    ckpt = {"model": legacy_sd(), "optimizer": opt.state_dict(), "epoch": 3}
    torch.save(ckpt, tmp_path / "train.pt")
    (tmp_path / "spec.json").write_text(json.dumps(SPEC))
    run = run_installed(str(tmp_path / "train.pt"), str(tmp_path / "w.safetensors"),
                        "--kernel-spec", str(tmp_path / "spec.json"))  # fmt: skip
    assert_refused(run.returncode, run.stderr, "optimizer state under 'optimizer'")
    assert files(tmp_path) == {"train.pt", "spec.json"}


def _write_spec(folder: Path, spec: object) -> Path:
    path = folder / "bad-spec.json"
    path.write_text(json.dumps(spec))
    return path


@pytest.mark.parametrize(
    ("case", "match"),
    [
        ("missing_spec", "kernel spec"),
        ("unlisted", "missing from the kernel spec (every '<module>.kernel' or 'kernel' must"),
        ("absent_key", "spec keys not found in the checkpoint: ghost.kernel"),
        ("row_mismatch", "'down.kernel' has shape (8, 4, 4)"),
        ("non_tensor", "'bn.weight' is a list, not a tensor"),
        ("exists", "already exists; pass --force"),
        ("manifest_exists", "w.json' already exists"),
        ("same_as_source", "would overwrite the source"),
        ("missing_source", "does not exist"),
        ("not_a_checkpoint", "cannot load"),
    ],
)
def test_refusals_write_nothing(
    work: Path, capsys: pytest.CaptureFixture[str], case: str, match: str
) -> None:
    source, out, spec = work / "legacy.pt", work / "w.safetensors", work / "spec.json"
    if case == "missing_spec":
        spec = work / "no-such-spec.json"
    elif case == "unlisted":
        spec = _write_spec(work, {"enc.kernel": [3, 3, 3], "head.kernel": [1, 1, 1]})
    elif case == "absent_key":
        spec = _write_spec(work, SPEC | {"ghost.kernel": [3, 3, 3]})
    elif case == "row_mismatch":
        spec = _write_spec(work, SPEC | {"down.kernel": [3, 3, 3]})
    elif case == "non_tensor":
        torch.save({"model": legacy_sd() | {"bn.weight": [1.0, 2.0]}}, source)
    elif case == "exists":
        out.write_bytes(b"keep me")
    elif case == "manifest_exists":
        (work / "w.json").write_text("keep me")
    elif case == "same_as_source":
        out = source
    elif case == "missing_source":
        source = work / "nope.pt"
    elif case == "not_a_checkpoint":
        source.write_bytes(b"definitely not a checkpoint")
    before = {p.name: p.read_bytes() for p in work.iterdir()}
    code = cli.main([str(source), str(out), "--kernel-spec", str(spec)])
    assert_refused(code, capsys.readouterr().err, match)
    assert {p.name: p.read_bytes() for p in work.iterdir()} == before


def _pickle_strings(path: Path) -> set[str]:
    """Every string operand of the pickle streams in ``path``, read without unpickling.

    A zip checkpoint keeps its pickle in ``*/data.pkl``; the legacy format and a
    raw pickle are a sequence of pickles (then raw storage bytes, where the scan stops).
    """
    if zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as z:
            blobs = [z.read(n) for n in z.namelist() if n.endswith("data.pkl")]
    else:
        blobs = [path.read_bytes()]
    found: set[str] = set()
    for blob in blobs:
        stream = io.BytesIO(blob)
        while stream.tell() < len(blob):
            try:
                found.update(a for _, a, _ in pickletools.genops(stream) if isinstance(a, str))
            except ValueError:
                break
    return found


class _Payload:
    """Unpickling this object calls ``open(marker, "w")``, creating the marker."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str, str]]:
        return (open, (str(self.marker), "w"))


@pytest.mark.parametrize("fmt", ["torch_save", "legacy_torch_format", "raw_pickle"])
def test_untrusted_pickle_never_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], fmt: str
) -> None:
    marker = tmp_path / "PWNED"
    ckpt = {"model": legacy_sd() | {"evil": _Payload(marker)}}
    source = tmp_path / "evil.pt"
    if fmt == "torch_save":
        torch.save(ckpt, source)
    elif fmt == "legacy_torch_format":  # what torch < 1.6 wrote
        torch.save(ckpt, source, _use_new_zipfile_serialization=False)
    else:
        source.write_bytes(pickle.dumps(ckpt))
    (tmp_path / "spec.json").write_text(json.dumps(SPEC))
    out = tmp_path / "w.safetensors"
    code = cli.main([str(source), str(out), "--kernel-spec", str(tmp_path / "spec.json")])
    err = capsys.readouterr().err
    assert_refused(code, err, "evil.pt")
    assert not marker.exists()
    assert files(tmp_path) == {"evil.pt", "spec.json"}
    # The payload is really in the file: its pickle stream calls open(marker).
    strings = _pickle_strings(source)
    assert str(marker) in strings
    assert any(s == "open" or s.endswith(" open") for s in strings)


def test_untrusted_pickle_message_names_the_global(tmp_path: Path) -> None:
    torch.save({"x": _Payload(tmp_path / "m")}, tmp_path / "e.pt")
    with pytest.raises(migration.UnsafeCheckpointError, match="open"):
        migration.read_legacy_checkpoint(tmp_path / "e.pt")
    assert not (tmp_path / "m").exists()


# ---------------------------------------------------------------- atomic writing


def test_failed_save_leaves_nothing(work: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    def half_written(tensors: dict, path: str, metadata: dict) -> None:
        Path(path).write_bytes(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(writing, "save_file", half_written)
    out = work / "new" / "w.safetensors"
    code = cli.main([str(work / "legacy.pt"), str(out), "--kernel-spec", str(work / "spec.json")])
    assert code == 1
    assert capsys.readouterr().err.strip() == "error: cannot write outputs: disk full"
    assert files(work) == {"legacy.pt", "spec.json"}  # no output, no temp, no new folder


def test_failed_manifest_rename_leaves_nothing(work: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_replace = os.replace
    calls: list[str] = []

    def second_fails(src: str, dst: str) -> None:
        calls.append(str(dst))
        if len(calls) == 2:
            raise OSError("rename failed")
        real_replace(src, dst)

    monkeypatch.setattr(writing.os, "replace", second_fails)
    out = work / "w.safetensors"
    with pytest.raises(OSError, match="rename failed"):
        migration.convert_checkpoint(work / "legacy.pt", out, SPEC)
    assert calls == [str(out), str(work / "w.json")]
    assert files(work) == {"legacy.pt", "spec.json"}
