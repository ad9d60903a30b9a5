"""``convert-checkpoint`` refusals found by probing it as a hostile user would: inputs
that would allocate gigabytes or crash the writer, optimizer state nested below the top
level, output paths that are not a file to write, ``--force`` when the manifest cannot be
placed, and SIGTERM in the middle of writing."""

from __future__ import annotations

import collections
import io
import json
import os
import pickle
import signal
import struct
import tracemalloc
import warnings
import zipfile
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

import torch_lattice as tl
from torch_lattice.atomic_file import exchange_paths
from torch_lattice.migration import OptimizerStateError, cli, loading, writing

try:
    from converter_cli_helpers import files, refused
except ImportError:  # tests/ may become a package; then they are imported through it
    from tests.converter_cli_helpers import files, refused

SPEC = {"enc.kernel": [3, 3, 3]}


def _state(seed: int = 0) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return {"enc.kernel": torch.randn(27, 2, 4, generator=gen), "bn.weight": torch.ones(4)}


@pytest.fixture
def work(tmp_path: Path) -> Path:
    torch.save({"model": _state()}, tmp_path / "legacy.pt")
    (tmp_path / "spec.json").write_text(json.dumps(SPEC))
    return tmp_path


def _argv(work: Path, source: str = "legacy.pt", output: str = "out.safetensors",
          *extra: str) -> list[str]:
    return [str(work / source), output if output.startswith("/") or not output else
            str(work / output), "--kernel-spec", str(work / "spec.json"), *extra]


def test_an_empty_kernel_cannot_ask_for_gigabytes(work: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    # 2^20 kernel rows of no channels: a 1 KB file whose spec alone would size the
    # permutation, positions and manifest (about 290 bytes a row).
    torch.save({"model": {"enc.kernel": torch.empty(2**20, 0, 4)}}, work / "empty.pt")
    (work / "spec.json").write_text(json.dumps({"enc.kernel": [128, 128, 64]}))
    refused(capsys, _argv(work, "empty.pt"), "holds no weights")
    assert not (work / "out.safetensors").exists()


@pytest.mark.parametrize("kind", ["sparse", "quantized", "meta"])
def test_tensors_without_dense_values_are_refused(work: Path, kind: str,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    if kind == "quantized":
        with warnings.catch_warnings():  # torch deprecates quantized tensors; files hold them
            warnings.simplefilter("ignore")
            odd = torch.quantize_per_tensor(torch.randn(4), 0.1, 0, torch.qint8)
    else:
        odd = torch.randn(3, 3).to_sparse() if kind == "sparse" else torch.empty(3, device="meta")
    torch.save({"model": {**_state(), "odd": odd}}, work / "odd.pt")
    refused(capsys, _argv(work, "odd.pt"), f"'odd' is a {kind}")
    assert set(files(work)) == {"legacy.pt", "spec.json", "odd.pt"}


@pytest.mark.parametrize("nest", ["list", "dict", "tuple"])
def test_optimizer_state_is_refused_at_any_depth(work: Path, nest: str,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    param = torch.nn.Parameter(torch.randn(3))
    opt = torch.optim.SGD([param], lr=0.1, momentum=0.9)
    param.sum().backward()
    opt.step()
    saved: Any = {"list": [opt.state_dict()], "dict": {"sgd": opt.state_dict()},
                  "tuple": (1, {"inner": [opt.state_dict()]})}[nest]
    torch.save({"model": _state(), "extra": saved}, work / "nested.pt")
    refused(capsys, _argv(work, "nested.pt"), "optimizer state under 'extra'")
    # Below the top level only an optimizer state dict's shape counts, not a name: a
    # hyper-parameter or metric container may well be called "optimizer".
    for extra in ({"config": {"optimizer": {"lr": 0.1}}}, {"metrics": {"optimal_iou": [0.5]}},
                  {"config": {"optimizer": "adam"}}):
        torch.save({"model": _state(), **extra}, work / "fine.pt")
        assert cli.main(_argv(work, "fine.pt")) == 0
        (work / "out.safetensors").unlink()
        (work / "out.json").unlink()


_MAGIC = 0x1950A86A20F9469CFC6C  # torch's pre-zip magic number


class _Storage:
    pass


def _prezip_claiming(*claims: int) -> bytes:
    """A pre-zip checkpoint of 4-float tensors, one per claim, all over the storage of
    key "0", which each names as ``claim`` floats (4 are stored): torch allocates the
    first claim."""
    storages = [_Storage() for _ in claims]

    class Tensor:
        def __init__(self, storage: _Storage) -> None:
            self.storage = storage

        def __reduce__(self) -> Any:
            return (torch._utils._rebuild_tensor_v2,
                    (self.storage, 0, (4,), (1,), False, collections.OrderedDict()))

    class Pickler(pickle.Pickler):
        def persistent_id(self, obj: Any) -> Any:
            for storage, numel in zip(storages, claims, strict=True):
                if obj is storage:
                    return ("storage", torch.FloatStorage, "0", "cpu", numel, None)
            return None

    buf = io.BytesIO()
    for header in (_MAGIC, 1001, {"protocol_version": 1001, "little_endian": True,
                                  "type_sizes": {"short": 2, "int": 4, "long": 4}}):
        pickle.dump(header, buf, protocol=2)
    Pickler(buf, protocol=2).dump(
        {"model": {f"bn{i}.bias": Tensor(storage) for i, storage in enumerate(storages)}})
    pickle.dump(["0"], buf, protocol=2)
    buf.write(struct.pack("<q", 4) + b"\0" * 16)
    return buf.getvalue()


def test_a_prezip_storage_claim_beyond_the_file_is_refused_before_torch_allocates(
        work: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (work / "spec.json").write_text("{}")
    (work / "fits.pt").write_bytes(_prezip_claiming(4))
    assert cli.main(_argv(work, "fits.pt")) == 0  # the hand-made file is a valid one
    # 8 and 32 GiB claimed by a file of a few hundred bytes; a later, small mention of
    # the same storage does not hide the first (the one torch allocates).
    for claims in ((2**31,), (2**33,), (2**33, 4)):
        (work / "claims.pt").write_bytes(_prezip_claiming(*claims))
        assert (work / "claims.pt").stat().st_size < 1000
        refused(capsys, _argv(work, "claims.pt", "big.safetensors"),
                 f"claim {claims[0] * 4} bytes of storage")
    assert not (work / "big.safetensors").exists()


def test_a_real_prezip_checkpoint_still_converts(work: Path) -> None:
    base = torch.randn(10)
    state = {**_state(), "view": base[2:5], "base": base, "ids": torch.arange(6)}
    torch.save({"model": state}, work / "old.pt", _use_new_zipfile_serialization=False)
    assert cli.main(_argv(work, "old.pt")) == 0
    converted = load_file(str(work / "out.safetensors"))
    for key in ("view", "base", "ids", "bn.weight"):
        assert torch.equal(converted[key], state[key]), key


def test_a_dangling_link_is_an_existing_output(work: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    # A link is never replaced, with --force or without (as save_tuning and the artifact
    # exporter refuse one): the message says so rather than suggesting --force.
    os.symlink(work / "nowhere" / "x.safetensors", work / "out.safetensors")
    for extra in ([], ["--force"]):
        refused(capsys, _argv(work, "legacy.pt", "out.safetensors", *extra),
                "exists and is a symbolic link; --force replaces only regular files")
        assert (work / "out.safetensors").is_symlink()
    assert not (work / "out.json").exists()


def test_an_output_must_name_a_file(work: Path, capsys: pytest.CaptureFixture[str]) -> None:
    refused(capsys, _argv(work, "legacy.pt", str(work / "new") + "/"),
             "output '" + str(work / "new") + "/' ends with a path separator")
    assert not (work / "new").exists() and not (work / "new.json").exists()
    refused(capsys, [str(work / "legacy.pt"), "", "--kernel-spec", str(work / "spec.json")],
             "output is an empty path")
    refused(capsys, _argv(work, "legacy.pt", "out.safetensors", "--manifest", ""),
             "manifest is an empty path")
    assert set(files(work)) == {"legacy.pt", "spec.json"}


def _converted_twice(work: Path) -> dict[str, bytes]:
    assert cli.main(_argv(work)) == 0
    torch.save({"model": _state(seed=1)}, work / "legacy.pt")
    return files(work)


@pytest.mark.parametrize("swap", [True, False], ids=["exchange", "link"])
def test_force_keeps_both_old_outputs_when_the_manifest_cannot_be_placed(
        work: Path, swap: bool, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    before = _converted_twice(work)
    manifest = work / "out.json"

    def exchange(a: Path, b: Path) -> bool:
        if Path(b) == manifest:
            raise PermissionError(1, "Operation not permitted", str(b))
        return exchange_paths(a, b) if swap else False

    real_replace = os.replace

    def replace(src: Any, dst: Any) -> None:
        if Path(dst) == manifest:
            raise PermissionError(1, "Operation not permitted", str(dst))
        real_replace(src, dst)

    monkeypatch.setattr(writing, "exchange_paths", exchange)
    monkeypatch.setattr(writing.os, "replace", replace)
    assert cli.main(_argv(work, "legacy.pt", "out.safetensors", "--force")) == 1
    assert "cannot write outputs" in capsys.readouterr().err
    assert files(work) == before  # the old weights and manifest, and nothing else


@pytest.mark.parametrize("keep", ["exchange", "link", "copy"])
def test_force_replaces_both_outputs_and_keeps_no_old_copy(
        work: Path, keep: str, monkeypatch: pytest.MonkeyPatch) -> None:
    before = _converted_twice(work)
    if keep != "exchange":
        monkeypatch.setattr(writing, "exchange_paths", lambda a, b: False)
    if keep == "copy":  # a file system without hard links
        def no_link(*args: Any, **kwargs: Any) -> None:
            raise PermissionError(1, "Operation not permitted")
        monkeypatch.setattr(writing.os, "link", no_link)
    assert cli.main(_argv(work, "legacy.pt", "out.safetensors", "--force")) == 0
    after = files(work)
    assert set(after) == set(before)
    assert after["out.safetensors"] != before["out.safetensors"]
    assert after["out.json"] != before["out.json"]


def test_sigterm_while_writing_removes_the_temporary_files(
        work: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    def save_file(tensors: Any, path: str, metadata: Any = None) -> None:
        Path(path).write_bytes(b"partial")
        os.kill(os.getpid(), signal.SIGTERM)  # handled between bytecodes: raised here

    monkeypatch.setattr(writing, "save_file", save_file)
    previous = signal.getsignal(signal.SIGTERM)
    assert cli.main(_argv(work)) == 128 + signal.SIGTERM
    assert "terminated (SIGTERM)" in capsys.readouterr().err
    assert set(files(work)) == {"legacy.pt", "spec.json"}
    assert signal.getsignal(signal.SIGTERM) == previous  # the handler was put back


def test_ctrl_c_while_writing_is_one_line_and_removes_the_temporary_files(
        work: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    def save_file(tensors: Any, path: str, metadata: Any = None) -> None:
        Path(path).write_bytes(b"partial")
        raise KeyboardInterrupt  # what Python's SIGINT handler raises

    monkeypatch.setattr(writing, "save_file", save_file)
    assert cli.main(_argv(work)) == 128 + signal.SIGINT
    err = capsys.readouterr().err
    assert err.startswith("error: interrupted (Ctrl-C)") and "Traceback" not in err
    assert set(files(work)) == {"legacy.pt", "spec.json"}


def test_a_tensor_safetensors_cannot_write_is_a_refusal(
        work: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    def save_file(tensors: Any, path: str, metadata: Any = None) -> None:
        raise KeyError(torch.qint8)  # what safetensors raises for a dtype it has no code for

    monkeypatch.setattr(writing, "save_file", save_file)
    refused(capsys, _argv(work), "cannot write the converted tensors as safetensors")
    assert set(files(work)) == {"legacy.pt", "spec.json"}


def test_sigterm_while_outputs_are_placed_waits_until_both_are(
        work: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    before = _converted_twice(work)
    real_place = writing._place

    def place(temp: Path, final: Path) -> Any:
        done = real_place(temp, final)
        os.kill(os.getpid(), signal.SIGTERM)  # held: handled once both are in place
        return done

    monkeypatch.setattr(writing, "_place", place)
    assert cli.main(_argv(work, "legacy.pt", "out.safetensors", "--force")) == 143
    assert "terminated (SIGTERM)" in capsys.readouterr().err
    after = files(work)
    assert set(after) == set(before)  # no temporary or old copy left
    assert after["out.safetensors"] != before["out.safetensors"]
    assert after["out.json"] != before["out.json"]  # both new: never one of each


def test_a_prezip_pickle_cannot_make_the_scan_allocate() -> None:
    """Found by the checkpoint fuzzer: the C unpickler grows its memo array to the largest
    LONG_BINPUT index (the scan's memo is a dict), and BYTEARRAY8 allocates its declared
    length before reading (refused): a few bytes asked for gigabytes."""
    import tracemalloc

    from torch_lattice.migration.prezip import claimed_storage_bytes

    buf = io.BytesIO()
    for header in (_MAGIC, 1001, {}):
        pickle.dump(header, buf, protocol=2)
    head = buf.getvalue()
    memo = head + b"\x80\x02N" + b"r" + struct.pack("<I", 2**31) + b"."  # None, memo[2^31]
    # BYTEARRAY8 of 3.2 GB: the pure-Python unpickler allocates it before reading it
    bytearray8 = head + b"\x96" + struct.pack("<Q", 0xC3050000)
    tracemalloc.start()
    try:
        assert claimed_storage_bytes(memo) == 0
        with pytest.raises(pickle.UnpicklingError, match="protocol-5 bytearray"):
            claimed_storage_bytes(bytearray8)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 2**24, peak


@pytest.mark.parametrize("blocker", ["file", "dangling_link"])
@pytest.mark.parametrize("which", ["output", "manifest"])
def test_an_output_under_a_file_is_refused_before_any_folder_is_made(
        work: Path, capsys: pytest.CaptureFixture[str], blocker: str, which: str) -> None:
    """The other output's new folders were made, then the write failed (exit 1) and left
    them behind; now nothing is made and the refusal names the argument and the path."""
    if blocker == "file":
        (work / "blocker").write_text("x")
    else:
        (work / "blocker").symlink_to(work / "missing")
    blocked, fine = str(work / "blocker" / "sub" / "o.json"), str(work / "new" / "dir" / "o.st")
    output, manifest = (blocked, fine) if which == "output" else (fine, blocked)
    label = "output" if which == "output" else "manifest (--manifest)"
    kind = "a file" if blocker == "file" else "a symbolic link"
    before = files(work)
    refused(capsys, [str(work / "legacy.pt"), output, "--kernel-spec", str(work / "spec.json"),
                     "--manifest", manifest],
            f"{label} {blocked!r} cannot be written: {str(work / 'blocker')!r} is {kind}")
    assert sorted(p.name for p in work.iterdir()) == ["blocker", "legacy.pt", "spec.json"]
    assert files(work) == before


def _pair(work: Path) -> tuple[str, dict[str, torch.Tensor]]:
    """The manifest's source digest and the converted weights (tensors: the header's
    metadata order varies between writes)."""
    manifest = json.loads((work / "out.json").read_text())
    return manifest["source_sha256"], load_file(work / "out.safetensors")


def test_two_conversions_to_the_same_outputs_never_mix_their_pairs(
        work: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A second conversion that ran between the first's two renames left the second's
    weights beside the first's manifest. Each now places its pair under a lock on the
    outputs' folder, so the pair on disk is always one conversion's."""
    import hashlib
    import threading

    torch.save({"model": _state(seed=1)}, work / "other.pt")
    digest = {name: hashlib.sha256((work / name).read_bytes()).hexdigest()
              for name in ("legacy.pt", "other.pt")}
    real_place = writing._place
    second = threading.Thread(target=lambda: writing_done.append(
        cli.main(_argv(work, "other.pt", "out.safetensors", "--force"))))
    writing_done: list[int] = []

    def place(temp: Path, final: Path) -> Any:
        done = real_place(temp, final)
        if final.suffix == ".safetensors" and not second.is_alive() and not writing_done:
            second.start()
            second.join(timeout=3)  # finishes here unless it waits for the lock
        return done

    monkeypatch.setattr(writing, "_place", place)
    assert cli.main(_argv(work, "legacy.pt", "out.safetensors")) == 0
    second.join()
    assert writing_done == [0]
    sha, weights = _pair(work)
    assert sha == digest["other.pt"]  # the second, which placed its pair last
    monkeypatch.setattr(writing, "_place", real_place)
    assert cli.main(_argv(work, "other.pt", "again.safetensors")) == 0
    again = load_file(work / "again.safetensors")
    assert weights.keys() == again.keys()
    assert all(torch.equal(weights[k], again[k]) for k in again)  # its own weights


def test_an_output_made_meanwhile_is_not_replaced_without_force(
        work: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Outputs are checked for --force before converting; one made by another program
    while this one converted was replaced all the same."""
    real = writing.write_beside

    def write_beside(path: Path, write: Any) -> Path:
        temp = real(path, write)
        if path.suffix == ".json":  # both temporary files made: someone writes the output
            (work / "out.json").write_text("theirs")
        return temp

    monkeypatch.setattr(writing, "write_beside", write_beside)
    before = files(work)
    refused(capsys, _argv(work), "manifest (--manifest) "
            f"{str(work / 'out.json')!r} appeared while converting; pass --force to overwrite")
    after = files(work)
    assert after == {**before, "out.json": b"theirs"}


def test_loading_converted_weights_checks_the_memory_budget(work: Path) -> None:
    """load_converted read the whole file with safetensors' reader, whatever its size."""
    import torch_lattice as tl
    from torch_lattice import migration

    assert cli.main(_argv(work)) == 0
    out = work / "out.safetensors"
    module = tl.nn.SubmConv3d(2, 4, 3)
    model = torch.nn.Module()
    model.enc = module
    model.bn = torch.nn.Module()
    model.bn.register_buffer("weight", torch.zeros(4))
    migration.load_converted(model, out)
    assert torch.equal(model.bn.weight, torch.ones(4))
    previous = tl.set_memory_budget(out.stat().st_size - 1)
    try:
        with pytest.raises(migration.ConversionError,
                           match=r"reading converted weights .* beyond the memory budget"):
            migration.load_converted(model, out)
    finally:
        tl.set_memory_budget(previous)


def test_a_long_key_referenced_many_times_costs_no_memory_in_the_optimizer_scan(
        work: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # A 100 KB key over a list of 2,000 references to one empty list: the scan once wrote
    # every child's location as text before skipping the ones it had seen (200 MB here;
    # 3 GB from a 160 KB file with 30,000 references).
    shared: list[Any] = []
    tracemalloc.start()
    try:
        loading._refuse_optimizer_state({"model": _state(), "A" * 100_000: [shared] * 2000})
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 * 2**20, peak
    # The error still says where, each key cut short.
    param = torch.nn.Parameter(torch.randn(3))
    opt = torch.optim.SGD([param], lr=0.1)
    torch.save({"model": _state(), "B" * 100_000: [[shared], {"k": opt.state_dict()}]},
               work / "long.pt")
    refused(capsys, _argv(work, "long.pt"), "optimizer state under 'BBBBB")
    with pytest.raises(OptimizerStateError) as info:
        loading._refuse_optimizer_state(torch.load(work / "long.pt", weights_only=True))
    assert f"'{'B' * 56}...[1]['k']" in str(info.value)
    assert len(str(info.value)) < 400


def _deflated_zeros_checkpoint(path: Path, entries: int, numel: int) -> None:
    """A torch zip checkpoint of ``entries`` float tensors of ``numel`` zeros, stored
    deflated (torch.save stores entries as they are; torch.load reads either)."""
    buf = io.BytesIO()
    torch.save({"model": {f"bn{i}.bias": torch.zeros(numel) for i in range(entries)}}, buf)
    with zipfile.ZipFile(buf) as src, zipfile.ZipFile(path, "w") as dst:
        for info in src.infolist():
            dst.writestr(info.filename, src.read(info), compress_type=zipfile.ZIP_DEFLATED)


def test_deflated_entries_are_checked_at_their_inflated_size_together(
        work: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (work / "spec.json").write_text("{}")
    _deflated_zeros_checkpoint(work / "deflated.pt", 3, 2**20)  # 3 x 4 MiB, about 12 KB
    assert (work / "deflated.pt").stat().st_size < 2**16
    assert cli.main(_argv(work, "deflated.pt")) == 0  # a valid checkpoint, read as such
    (work / "out.safetensors").unlink()
    (work / "out.json").unlink()
    # Each entry fits a 10 MiB budget, the three together do not: refused before torch
    # inflates any (it would allocate all three first).
    def inflate(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("torch.load ran")

    previous = tl.set_memory_budget(10 * 2**20)
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(torch, "load", inflate)
            refused(capsys, _argv(work, "deflated.pt"), "loading source checkpoint")
    finally:
        tl.set_memory_budget(previous)
    assert not (work / "out.safetensors").exists()
