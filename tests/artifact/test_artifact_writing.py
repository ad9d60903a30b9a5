"""Writing artifact directories never loses a user's file (issue 21).

The exporter deletes only what it wrote (or the artifact it replaces), refuses names
its own loader would refuse, replaces an existing artifact so that the target always
holds the old or the new one, and cleans the hidden folders of exports that died.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

import torch_lattice as tl
from torch_lattice.artifact import ExportError, artifact_dir, load_lattice_program
from torch_lattice.artifact import save_lattice_model_artifact as save
from torch_lattice.atomic_file import exchange_paths, owner_field, owner_tag


class One(nn.Module):
    def __init__(self, conv: nn.Module) -> None:
        super().__init__()
        self.conv = conv

    def forward(self, x: tl.SparseTensor) -> tl.SparseTensor:
        return self.conv(x)


def _x() -> tl.SparseTensor:
    coords = torch.tensor([[0, x, y, z] for x in range(3) for y in range(3) for z in (0, 2)])
    return tl.SparseTensor(torch.randn(len(coords), 2, generator=torch.Generator().manual_seed(0)),
                           coords)


def _model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return One(tl.nn.SubmConv3d(2, 2, 3)).eval()


def _tree(root: Path) -> dict[str, bytes | None]:
    out: dict[str, bytes | None] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for d in dirnames:
            out[os.path.relpath(os.path.join(dirpath, d), root)] = None
        for f in filenames:
            p = os.path.join(dirpath, f)
            out[os.path.relpath(p, root)] = Path(p).read_bytes()
    return out


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_a_folder_that_only_looks_like_an_artifact_is_never_deleted(tmp_path: Path) -> None:
    target = tmp_path / "a"
    target.mkdir()
    (target / "graph.mlir").write_text("module attributes {\n}")
    (target / "weights.safetensors").mkdir()
    (target / "weights.safetensors" / "thesis.tex").write_text("years of work")
    before = _tree(tmp_path)
    with pytest.raises(FileExistsError, match="not an artifact"):
        save(_model(), target, example_inputs=(_x(),))
    assert _tree(tmp_path) == before


def test_linked_artifact_files_are_not_an_artifact(tmp_path: Path) -> None:
    target = tmp_path / "a"
    save(_model(), target, example_inputs=(_x(),))
    (tmp_path / "precious.bin").write_bytes(b"keep")
    os.unlink(target / "weights.safetensors")
    os.symlink(tmp_path / "precious.bin", target / "weights.safetensors")
    with pytest.raises(FileExistsError, match="not an artifact"):
        save(_model(), target, example_inputs=(_x(),))
    assert (tmp_path / "precious.bin").read_bytes() == b"keep"


@pytest.mark.parametrize("name", ["a\nb", "a\rb", "tab\there", "bell\x07"])
def test_output_names_the_loader_refuses_are_refused(tmp_path: Path, name: str) -> None:
    with pytest.raises(ExportError, match="control character"):
        save(_model(), tmp_path / "a", example_inputs=(_x(),), output_names=[name])
    assert list(tmp_path.iterdir()) == []


def test_the_loader_check_runs_before_writing(tmp_path: Path) -> None:
    with pytest.raises(ExportError, match="would not load"):
        artifact_dir.check_loadable("module attributes {\n}")


def test_replacing_uses_one_atomic_exchange(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "a"
    save(_model(0), target, example_inputs=(_x(),))
    seen: list[tuple[str, str]] = []
    renames: list[tuple[str, str]] = []
    real_exchange, real_rename = artifact_dir.exchange_paths, os.rename

    def exchange(a: Path, b: Path) -> bool:
        seen.append((Path(a).name, Path(b).name))
        return real_exchange(a, b)

    def rename(a: object, b: object) -> None:
        renames.append((str(a), str(b)))
        real_rename(a, b)  # type: ignore[arg-type]

    monkeypatch.setattr(artifact_dir, "exchange_paths", exchange)
    monkeypatch.setattr(artifact_dir.os, "rename", rename)
    save(_model(1), target, example_inputs=(_x(),))
    assert len(seen) == 1 and seen[0][1] == "a" and renames == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a"]
    load_lattice_program(target)


def test_a_crash_right_after_the_exchange_leaves_the_new_artifact(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "a"
    save(_model(0), target, example_inputs=(_x(),))
    old = (target / "weights.safetensors").read_bytes()

    def crash(folder: Path) -> bool:
        raise KeyboardInterrupt  # the process dies before it deletes the old artifact

    monkeypatch.setattr(artifact_dir, "remove_artifact_files", crash)
    with pytest.raises(KeyboardInterrupt):
        save(_model(1), target, example_inputs=(_x(),))
    assert (target / "weights.safetensors").read_bytes() != old  # the new one, complete
    load_lattice_program(target)


def test_the_fallback_restores_the_old_artifact_when_the_second_rename_fails(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "a"
    save(_model(0), target, example_inputs=(_x(),))
    before = _tree(tmp_path)
    monkeypatch.setattr(artifact_dir, "exchange_paths", lambda a, b: False)
    real_rename = os.rename

    def rename(a: object, b: object) -> None:
        if str(a).endswith(".tmp"):
            raise OSError("disk gone")
        real_rename(a, b)  # type: ignore[arg-type]

    monkeypatch.setattr(artifact_dir.os, "rename", rename)
    with pytest.raises(OSError, match="disk gone"):
        save(_model(1), target, example_inputs=(_x(),))
    assert _tree(tmp_path) == before


def test_the_fallback_replaces_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "a"
    save(_model(0), target, example_inputs=(_x(),))
    old = (target / "weights.safetensors").read_bytes()
    monkeypatch.setattr(artifact_dir, "exchange_paths", lambda a, b: False)
    save(_model(1), target, example_inputs=(_x(),))
    assert (target / "weights.safetensors").read_bytes() != old
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a"]


def test_an_old_artifact_left_by_a_dead_fallback_is_put_back(tmp_path: Path) -> None:
    target = tmp_path / "a"
    save(_model(0), target, example_inputs=(_x(),))
    old = (target / "weights.safetensors").read_bytes()
    left = tmp_path / f".a.{owner_field(_dead_pid())}.0badcafe.old"
    os.rename(target, left)  # the crash between the fallback's two renames
    artifact_dir.clean_stale_temporaries(target)
    assert (target / "weights.safetensors").read_bytes() == old
    assert not left.exists()


def test_stale_temporaries_of_dead_exports_are_cleaned(tmp_path: Path) -> None:
    dead = _dead_pid()
    stale = tmp_path / f".a.{owner_field(dead)}.00000001.tmp"
    stale.mkdir()
    (stale / "graph.mlir").write_text("module attributes {")  # a partial write
    foreign = tmp_path / f".a.{owner_field(dead)}.00000002.tmp"
    foreign.mkdir()
    (foreign / "mine.txt").write_text("not the exporter's")
    live = tmp_path / f".a.{owner_field()}.00000003.tmp"  # a concurrent export in progress
    live.mkdir()
    other = tmp_path / f".b.{owner_field(dead)}.00000004.tmp"  # another target's
    other.mkdir()
    save(_model(), tmp_path / "a", example_inputs=(_x(),))
    assert not stale.exists()
    assert (foreign / "mine.txt").read_text() == "not the exporter's"
    assert live.is_dir() and other.is_dir()


def _artifact_files(folder: Path) -> None:
    folder.mkdir(parents=True)
    (folder / "graph.mlir").write_text("module attributes {")
    (folder / "weights.safetensors").write_bytes(b"w")


def test_a_stale_folder_with_foreign_files_loses_only_its_artifact_files(
        tmp_path: Path) -> None:
    """What the docstrings promise: artifact files go, the rest and the folder stay."""
    mixed = tmp_path / f".a.{owner_field(_dead_pid())}.0000000a.tmp"
    _artifact_files(mixed)
    (mixed / "mine.txt").write_text("not the exporter's")
    artifact_dir.clean_stale_temporaries(tmp_path / "a")
    assert sorted(p.name for p in mixed.iterdir()) == ["mine.txt"]


def test_only_the_exporters_exact_temporary_names_are_cleaned(tmp_path: Path) -> None:
    dead = _dead_pid()
    tag = f"{owner_tag()}-"
    other = "f" * 8 if owner_tag() != "f" * 8 else "e" * 8
    arabic = str(dead).translate(str.maketrans("0123456789", "٠١٢٣٤٥٦٧٨٩"))
    lookalikes = [f".a.{tag}{dead}.0bad.tmp",  # make_temporary's tokens are 8 hex digits
                  f".a.{tag}0{dead}.0badcafe.tmp",  # no pid is written with a leading zero
                  f".a.{tag}{dead}.0BADCAFE.tmp",
                  f".a.{tag}{arabic}.0badcafe.tmp",  # int() reads Arabic-Indic digits too
                  f".a.{tag}99999999999999999999.0badcafe.tmp",  # no pid (OverflowError)
                  f".a.{dead}.0badcafe.tmp",  # no owner tag
                  f".a.{other}-{dead}.0badcafe.tmp"]  # another machine's, boot's, container's
    for name in lookalikes:
        _artifact_files(tmp_path / name)
    before = _tree(tmp_path)
    artifact_dir.clean_stale_temporaries(tmp_path / "a")
    assert _tree(tmp_path) == before


def test_a_stale_name_linked_outside_is_never_followed(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    _artifact_files(outside)
    work = tmp_path / "work"
    work.mkdir()
    os.symlink(outside, work / f".a.{owner_field(_dead_pid())}.0badcafe.tmp")
    artifact_dir.clean_stale_temporaries(work / "a")
    assert not artifact_dir.remove_artifact_files(tmp_path / "missing")
    # A link that replaced the folder after the caller's check (a race) leads nowhere.
    link = work / "swapped"
    os.symlink(outside, link)
    assert artifact_dir.remove_artifact_files(link) is False
    assert sorted(p.name for p in outside.iterdir()) == ["graph.mlir", "weights.safetensors"]
    assert link.is_symlink()


def test_a_failed_write_deletes_only_its_own_files(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from torch_lattice.artifact import export

    target = tmp_path / "a"
    save(_model(0), target, example_inputs=(_x(),))
    before = _tree(tmp_path)

    def broken(*args: object, **kwargs: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(export, "save_file", broken)
    with pytest.raises(OSError, match="disk full"):
        save(_model(1), target, example_inputs=(_x(),))
    assert _tree(tmp_path) == before


def test_exchange_paths_swaps_two_folders(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "from_a").write_text("a")
    swapped = exchange_paths(tmp_path / "a", tmp_path / "b")
    if not sys.platform.startswith("linux"):
        assert swapped is False
        return
    assert swapped is True
    assert (tmp_path / "b" / "from_a").read_text() == "a"
    assert list((tmp_path / "a").iterdir()) == []
    with pytest.raises(FileNotFoundError):
        exchange_paths(tmp_path / "a", tmp_path / "missing")


class _Doubles(nn.Module):
    """An unsupported in-place op on its input (refused before the graph runs)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = tl.nn.SubmConv3d(2, 2, 3)

    def forward(self, x: tl.SparseTensor) -> tl.SparseTensor:
        x.feats.mul_(2)
        return self.conv(x)


def test_a_refused_in_place_op_leaves_the_example_inputs_alone(tmp_path: Path) -> None:
    x = _x()
    feats, coords = x.feats.clone(), x.coords.clone()
    dense = torch.randn(4, 2)
    dense_before = dense.clone()

    class DoublesDense(nn.Module):
        def forward(self, t: torch.Tensor) -> torch.Tensor:
            return t.mul_(2)

    with pytest.raises(ExportError, match="mul_"):
        save(_Doubles().eval(), tmp_path / "a", example_inputs=(x,))
    assert torch.equal(x.feats, feats) and torch.equal(x.coords, coords)
    with pytest.raises(ExportError, match="mul_"):
        save(DoublesDense().eval(), tmp_path / "b", example_inputs=[dense])
    assert torch.equal(dense, dense_before)
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
    # The copies change nothing in what is written: the same export as before.
    files = save(_model(), tmp_path / "c", example_inputs=(x,))
    assert files.artifact_dir == tmp_path / "c"
    assert torch.equal(x.feats, feats)
    # What runs may still edit its input in place (a forward pre-hook): it edits a copy.
    def double(module: nn.Module, args: tuple[tl.SparseTensor]) -> None:
        args[0].feats.mul_(2)  # (a pre-hook returning a value replaces the arguments)

    model = _model()
    model.conv.register_forward_pre_hook(double)
    save(model, tmp_path / "d", example_inputs=(x,))
    assert torch.equal(x.feats, feats)


class _Renormalizes(nn.Module):
    """A refused module that changes its own weight when it runs (an embedding with
    max_norm renormalizes the rows it reads, in place), after a convolution whose
    forward hook counts its calls in a buffer."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv = tl.nn.SubmConv3d(2, 2, 3)
        self.register_buffer("calls", torch.zeros((), dtype=torch.int64))
        self.conv.register_forward_hook(self._count)
        self.emb = nn.Embedding(10, 4, max_norm=1.0)  # rows of norm about 2

    def _count(self, *_: object) -> None:  # (a hook returning a value replaces the output)
        self.calls.add_(1)

    def forward(self, x: tl.SparseTensor, idx: torch.Tensor) -> tuple[object, torch.Tensor]:
        return self.conv(x), self.emb(idx)


def test_a_refused_export_leaves_the_model_state_alone(tmp_path: Path) -> None:
    # Nodes without a lowering are refused before the graph runs: the embedding's rows
    # were renormalized (and the hook's counter raised) before its node was refused.
    model = _Renormalizes().eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(ExportError, match=r"node 'emb' .*Embedding is not exportable"):
        save(model, tmp_path / "a", example_inputs=(_x(), torch.arange(10)))
    after = model.state_dict()
    assert before.keys() == after.keys()
    assert all(torch.equal(before[k], after[k]) for k in before), [
        k for k in before if not torch.equal(before[k], after[k])
    ]
    assert not (tmp_path / "a").exists()


def test_dot_names_the_current_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Path(".") has an empty name: it once gave "ValueError: PosixPath('.') has an empty
    # name" while "<dir>/." worked.
    folder = tmp_path / "out"
    folder.mkdir()
    monkeypatch.chdir(folder)
    files = save(_model(), ".", example_inputs=(_x(),))
    assert files.artifact_dir == folder.resolve()
    assert sorted(p.name for p in folder.iterdir()) == ["graph.mlir", "weights.safetensors"]
    load_lattice_program(folder)
    # "." is now an artifact: exporting again replaces it.
    monkeypatch.chdir(folder)
    save(_model(1), ".", example_inputs=(_x(),))
    load_lattice_program(folder)


@pytest.mark.parametrize("exchange", [True, False], ids=["exchange", "fallback"])
def test_a_name_near_the_file_name_limit_is_written_and_replaced(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, exchange: bool) -> None:
    """The temporary folder's name adds 25 bytes to the target's: a valid name near the
    255-byte limit failed with ENAMETOOLONG on a hidden path the user never named."""
    name = "é" * 100 + "a" * 50  # 250 bytes in UTF-8
    target = tmp_path / name
    save(_model(0), target, example_inputs=(_x(),))
    old = (target / "weights.safetensors").read_bytes()
    if not exchange:
        monkeypatch.setattr(artifact_dir, "exchange_paths", lambda a, b: False)
    save(_model(1), target, example_inputs=(_x(),))
    assert (target / "weights.safetensors").read_bytes() != old
    assert [p.name for p in tmp_path.iterdir()] == [name]
    # A stale temporary of a dead export to it carries the cut name and is cleaned.
    stem = artifact_dir._temp_stem(target)
    stale = tmp_path / f".{stem}.{owner_field(_dead_pid())}.00000001.tmp"
    _artifact_files(stale)
    artifact_dir.clean_stale_temporaries(target)
    assert not stale.exists()


@pytest.mark.parametrize("before", ["missing", "empty"])
def test_a_folder_made_at_the_target_while_exporting_is_left_alone(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, before: str) -> None:
    """The destination was checked only before the export: a folder of someone else's
    that appeared at the target meanwhile was swapped out into a hidden folder."""
    from torch_lattice.artifact import export

    target = tmp_path / "a"
    if before == "empty":
        target.mkdir()
    real = export.save_file

    def save_file(*args: object, **kwargs: object) -> None:
        real(*args, **kwargs)
        target.mkdir(exist_ok=True)
        (target / "notes.txt").write_text("mine")

    monkeypatch.setattr(export, "save_file", save_file)
    with pytest.raises(FileExistsError, match="exists and is not an artifact"):
        save(_model(), target, example_inputs=(_x(),))
    assert _tree(tmp_path) == {"a": None, os.path.join("a", "notes.txt"): b"mine"}


@pytest.mark.parametrize("name", ["a\0b", "a\0/b"], ids=["in_the_name", "in_the_parent"])
def test_a_nul_byte_names_artifact_dir(tmp_path: Path, name: str) -> None:
    """A bare "embedded null byte", or a parent folder said not to exist, before."""
    with pytest.raises(ExportError, match=r"artifact_dir .* contains a NUL byte"):
        save(_model(), str(tmp_path / name), example_inputs=(_x(),))
    assert list(tmp_path.iterdir()) == []


def test_a_nul_byte_names_the_loaded_artifact_dir(tmp_path: Path) -> None:
    """It read "is not a directory" before."""
    with pytest.raises(ValueError, match=r"artifact_dir .* contains a NUL byte"):
        load_lattice_program(str(tmp_path / "a\0b"))
