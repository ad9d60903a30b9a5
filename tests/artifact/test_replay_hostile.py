"""Replay and its command line under hostile fixtures (issue 21).

Each case builds a small fixture in tmp_path, breaks one thing and checks that the
replay refuses it cleanly: the CLI exits 2 with one ``error:`` line for a refused
argument or manifest, 1 for a case that fails, never lists a folder's contents,
never reads outside the fixture folder and never blocks on a FIFO. Program outputs
must have the types and shapes the graph declares, and physical coordinates and
strides must fit int32.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

import torch_lattice as tl
from torch_lattice.artifact import load_lattice_program
from torch_lattice.artifact.__main__ import main

try:
    from artifact_replay_helpers import (
        SP,
        Graph,
        sparse_inputs,
        triple,
        weight_type,
        write_artifact,
    )
except ImportError:  # tests/ may become a package
    from tests.artifact_replay_helpers import (
        SP,
        Graph,
        sparse_inputs,
        triple,
        weight_type,
        write_artifact,
    )

SECRETS = ("id_rsa", "passwords.txt")


@pytest.fixture
def budget_1gib():
    """A fixed memory budget, so the refusals do not depend on this machine's memory."""
    previous = tl.set_memory_budget(2**30)
    yield
    tl.set_memory_budget(previous)


def _identity_graph() -> Graph:
    """sparse.make of x (2 channels) returned as it is."""
    g = Graph()
    g.sparse_input("x", 2)
    g.output("x", SP)
    return g


def _case(root: Path, name: str = "case") -> Path:
    """A fixture case whose replay matches its expected file."""
    case = write_artifact(root / name, _identity_graph(), {})
    coords = torch.tensor([[0, 1, 2, 3], [1, 0, 0, 0]], dtype=torch.int32)
    feats = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    save_file(sparse_inputs("x", coords, feats), str(case / "inputs.safetensors"))
    save_file({"output.coords": coords, "output.features": feats,
               "output.active": torch.tensor([2], dtype=torch.int32)},
              str(case / "expected.safetensors"))
    return case


def _manifest(root: Path, cases: list[dict[str, object]]) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "manifest.json").write_text(json.dumps({"cases": cases}), encoding="utf-8")
    return root


def _private(tmp_path: Path) -> Path:
    private = tmp_path / "private"
    private.mkdir()
    for name in SECRETS:
        (private / name).write_text("secret")
    return private


def _refused(capsys: pytest.CaptureFixture[str], argv: list[str], fragment: str) -> str:
    assert main(argv) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), captured.err
    assert fragment in lines[0], lines[0]
    return captured.out + captured.err


def test_a_good_fixture_matches(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "fixtures"
    _case(root)
    _manifest(root, [{"name": "case", "rtol": 0, "atol": 0}])
    assert main(["replay", str(root)]) == 0
    assert "1/1 cases match" in capsys.readouterr().out


@pytest.mark.parametrize("name", ["../private", "/etc", "a/b", "..", ".", "", "x\nid", 7])
def test_case_names_must_be_plain_folder_names(tmp_path: Path, name: object,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    _private(tmp_path)
    root = tmp_path / "fixtures"
    _case(root)
    _manifest(root, [{"name": "case"}, {"name": name}])
    text = _refused(capsys, ["replay", str(root)], "case name")
    assert not any(secret in text for secret in SECRETS)


def test_a_case_folder_linked_outside_is_refused_without_listing_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    private = _private(tmp_path)
    root = tmp_path / "fixtures"
    _case(root)
    os.symlink(private, root / "linked")
    _manifest(root, [{"name": "case"}, {"name": "linked"}])
    assert main(["replay", str(root)]) == 1
    out = capsys.readouterr().out
    assert "symbolic link" in out and "1/2 cases match" in out
    assert not any(secret in out for secret in SECRETS)


def test_the_loader_never_lists_unexpected_files(tmp_path: Path) -> None:
    case = _case(tmp_path)
    for name in SECRETS:
        (case / name).write_text("secret")
    with pytest.raises(ValueError, match="2 unexpected other entries") as info:
        load_lattice_program(case)
    assert not any(secret in str(info.value) for secret in SECRETS)


@pytest.mark.parametrize("key,value", [("atol", -1), ("atol", float("nan")),
                                       ("rtol", float("inf")), ("rtol", "1e-3"),
                                       ("atol", True)])
def test_manifest_tolerances_must_be_finite_and_non_negative(
        tmp_path: Path, key: str, value: object, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "fixtures"
    _case(root)
    # json.dumps writes NaN and Infinity, as a hostile manifest would hold them.
    _manifest(root, [{"name": "case", key: value}])
    _refused(capsys, ["replay", str(root)], key)


@pytest.mark.parametrize("flag,value", [("--atol", "-1"), ("--rtol", "nan"), ("--atol", "inf")])
def test_command_line_tolerances_are_checked(tmp_path: Path, flag: str, value: str,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    case = _case(tmp_path)
    _refused(capsys, ["replay", str(case), flag, value], flag)


def test_an_infinite_tolerance_cannot_pass_a_wrong_output(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "fixtures"
    case = _case(root)
    expected = {"output.coords": torch.tensor([[0, 1, 2, 3], [1, 0, 0, 0]], dtype=torch.int32),
                "output.features": torch.tensor([[100.0, 2.0], [3.0, 4.0]]),
                "output.active": torch.tensor([2], dtype=torch.int32)}
    save_file(expected, str(case / "expected.safetensors"))
    _manifest(root, [{"name": "case", "rtol": float("inf")}])
    assert main(["replay", str(root)]) == 2
    _manifest(root, [{"name": "case"}])
    assert main(["replay", str(root)]) == 1  # the wrong feature really fails


def test_an_expected_directory_is_a_failure_not_a_match(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    case = _case(tmp_path)
    (case / "expected.safetensors").unlink()
    (case / "expected.safetensors").mkdir()
    assert main(["replay", str(case)]) == 1
    out = capsys.readouterr().out
    assert "MISMATCH" in out and "match (" not in out.replace("MISMATCH", "")


def test_a_missing_expected_file_is_a_failure_unless_no_compare(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "fixtures"
    case = _case(root)
    (case / "expected.safetensors").unlink()
    assert main(["replay", str(case)]) == 1
    assert "does not exist" in capsys.readouterr().out
    _manifest(root, [{"name": "case"}])
    assert main(["replay", str(root)]) == 1
    assert "0/1 cases match" in capsys.readouterr().out
    assert main(["replay", str(case), "--no-compare"]) == 0
    assert "--no-compare" in capsys.readouterr().out


def test_a_fifo_input_never_blocks_the_replay(tmp_path: Path) -> None:
    case = _case(tmp_path)
    (case / "inputs.safetensors").unlink()
    os.mkfifo(case / "inputs.safetensors")
    spare = _case(tmp_path, "spare")
    os.mkfifo(tmp_path / "fifo.safetensors")
    # A subprocess with a timeout: a regression would hang, not fail, in-process.
    for argv in (["replay", str(case)],
                 ["replay", str(spare), "--inputs", str(tmp_path / "fifo.safetensors")],
                 ["replay", str(spare), "--expected", str(tmp_path / "fifo.safetensors")]):
        run = subprocess.run([sys.executable, "-m", "torch_lattice.artifact", *argv],
                             capture_output=True, text=True, timeout=120, check=False)
        assert run.returncode in (1, 2), run
        assert "FIFO" in run.stdout + run.stderr, run


def test_a_fifo_is_refused_by_the_reader(tmp_path: Path) -> None:
    from torch_lattice.regular_file import read_regular_file

    os.mkfifo(tmp_path / "f")
    with pytest.raises(ValueError, match="is a FIFO"):
        read_regular_file(tmp_path / "f", "inputs")
    with pytest.raises(ValueError, match="is a directory"):
        read_regular_file(tmp_path, "inputs")
    (tmp_path / "big").write_bytes(b"x" * 100)
    with pytest.raises(ValueError, match="at most 10"):
        read_regular_file(tmp_path / "big", "inputs", max_bytes=10)
    assert read_regular_file(tmp_path / "big", "inputs") == b"x" * 100


def test_a_manifest_that_is_not_json_is_one_error_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "fixtures"
    _case(root)
    (root / "manifest.json").write_bytes(b"{\xff")
    _refused(capsys, ["replay", str(root)], "not UTF-8 JSON")


# --- declared result types and shapes ------------------------------------------------------


def _linear_program(tmp_path: Path, declared: str, outputs: int):
    g = Graph()
    g.tensor_input("f", "tensor<?x4xf32>")
    g.weight("w", "fc.weight", "linear")
    g.op("y", "linear", ["f", "w"], ["tensor<?x4xf32>", weight_type("linear")], "", declared)
    g.output("y", declared)
    root = write_artifact(tmp_path / "lin", g, {"fc.weight": torch.randn(outputs, 4)})
    return load_lattice_program(root)


def test_an_output_must_have_its_declared_shape(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"declared tensor<\?x2xf32> .* shape \(1, 7\)"):
        _linear_program(tmp_path, "tensor<?x2xf32>", 7)(f=torch.randn(1, 4))
    assert _linear_program(tmp_path, "tensor<?x7xf32>", 7)(f=torch.randn(1, 4))[
        "output"].shape == (1, 7)


def _round_program(tmp_path: Path):
    g = Graph()
    g.tensor_input("f", "tensor<?x4xf32>")
    g.op("y", "elementwise", ["f"], ["tensor<?x4xf32>"], 'kind = "round"', "tensor<?x4xi32>")
    g.output("y", "tensor<?x4xi32>")
    return load_lattice_program(write_artifact(tmp_path / "round", g, {}))


def test_a_float_declared_i32_never_wraps(tmp_path: Path) -> None:
    program = _round_program(tmp_path)
    got = program(f=torch.tensor([[1.0, -2.0, 3.4, 2.5e9 - 2.5e9]]))["output"]
    assert got.dtype == torch.int32 and got.tolist() == [[1, -2, 3, 0]]
    with pytest.raises(ValueError, match=r"declared torch.int32.*holds 3000000000"):
        program(f=torch.tensor([[3e9, 0.0, 0.0, 0.0]]))
    with pytest.raises(ValueError, match="non-finite"):
        program(f=torch.tensor([[float("inf"), 0.0, 0.0, 0.0]]))


# --- int32 physical coordinates and strides --------------------------------------------


def _transpose_program(tmp_path: Path, stride: int, conv_stride: int | None = None):
    g = Graph()
    g.sparse_input("x", 1, (stride,) * 3)
    g.weight("w", "w", "conv3d")
    conv = (f"{triple('kernel_size', (2, 2, 2))}, {triple('stride', (1, 1, 1))}, "
            'accumulation = "canonical_f32"')
    g.op("y", "generative_conv_transpose3d", ["x", "w"], [SP, weight_type("conv3d")], conv, SP)
    out = "y"
    if conv_stride is not None:
        g.weight("w2", "w2", "conv3d")
        attrs = (f"{triple('kernel_size', (1, 1, 1))}, {triple('stride', (conv_stride,) * 3)}, "
                 f"{triple('padding', (0, 0, 0))}, {triple('dilation', (1, 1, 1))}, "
                 'accumulation = "canonical_f32"')
        out = g.op("z", "conv3d", ["y", "w2"], [SP, weight_type("conv3d")], attrs, SP)
    g.output(out, SP)
    weights = {"w": torch.ones(1, 2, 2, 2, 1), "w2": torch.ones(1, 1, 1, 1, 1)}
    if conv_stride is None:
        del weights["w2"]
    return load_lattice_program(write_artifact(tmp_path / "t", g, weights))


def test_physical_coordinates_beyond_int32_are_an_error_naming_the_value(
        tmp_path: Path) -> None:
    program = _transpose_program(tmp_path, 2**20)
    ok = program(**sparse_inputs("x", torch.tensor([[0, 2**20, 0, 0]], dtype=torch.int32),
                                 torch.ones(1, 1)))["output"]
    assert int(ok.coords.min()) >= 0 and int(ok.coords.max()) == 2 * 2**20
    top = torch.tensor([[0, 2**31 - 2**20, 0, 0]], dtype=torch.int32)
    with pytest.raises(ValueError, match=r"physical coordinate 2147483648 .*int32"):
        program(**sparse_inputs("x", top, torch.ones(1, 1)))


def test_a_total_stride_beyond_int32_is_a_value_error_naming_the_line(tmp_path: Path) -> None:
    program = _transpose_program(tmp_path, 2**20, conv_stride=2**20)
    coords = torch.tensor([[0, 0, 0, 0]], dtype=torch.int32)
    with pytest.raises(ValueError, match=r"graph.mlir line \d+: lattice.conv3d: total stride"):
        program(**sparse_inputs("x", coords, torch.ones(1, 1)))


def test_global_pool_at_the_last_batch_index_is_refused_before_allocating(
        tmp_path: Path, budget_1gib: None) -> None:
    g = Graph()
    g.sparse_input("x", 2)
    g.op("p", "global_pool", ["x"], [SP], "mode = #lattice.pool_mode<sum>, batch_size = -1",
         "tensor<?x2xf32>")
    g.output("p", "tensor<?x2xf32>")
    program = load_lattice_program(write_artifact(tmp_path / "gp", g, {}))
    coords = torch.tensor([[2**31 - 1, 0, 0, 0]], dtype=torch.int32)
    with pytest.raises(ValueError, match=r"global_pool.*2147483648 batches.*memory budget"):
        program(**sparse_inputs("x", coords, torch.ones(1, 2)))
    small = program(**sparse_inputs("x", torch.tensor([[2, 0, 0, 0]], dtype=torch.int32),
                                    torch.ones(1, 2)))["output"]
    assert small.tolist() == [[0.0, 0.0], [0.0, 0.0], [1.0, 1.0]]


def test_trilinear_strides_respect_the_kernel_cap(tmp_path: Path) -> None:
    for stride, ok in ((16, True), (17, False), (645, False)):
        g = Graph()
        g.sparse_input("x", 2, (stride,) * 3)
        g.op("u", "trilinear_upsample3d", ["x"], [SP], triple("stride", (stride,) * 3), SP)
        g.output("u", SP)
        root = write_artifact(tmp_path / f"tri{stride}", g, {})
        if ok:
            load_lattice_program(root)
        else:
            with pytest.raises(ValueError, match=r"implies a .* kernel"):
                load_lattice_program(root)


def test_a_voxel_size_that_is_zero_in_float32_is_refused(tmp_path: Path) -> None:
    g = Graph()
    g.tensor_input("p", "tensor<?x3xf32>")
    g.tensor_input("f", "tensor<?x2xf32>")
    g.tensor_input("b", "tensor<?xi32>")
    g.tensor_input("a", "tensor<1xi32>")
    attrs = ("voxel_size = array<f64: 1.0e-50, 1.0, 1.0>, origin = array<f64: 0.0, 0.0, 0.0>, "
             f"reduction = #lattice.voxel_reduction<mean>, {triple('stride', (1, 1, 1))}")
    g.op("v", "voxelize", ["p", "f", "b", "a"],
         ["tensor<?x3xf32>", "tensor<?x2xf32>", "tensor<?xi32>", "tensor<1xi32>"], attrs, SP)
    g.output("v", SP)
    with pytest.raises(ValueError, match="voxel_size must be positive and finite in float32"):
        load_lattice_program(write_artifact(tmp_path / "vox", g, {}))


def test_a_packed_weight_shape_error_names_the_line_and_the_weight(tmp_path: Path) -> None:
    from torch_lattice.artifact.packing import pack_weight

    packed = pack_weight(torch.randn(3, 32), bits=8, group_size=32, scale_dtype=torch.float16)
    stored = {"l.weight.weight": packed.weight, "l.weight.scales": packed.scales,
              "l.weight.biases": packed.biases}
    g = Graph()
    g.tensor_input("v", "tensor<?x64xf32>")  # 64 input channels; the codes hold 32
    g.weight("w", "l.weight", "linear",
             "#lattice.packing<int8, group_size = 32, scale_dtype = f16, mode = affine>")
    g.op("y", "linear", ["v", "w"], ["tensor<?x64xf32>", weight_type("linear")], "",
         "tensor<?x3xf32>")
    g.output("y", "tensor<?x3xf32>")
    program = load_lattice_program(write_artifact(tmp_path / "p", g, stored))
    with pytest.raises(ValueError, match=r"graph.mlir line \d+: lattice.linear weight: weight "
                                         r"'l.weight': "):
        program(v=torch.randn(2, 64))


def test_a_deeply_nested_manifest_is_one_error_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "fixtures"
    _case(root)
    (root / "manifest.json").write_text("[" * 200_000)
    _refused(capsys, ["replay", str(root)], "nests JSON too deeply")


def test_a_manifest_repeating_a_key_is_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "fixtures"
    _case(root)  # json would keep the second "cases", silently dropping the first
    (root / "manifest.json").write_text('{"cases": [{"name": "c"}], "cases": []}')
    _refused(capsys, ["replay", str(root)], "gives the key 'cases' twice")


def test_a_linked_manifest_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "fixtures"
    _case(root)
    (tmp_path / "elsewhere.json").write_text(json.dumps({"cases": [{"name": "case"}]}))
    os.symlink(tmp_path / "elsewhere.json", root / "manifest.json")
    _refused(capsys, ["replay", str(root)], "symbolic link")


def test_a_tolerance_beyond_float_is_refused(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "fixtures"
    _case(root)
    (root / "manifest.json").write_text('{"cases": [{"name": "case", "atol": 1' + "0" * 400
                                        + "}]}")
    _refused(capsys, ["replay", str(root)], "atol")


@pytest.mark.parametrize("beside", ["unrelated", "linked", "fifo", "other_cases"])
def test_one_artifact_leaves_alone_a_manifest_beside_it_that_is_not_its_root(
        tmp_path: Path, beside: str, capsys: pytest.CaptureFixture[str]) -> None:
    """PATH/../manifest.json counts only as a fixture root listing PATH's case: anything
    else there (a web app's manifest, a link, a FIFO, another fixture set's cases) is
    neither read as settings nor an error."""
    web = tmp_path / "web"
    case = _case(web, "model.lattice")
    inputs, expected = tmp_path / "inputs.safetensors", tmp_path / "expected.safetensors"
    (case / "inputs.safetensors").rename(inputs)
    (case / "expected.safetensors").rename(expected)
    manifest = web / "manifest.json"
    if beside == "unrelated":  # a web app's manifest: no 'cases'
        manifest.write_text(json.dumps({"name": "my app", "start_url": "/"}))
    elif beside == "linked":
        (tmp_path / "elsewhere.json").write_text(json.dumps({"cases": []}))
        os.symlink(tmp_path / "elsewhere.json", manifest)
    elif beside == "fifo":  # reading it would block the replay
        os.mkfifo(manifest)
    else:  # its settings would switch --coordinates auto to logical, loosen tolerances
        manifest.write_text(json.dumps({"schema": "torch_lattice_e2e_fixtures/v1",
                                        "cases": [{"name": "other.lattice", "atol": 10}]}))
    argv = ["replay", str(case), "--inputs", str(inputs), "--expected", str(expected)]
    assert main(argv) == 0
    assert "match (physical coordinates)" in capsys.readouterr().out
    save_file({"output.coords": torch.tensor([[0, 1, 2, 3], [1, 0, 0, 0]], dtype=torch.int32),
               "output.features": torch.tensor([[1.5, 2.0], [3.0, 4.0]]),
               "output.active": torch.tensor([2], dtype=torch.int32)}, str(expected))
    assert main(argv) == 1  # the default tolerance, not the manifest's atol = 10
    assert "MISMATCH (physical coordinates)" in capsys.readouterr().out


def test_case_replays_chosen_cases_of_a_fixture_root_with_their_tolerances(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "fixtures"
    for name in ("a", "b"):
        _case(root, name)
    save_file({"output.coords": torch.tensor([[0, 1, 2, 3], [1, 0, 0, 0]], dtype=torch.int32),
               "output.features": torch.tensor([[1.5, 2.0], [3.0, 4.0]]),
               "output.active": torch.tensor([2], dtype=torch.int32)},
              str(root / "a" / "expected.safetensors"))
    _manifest(root, [{"name": "a", "atol": 1.0}, {"name": "b", "atol": 0}])
    assert main(["replay", str(root), "--case", "a"]) == 0  # within the manifest's atol
    out = capsys.readouterr().out
    assert "1/1 cases match" in out and "b:" not in out
    assert main(["replay", str(root), "--case", "b", "--case", "a"]) == 0
    assert "2/2 cases match" in capsys.readouterr().out
    assert main(["replay", str(root / "a")]) == 0  # a case of its root: the same atol
    assert "match (physical coordinates)" in capsys.readouterr().out
    os.replace(root / "manifest.json", tmp_path / "away.json")
    assert main(["replay", str(root / "a")]) == 1  # no root: the default tolerance
    capsys.readouterr()
    os.replace(tmp_path / "away.json", root / "manifest.json")
    _refused(capsys, ["replay", str(root), "--case", "c"], "--case 'c' is not a case of")
    _refused(capsys, ["replay", str(root), "--case", "../a"], "plain folder name")
    _refused(capsys, ["replay", str(root / "a"), "--case", "a"], "--case selects cases")


@pytest.mark.parametrize("device", ["cuda:99", "cuda", torch.device("cuda", 0)])
def test_a_cuda_device_this_torch_cannot_use_is_a_value_error(tmp_path: Path,
                                                              device: object) -> None:
    case = _case(tmp_path)
    if torch.cuda.is_available() and device != "cuda:99":
        pytest.skip("this torch has a CUDA device")
    # Never torch's AssertionError ("Torch not compiled with CUDA enabled").
    with pytest.raises(ValueError, match=r"^device .*(CUDA is not available in this torch "
                                         r"build|out of range|sees no CUDA device)"):
        load_lattice_program(case, device=device)


@pytest.mark.parametrize("built,count,device,fragment", [
    (False, 0, "cuda", "CUDA is not available in this torch build"),
    (True, 0, "cuda:0", "sees no CUDA device"),
    (True, 2, "cuda:2", "CUDA index 2 is out of range; torch sees 2 CUDA device(s)"),
])
def test_cuda_devices_are_checked_against_this_torch(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, built: bool, count: int,
        device: str, fragment: str) -> None:
    case = _case(tmp_path)
    monkeypatch.setattr(torch.backends.cuda, "is_built", lambda: built)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    with pytest.raises(ValueError, match=f"^device '{device}': .*{re.escape(fragment)}"):
        load_lattice_program(case, device=device)


@pytest.mark.parametrize("device,error,fragment", [
    ("banana", ValueError, "'banana' is not a torch device"),
    ("", ValueError, "is not a torch device"),
    ("meta", ValueError, "'cpu' or 'cuda' devices only"),
    ("mps", ValueError, "'cpu' or 'cuda' devices only"),
    (3.5, TypeError, "device must be a str, torch.device or None, got 3.5"),
])
def test_bad_devices_are_named(tmp_path: Path, device: object, error: type[Exception],
                               fragment: str) -> None:
    case = _case(tmp_path)
    with pytest.raises(error, match=fragment):
        load_lattice_program(case, device=device)


@pytest.mark.parametrize("device,fragment", [("cuda:99", "--device 'cuda:99': "),
                                             ("banana", "--device 'banana' is not a torch"),
                                             ("meta", "--device 'meta': ")])
def test_the_cli_refuses_a_bad_device_with_one_line(
        tmp_path: Path, device: str, fragment: str, capsys: pytest.CaptureFixture[str]) -> None:
    case = _case(tmp_path)
    _refused(capsys, ["replay", str(case), "--device", device, "--inputs",
                      str(case / "inputs.safetensors"), "--no-compare"], fragment)
    root = tmp_path / "fixtures"
    _case(root)
    _manifest(root, [{"name": "case"}])
    _refused(capsys, ["replay", str(root), "--device", device], fragment)


def test_the_cli_runs_on_cpu(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replay", str(_case(tmp_path)), "--device", "cpu"]) == 0
    assert "match (physical coordinates)" in capsys.readouterr().out


def test_a_missing_or_non_folder_path_is_a_bad_argument(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Nothing could be replayed: exit 2 like a missing --inputs, not 1 ("MISMATCH").
    assert main(["replay", str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: PATH ") and "does not exist" in err
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "file").write_text("x")
    for name, what in (("fifo", "a FIFO"), ("file", "a file")):
        assert main(["replay", str(tmp_path / name)]) == 2
        captured = capsys.readouterr()
        assert "MISMATCH" not in captured.out
        assert f"is {what}, not a folder" in captured.err, captured.err
