"""Converting a single module's own state dict (``kernel`` plus optional ``bias``).

Contract: the spec key of such a kernel is the bare ``"kernel"`` (an empty module
name), so ``kernel`` becomes ``weight`` plus ``kernel_positions``, the keys of one
Torch Lattice convolution module, through the Python API and ``convert-checkpoint``
alike. A missing or mismatched spec entry is refused with a message that says how to
list it, and a refusal writes nothing.

Legacy stride-1 rule (FACTS.md): ``out[q] = sum_n x[q + (ix-1, iy-1, iz-1)] @ K[n]``
with odd-volume rows x fastest, ``n = ix + Kx*(iy + Ky*iz)``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from torch import nn

import torch_lattice as tl
from torch_lattice import migration
from torch_lattice.migration import ConversionError, cli


def legacy_conv(cin: int, cout: int, volume: int, bias: bool = True) -> nn.Module:
    """A stand-in for one legacy ``spnn.Conv3d``: parameters named ``kernel``/``bias``."""
    gen = torch.Generator().manual_seed(volume)
    conv = nn.Module()
    shape = (cin, cout) if volume == 1 else (volume, cin, cout)
    conv.kernel = nn.Parameter(torch.randn(*shape, dtype=torch.float64, generator=gen))
    if bias:
        conv.bias = nn.Parameter(torch.randn(cout, dtype=torch.float64, generator=gen))
    return conv


def legacy_subm_reference(
    coords: torch.Tensor, feats: torch.Tensor, kernel: torch.Tensor, bias: torch.Tensor
) -> torch.Tensor:
    """Legacy k3 s1 (submanifold) conv from the module docstring's rule, row by row."""
    index = {tuple(c.tolist()): i for i, c in enumerate(coords)}
    out = bias.expand(len(coords), -1).clone()
    for n in range(27):
        ix, iy, iz = n % 3, (n // 3) % 3, n // 9
        for i, c in enumerate(coords.tolist()):
            j = index.get((c[0], c[1] + ix - 1, c[2] + iy - 1, c[3] + iz - 1))
            if j is not None:
                out[i] += feats[j] @ kernel[n]
    return out


def sample_points() -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    cells = torch.randint(0, 4, (40, 3), generator=gen)
    batch = torch.randint(0, 2, (40, 1), generator=gen)
    coords = torch.unique(torch.cat([batch, cells], 1), dim=0).to(torch.int32)
    feats = torch.randn(len(coords), 2, dtype=torch.float64, generator=gen)
    return coords, feats


def files(folder: Path) -> set[str]:
    return {p.name for p in folder.iterdir()}


# ---------------------------------------------------------------- Python API


def test_single_module_converts_and_reproduces_the_legacy_output() -> None:
    legacy = legacy_conv(2, 3, 27)
    result = migration.convert_state_dict(legacy.state_dict(), {"kernel": [3, 3, 3]})
    assert list(result) == ["weight", "kernel_positions", "bias"]
    assert result.passthrough == ("bias",)
    (record,) = result.kernels
    assert (record.source_key, record.target_key, record.positions_key) == (
        "kernel", "weight", "kernel_positions",
    )  # fmt: skip
    module = tl.nn.SubmConv3d(2, 3, 3, bias=True).double()
    migration.load_state_dict_strict(module, result)
    module.load_state_dict(result, strict=True)

    coords, feats = sample_points()
    got = module(tl.SparseTensor(feats=feats, coords=coords)).feats
    want = legacy_subm_reference(coords, feats, legacy.kernel.detach(), legacy.bias.detach())
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_single_pointwise_module_without_bias() -> None:
    legacy = legacy_conv(4, 5, 1, bias=False)
    result = migration.convert_state_dict(
        legacy.state_dict(), {"kernel": {"kernel_size": [1, 1, 1]}}
    )
    assert set(result) == {"weight", "kernel_positions"}
    assert torch.equal(result["weight"], legacy.kernel.detach()[None])
    migration.load_state_dict_strict(tl.nn.Conv3d(4, 5, 1).double(), result)


def test_single_module_with_submodule_kernels() -> None:
    """A module's own ``kernel`` and its children's ``<child>.kernel`` side by side."""
    legacy = legacy_conv(2, 3, 27)
    legacy.down = legacy_conv(3, 3, 8, bias=False)
    spec = {"kernel": [3, 3, 3], "down.kernel": [2, 2, 2]}
    result = migration.convert_state_dict(legacy.state_dict(), spec)
    assert set(result) == {
        "weight", "kernel_positions", "bias", "down.weight", "down.kernel_positions",
    }  # fmt: skip


def test_wrapped_single_module_checkpoint(tmp_path: Path) -> None:
    legacy = legacy_conv(2, 3, 8)
    torch.save({"model": legacy.state_dict(), "epoch": 2}, tmp_path / "conv.pt")
    done = migration.convert_checkpoint(tmp_path / "conv.pt", tmp_path / "conv.safetensors",
                                        {"kernel": [2, 2, 2]})  # fmt: skip
    assert done.manifest["source_container"] == "model"
    assert [k["target_key"] for k in done.manifest["kernels"]] == ["weight"]
    module = tl.nn.Conv3d(2, 3, 2, stride=2, bias=True).double()
    migration.load_converted(module, done.output)
    assert torch.equal(module.weight.detach(), legacy.kernel.detach())  # even volume: kept


# ---------------------------------------------------------------- refusals


@pytest.mark.parametrize(
    ("state_keys", "spec", "match"),
    [
        (("kernel", "bias"), {}, r"missing from the kernel spec.*\]\): kernel; a single "
         r"module's own state dict lists its kernel as 'kernel'$"),
        (("kernel", "bias"), {"conv.kernel": [3, 3, 3]},
         r"missing from the kernel spec.*: kernel; kernel spec keys not found in the "
         r"checkpoint: conv\.kernel; the checkpoint is a single module's.*list it as 'kernel'$"),
        (("conv.kernel", "conv.bias"), {"kernel": [3, 3, 3]},
         r"^legacy kernels missing from the kernel spec.*: conv\.kernel; kernel spec keys not "
         r"found in the checkpoint: kernel; 'kernel' names a single module's own kernel, "
         r"but the checkpoint's kernels carry module names \(conv\.kernel\)$"),
        (("conv.kernel", "conv.bias"), {"conv.kernel": [3, 3, 3], "kernel": [3, 3, 3]},
         r"not found in the checkpoint: kernel;.*\(conv\.kernel\)"),
    ],
)  # fmt: skip
def test_single_module_refusals(state_keys: tuple[str, ...], spec: dict, match: str) -> None:
    state = {
        k: torch.randn(27, 2, 3) if k.endswith("kernel") else torch.randn(3) for k in state_keys
    }
    with pytest.raises(ConversionError, match=match):
        migration.convert_state_dict(state, spec)


@pytest.mark.parametrize("key", [".kernel", "a..kernel", "kernels", "mykernel"])
def test_spec_keys_that_name_no_kernel(key: str) -> None:
    with pytest.raises(ConversionError, match=repr(key).replace(".", r"\.")):
        migration.parse_kernel_spec({key: [3, 3, 3]})


def test_single_module_shape_mismatch_names_the_key() -> None:
    with pytest.raises(ConversionError, match=r"legacy kernel 'kernel' has shape \(8, 2, 3\)"):
        migration.convert_state_dict({"kernel": torch.randn(8, 2, 3)}, {"kernel": [3, 3, 3]})


# ---------------------------------------------------------------- command line


@pytest.fixture
def conv_checkpoint(tmp_path: Path) -> Path:
    """A bare single-module state dict saved with torch.save, as conv.pt."""
    torch.save(legacy_conv(2, 3, 27).state_dict(), tmp_path / "conv.pt")
    return tmp_path


def test_cli_converts_a_single_module(conv_checkpoint: Path) -> None:
    work = conv_checkpoint
    (work / "spec.json").write_text(json.dumps({"kernel": [3, 3, 3]}))
    out = work / "conv.safetensors"
    console = Path(sys.executable).parent / "convert-checkpoint"
    args = [str(console), str(work / "conv.pt"), str(out), "--kernel-spec", str(work / "spec.json")]
    run = subprocess.run(args, capture_output=True, text=True, check=False)
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["kernel_count"] == 1
    state = load_file(str(out))
    assert set(state) == {"weight", "kernel_positions", "bias"}
    manifest = json.loads((work / "conv.json").read_text())
    assert manifest["source_container"] == "bare"
    assert manifest["kernels"][0]["kernel_positions_key"] == "kernel_positions"
    module = tl.nn.SubmConv3d(2, 3, 3, bias=True).double()
    migration.load_converted(module, out)
    legacy = legacy_conv(2, 3, 27)
    coords, feats = sample_points()
    got = module(tl.SparseTensor(feats=feats, coords=coords)).feats
    want = legacy_subm_reference(coords, feats, legacy.kernel.detach(), legacy.bias.detach())
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_cli_refuses_a_single_module_without_its_spec_entry(conv_checkpoint: Path, capsys) -> None:
    work = conv_checkpoint
    (work / "spec.json").write_text(json.dumps({"conv.kernel": [3, 3, 3]}))
    out = work / "new" / "conv.safetensors"
    code = cli.main([str(work / "conv.pt"), str(out), "--kernel-spec", str(work / "spec.json")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1 and err[0].startswith("error: legacy kernels missing"), err
    assert "list it as 'kernel'" in err[0]
    assert files(work) == {"conv.pt", "spec.json"}  # nothing written, no new folder
