"""State-dict conversion API (torch_lattice.migration), kernel specs and strict loading.

Row rule (FACTS.md): ``canonical[t] = legacy[perm[t]]`` with canonical rows z fastest,
``t = (rx*Ky + ry)*Kz + rz``; legacy odd-volume rows are x fastest,
``n = rx + Kx*(ry + Ky*rz)``, so ``canonical = legacy.reshape(Kz, Ky, Kx, I, O)
.permute(2, 1, 0, 3, 4).reshape(K, I, O)``; legacy even-volume rows are already z fastest.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

import torch_lattice as tl
from torch_lattice import migration
from torch_lattice.migration import ConversionError, OptimizerStateError

# Literal permutations from FACTS.md.
PERM_333 = [0, 9, 18, 3, 12, 21, 6, 15, 24, 1, 10, 19, 4, 13, 22, 7, 16, 25, 2, 11, 20, 5,
            14, 23, 8, 17, 26]  # fmt: skip
PERM_ME_222 = [0, 4, 2, 6, 1, 5, 3, 7]


def rows(k: int, cin: int = 2, cout: int = 3, dtype: torch.dtype = torch.float64):
    return torch.randn(k, cin, cout, dtype=dtype, generator=torch.Generator().manual_seed(k))


def x_fastest_to_canonical(kernel: torch.Tensor, ks: tuple[int, int, int]) -> torch.Tensor:
    kx, ky, kz = ks
    k, i, o = kernel.shape
    return kernel.reshape(kz, ky, kx, i, o).permute(2, 1, 0, 3, 4).reshape(k, i, o)


# ---------------------------------------------------------------- permutations


def test_facts_permutation_333() -> None:
    spec = migration.KernelSpec("a.kernel", (3, 3, 3))
    assert spec.permutation() == PERM_333
    assert spec.source_layout == "torchsparse_k_i_o_x_fastest"
    legacy = rows(27)
    out = migration.convert_state_dict({"a.kernel": legacy}, {"a.kernel": [3, 3, 3]})
    weight = out.state_dict["a.weight"]
    for t in range(27):
        assert torch.equal(weight[t], legacy[PERM_333[t]])


@pytest.mark.parametrize("ks", [(3, 1, 5), (1, 3, 3), (5, 3, 1), (3, 3, 3), (1, 1, 3)])
def test_odd_volume_matches_reshape_formula(ks: tuple[int, int, int]) -> None:
    k = ks[0] * ks[1] * ks[2]
    legacy = rows(k)
    out = migration.convert_state_dict({"m.kernel": legacy}, {"m.kernel": list(ks)})
    assert torch.equal(out.state_dict["m.weight"], x_fastest_to_canonical(legacy, ks))


@pytest.mark.parametrize("ks", [(2, 2, 2), (2, 3, 1), (3, 1, 2), (4, 1, 1)])
def test_even_volume_kept(ks: tuple[int, int, int]) -> None:
    k = ks[0] * ks[1] * ks[2]
    legacy = rows(k)
    out = migration.convert_state_dict({"m.kernel": legacy}, {"m.kernel": list(ks)})
    assert torch.equal(out.state_dict["m.weight"], legacy)
    assert out.kernels[0].source_layout == "torchsparse_k_i_o_z_fastest"
    assert list(out.kernels[0].row_permutation) == list(range(k))


def test_explicit_row_orders() -> None:
    me = migration.KernelSpec("m.kernel", (2, 2, 2), "x_fastest")
    assert me.permutation() == PERM_ME_222
    assert me.source_layout == "torchsparse_k_i_o_x_fastest"
    tuple_kernel = migration.KernelSpec("m.kernel", (3, 3, 3), "z_fastest")
    assert tuple_kernel.permutation() == list(range(27))
    legacy = rows(15)
    spec = {"m.kernel": {"kernel_size": [3, 1, 5], "row_order": "z_fastest"}}
    got = migration.convert_state_dict({"m.kernel": legacy}, spec).state_dict["m.weight"]
    assert torch.equal(got, legacy)
    spec = {"m.kernel": {"kernel_size": [2, 3, 1], "row_order": "x_fastest"}}
    legacy = rows(6)
    got = migration.convert_state_dict({"m.kernel": legacy}, spec).state_dict["m.weight"]
    assert torch.equal(got, x_fastest_to_canonical(legacy, (2, 3, 1)))


# ---------------------------------------------------------------- state dict


def test_pointwise_and_passthrough() -> None:
    bn = nn.BatchNorm1d(3).state_dict()
    state = {
        "head.kernel": torch.randn(4, 3),
        "head.bias": torch.randn(3),
        "down.kernel": torch.randn(1, 4, 3),  # v2.1: 3-D pointwise when stride > 1
        **{f"bn.{k}": v for k, v in bn.items()},
    }
    before = {k: v.clone() for k, v in state.items()}
    spec = {"head.kernel": [1, 1, 1], "down.kernel": {"kernel_size": [1, 1, 1]}}
    out = migration.convert_state_dict(state, spec).state_dict
    assert torch.equal(out["head.weight"], state["head.kernel"].unsqueeze(0))
    assert torch.equal(out["down.weight"], state["down.kernel"])
    assert out["head.weight"].dtype == torch.float32
    for key in ["head.bias", *(f"bn.{k}" for k in bn)]:
        assert torch.equal(out[key], state[key]) and out[key].dtype == state[key].dtype
    assert "head.kernel" not in out and "down.kernel" not in out
    assert all(torch.equal(state[k], before[k]) for k in state)  # input untouched
    assert out["bn.num_batches_tracked"].dtype == torch.int64


@pytest.mark.parametrize("ks", [(3, 3, 3), (2, 2, 2), (1, 1, 1), (3, 1, 5)])
def test_kernel_positions_match_modules(ks: tuple[int, int, int]) -> None:
    k = ks[0] * ks[1] * ks[2]
    out = migration.convert_state_dict({"c.kernel": rows(k)}, {"c.kernel": list(ks)})
    module = tl.nn.Conv3d(2, 3, kernel_size=ks)
    positions = out.state_dict["c.kernel_positions"]
    assert positions.dtype == torch.int32
    assert torch.equal(positions, module.kernel_positions)
    model = nn.ModuleDict({"c": module}).double()
    migration.load_state_dict_strict(model, out.state_dict)
    assert torch.equal(module.weight.detach(), out.state_dict["c.weight"])


@pytest.mark.parametrize(
    ("state", "spec", "match"),
    [
        ({"a.kernel": rows(27), "b.kernel": rows(8)}, {"a.kernel": [3, 3, 3]},
         r"missing from the kernel spec.*b\.kernel"),
        ({"a.kernel": rows(27)}, {"a.kernel": [3, 3, 3], "z.kernel": [3, 3, 3]},
         r"not found in the checkpoint: z\.kernel"),
        ({"a.kernel": rows(8)}, {"a.kernel": [3, 3, 3]},
         r"'a\.kernel' has shape \(8, 2, 3\).*27 rows"),
        ({"a.kernel": torch.randn(4, 3)}, {"a.kernel": [3, 3, 3]}, r"\(4, 3\).*27 rows"),
        ({"a.kernel": rows(27), "a.weight": rows(1)}, {"a.kernel": [3, 3, 3]},
         r"two tensors to 'a\.weight'"),
        ({"a.kernel": rows(27), "a.kernel_positions": rows(1)}, {"a.kernel": [3, 3, 3]},
         r"two tensors to 'a\.kernel_positions'"),
        ({"a.kernel": rows(27), "meta": {"epoch": 1}}, {"a.kernel": [3, 3, 3]},
         r"'meta' is a dict, not a tensor"),
        ({"a.kernel": torch.ones(27, 2, 2, dtype=torch.int64)}, {"a.kernel": [3, 3, 3]},
         "floating point"),
        ({}, {}, "empty"),
    ],
)  # fmt: skip
def test_convert_refusals(state: dict, spec: dict, match: str) -> None:
    with pytest.raises(ConversionError, match=match):
        migration.convert_state_dict(state, spec)


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ([["a.kernel", [3, 3, 3]]], "JSON object"),
        ({"a.weight": [3, 3, 3]}, r"must name a legacy '<module>\.kernel'"),
        ({"a.kernel": [3, 3]}, r"\[Kx, Ky, Kz\]"),
        ({"a.kernel": "333"}, r"\[Kx, Ky, Kz\]"),
        ({"a.kernel": [3, 0, 3]}, "three positive ints"),
        ({"a.kernel": [3, True, 3]}, "three positive ints"),
        ({"a.kernel": [3.0, 3, 3]}, "three positive ints"),
        ({"a.kernel": {"row_order": "x_fastest"}}, "must give 'kernel_size'"),
        ({"a.kernel": {"kernel_size": [3, 3, 3], "order": "x"}}, r"unknown fields \['order'\]"),
        ({"a.kernel": {"kernel_size": [3, 3, 3], "row_order": "y_fastest"}}, "row_order must"),
    ],
)
def test_spec_refusals(spec: object, match: str) -> None:
    with pytest.raises(ConversionError, match=match):
        migration.parse_kernel_spec(spec)


def test_load_kernel_spec_file(tmp_path: Path) -> None:
    with pytest.raises(ConversionError, match="does not exist"):
        migration.load_kernel_spec(tmp_path / "nope.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ConversionError, match="not valid JSON"):
        migration.load_kernel_spec(bad)
    good = tmp_path / "good.json"
    good.write_text(json.dumps({"a.kernel": [3, 3, 3], "b.kernel": {"kernel_size": [2, 2, 2]}}))
    specs = migration.load_kernel_spec(good)
    assert specs["a.kernel"].kernel_size == (3, 3, 3) and specs["b.kernel"].row_order is None


# ---------------------------------------------------------------- containers


def test_container_detection() -> None:
    sd = {"a.kernel": rows(27)}
    assert migration.extract_model_state(sd)[1:] == ("bare", ())
    assert migration.extract_model_state({"model": sd})[1:] == ("model", ())
    state, kind, ignored = migration.extract_model_state({"state_dict": sd, "epoch": 3})
    assert (kind, ignored) == ("state_dict", ("epoch",)) and state.keys() == sd.keys()
    _, kind, ignored = migration.extract_model_state({"model": sd, "optimizer": "adam"})
    assert (kind, ignored) == ("model", ("optimizer",))  # a name, not state
    # A bare state dict whose module happens to be called "model" stays bare.
    assert migration.extract_model_state({"model": rows(1)})[1] == "bare"


@pytest.mark.parametrize(
    "ckpt",
    [
        {"model": {"a.kernel": rows(27)}, "optimizer": {"state": {}, "param_groups": []}},
        {"model": {"a.kernel": rows(27)}, "optim": [1, 2]},
        {"state_dict": {"a.kernel": rows(27)}, "opt": {"state": {}, "param_groups": []}},
        {"state": {}, "param_groups": [{"lr": 0.1}]},
    ],
)
def test_optimizer_state_refused(ckpt: dict) -> None:
    with pytest.raises(OptimizerStateError, match="optimizer state"):
        migration.extract_model_state(ckpt)


@pytest.mark.parametrize(
    ("ckpt", "match"),
    [
        ([rows(1)], "top level is a list"),
        ({"model": {}, "state_dict": {}}, "ambiguous"),
        ({"net": {"a.kernel": rows(1)}, "epoch": 2}, r"\['net', 'epoch'\] are not tensors"),
    ],
)
def test_container_refusals(ckpt: object, match: str) -> None:
    with pytest.raises(ConversionError, match=match):
        migration.extract_model_state(ckpt)


# ---------------------------------------------------------------- strict loading


def test_strict_loader_reports_precisely() -> None:
    model = nn.ModuleDict({"c": tl.nn.SubmConv3d(2, 3, 3, bias=True)})
    good = migration.convert_state_dict(
        {"c.kernel": rows(27), "c.bias": torch.randn(3)}, {"c.kernel": [3, 3, 3]}
    ).state_dict
    migration.load_state_dict_strict(model, good)
    before = model.state_dict()["c.weight"].clone()
    bad = dict(good)
    del bad["c.bias"]
    bad["c.extra"] = torch.zeros(1)
    bad["c.weight"] = torch.zeros(8, 2, 3)
    with pytest.raises(migration.StateDictMismatchError) as info:
        migration.load_state_dict_strict(model, bad)
    err = info.value
    assert err.missing == ["c.bias"] and err.unexpected == ["c.extra"]
    assert err.mismatched == [("c.weight", (8, 2, 3), (27, 2, 3))]
    assert "missing keys: c.bias" in str(err) and "unexpected keys: c.extra" in str(err)
    assert torch.equal(model.state_dict()["c.weight"], before)  # nothing loaded


def test_result_is_the_state_dict() -> None:
    """``load_state_dict(convert_state_dict(...), strict=True)`` works directly."""
    model = nn.ModuleDict({"c": tl.nn.SubmConv3d(2, 3, 3)}).double()
    result = migration.convert_state_dict({"c.kernel": rows(27)}, {"c.kernel": [3, 3, 3]})
    assert set(result) == {"c.weight", "c.kernel_positions"} and len(result) == 2
    model.load_state_dict(result, strict=True)
    assert torch.equal(model["c"].weight.detach(), result["c.weight"])


def test_module_state_dict_checkpoint(tmp_path: Path) -> None:
    """A real ``nn.Module.state_dict()`` (OrderedDict with _metadata), and a spec file."""
    legacy = nn.Module()
    legacy.conv = nn.Module()
    legacy.conv.kernel = nn.Parameter(rows(8))
    legacy.conv.bias = nn.Parameter(torch.randn(3, dtype=torch.float64))
    torch.save({"model": legacy.state_dict(), "optimizer": None}, tmp_path / "l.pt")
    (tmp_path / "s.json").write_text(json.dumps({"conv.kernel": [2, 2, 2]}))
    ckpt = migration.read_legacy_checkpoint(tmp_path / "l.pt")
    assert (ckpt.container, ckpt.ignored_keys) == ("model", ("optimizer",))
    result = migration.convert_state_dict(ckpt.state_dict, tmp_path / "s.json")
    model = nn.ModuleDict({"conv": tl.nn.Conv3d(2, 3, 2, stride=2, bias=True)}).double()
    migration.load_state_dict_strict(model, result)
    assert torch.equal(model["conv"].bias.detach(), legacy.conv.bias.detach())
