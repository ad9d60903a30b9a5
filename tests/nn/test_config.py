"""Dataflow configuration: precedence, scoping, target-transpose policy."""

from __future__ import annotations

import asyncio
import threading

import pytest
import torch

import torch_lattice as tl
from torch_lattice.nn import functional as F
from torch_lattice.nn.functional.config import resolve_config


@pytest.fixture(autouse=True)
def _clean_global():
    F.clear_global_conv_config()
    yield
    F.clear_global_conv_config()


def _fields(cfg: F.ConvConfig | None) -> tuple[object, object] | None:
    """(dataflow, allow_tf32): the documented fields, read one by one."""
    return None if cfg is None else (cfg.dataflow, cfg.allow_tf32)


def test_default_is_implicit_gemm() -> None:
    assert F.get_global_conv_config() is None
    assert F.resolved_dataflow() is F.Dataflow.ImplicitGEMM


def test_documented_defaults() -> None:
    # The documented values, written out here rather than read from the library: the
    # three dataflows by name, every field of a fresh ConvConfig unset ("inherit"), the
    # CPU default implicit GEMM, the CUDA default fetch-on-demand, TF32 off unless enabled.
    assert {d.name: d.value for d in F.Dataflow} == {
        "ImplicitGEMM": "implicit_gemm",
        "FetchOnDemand": "fetch_on_demand",
        "GatherScatter": "gather_scatter",
    }
    assert _fields(F.ConvConfig()) == (None, None)
    assert _fields(resolve_config()) == (F.Dataflow.ImplicitGEMM, False)
    assert _fields(resolve_config(device="cuda")) == (F.Dataflow.FetchOnDemand, False)


def test_one_changed_field_is_visible_and_the_other_inherits() -> None:
    F.set_global_conv_config(F.ConvConfig(allow_tf32=True))
    assert _fields(F.get_global_conv_config()) == (None, True)
    assert _fields(resolve_config()) == (F.Dataflow.ImplicitGEMM, True)
    with F.conv_config(dataflow=F.Dataflow.GatherScatter):
        assert _fields(resolve_config()) == (F.Dataflow.GatherScatter, True)
        module_cfg = F.ConvConfig(allow_tf32=False)
        assert _fields(resolve_config(module_cfg)) == (F.Dataflow.GatherScatter, False)
    # Equality sees each field: configs that differ in one field are not equal.
    base = F.ConvConfig(dataflow=F.Dataflow.FetchOnDemand)
    assert base != F.ConvConfig(dataflow=F.Dataflow.FetchOnDemand, allow_tf32=False)
    assert base != F.ConvConfig(dataflow=F.Dataflow.GatherScatter)


def test_precedence_module_over_scope_over_global() -> None:
    F.set_global_conv_config(F.ConvConfig(dataflow=F.Dataflow.FetchOnDemand))
    assert _fields(F.get_global_conv_config()) == (F.Dataflow.FetchOnDemand, None)
    assert F.resolved_dataflow() is F.Dataflow.FetchOnDemand
    with F.conv_config(dataflow=F.Dataflow.GatherScatter):
        assert F.resolved_dataflow() is F.Dataflow.GatherScatter
        module_cfg = F.ConvConfig(dataflow=F.Dataflow.ImplicitGEMM)
        assert F.resolved_dataflow(module_cfg) is F.Dataflow.ImplicitGEMM
        with F.conv_config(allow_tf32=True):  # inherits the outer dataflow
            assert F.resolved_dataflow() is F.Dataflow.GatherScatter
    assert F.resolved_dataflow() is F.Dataflow.FetchOnDemand
    F.clear_global_conv_config()
    assert F.resolved_dataflow() is F.Dataflow.ImplicitGEMM


def test_scope_is_thread_local() -> None:
    seen: list[F.Dataflow] = []
    with F.conv_config(dataflow=F.Dataflow.GatherScatter):
        t = threading.Thread(target=lambda: seen.append(F.resolved_dataflow()))
        t.start()
        t.join()
        assert F.resolved_dataflow() is F.Dataflow.GatherScatter
    assert seen == [F.Dataflow.ImplicitGEMM]


def test_scope_is_task_local() -> None:
    async def inside(flow: F.Dataflow) -> F.Dataflow:
        with F.conv_config(dataflow=flow):
            await asyncio.sleep(0)
            return F.resolved_dataflow()

    async def both() -> list[F.Dataflow]:
        return list(
            await asyncio.gather(inside(F.Dataflow.FetchOnDemand), inside(F.Dataflow.GatherScatter))
        )

    assert asyncio.run(both()) == [F.Dataflow.FetchOnDemand, F.Dataflow.GatherScatter]


def test_target_transpose_runs_gather_scatter() -> None:
    assert F.resolved_dataflow(target_transpose=True) is F.Dataflow.GatherScatter
    with F.conv_config(dataflow=F.Dataflow.GatherScatter):
        assert F.resolved_dataflow(target_transpose=True) is F.Dataflow.GatherScatter


def _src_and_target() -> tuple[tl.SparseTensor, torch.Tensor]:
    src = tl.SparseTensor(torch.randn(2, 3), torch.tensor([[0, 0, 0, 0], [0, 1, 1, 1]]), stride=2)
    return src, torch.tensor([[0, 0, 0, 0], [0, 2, 2, 2], [0, 3, 3, 3]])


@pytest.mark.parametrize("flow", [F.Dataflow.ImplicitGEMM, F.Dataflow.FetchOnDemand])
def test_target_transpose_rejects_other_explicit_dataflow(flow: F.Dataflow) -> None:
    src, target = _src_and_target()
    up = tl.nn.ConvTranspose3d(3, 2, 2, stride=2, config=F.ConvConfig(dataflow=flow))
    with pytest.raises(ValueError, match="GatherScatter"):
        up(src, target)
    gen = tl.nn.GenerativeConvTranspose3d(3, 2, 2, stride=2)
    with F.conv_config(dataflow=flow), pytest.raises(ValueError, match="GatherScatter"):
        gen(src, target)
    F.set_global_conv_config(F.ConvConfig(dataflow=flow))
    with pytest.raises(ValueError, match="GatherScatter"):
        tl.nn.NormalizedConvTranspose3d(3, 2, 2, stride=2)(src, target)


def test_target_transpose_accepts_gather_scatter_and_unset() -> None:
    src, target = _src_and_target()
    up = tl.nn.ConvTranspose3d(3, 2, 2, stride=2)
    a = up(src, target).feats
    up.config = F.ConvConfig(dataflow=F.Dataflow.GatherScatter)
    assert torch.equal(up(src, target).feats, a)


def test_dataflow_used_is_observable(caplog: pytest.LogCaptureFixture) -> None:
    x = tl.SparseTensor(torch.randn(2, 3), torch.tensor([[0, 0, 0, 0], [0, 1, 1, 1]]))
    conv = tl.nn.SubmConv3d(3, 2, 3, config=F.ConvConfig(dataflow=F.Dataflow.FetchOnDemand))
    with caplog.at_level("DEBUG", logger="torch_lattice.dataflow"):
        conv(x)
    assert any("FetchOnDemand" in r.getMessage() for r in caplog.records)


def test_config_validation() -> None:
    with pytest.raises(TypeError, match="dataflow"):
        F.ConvConfig(dataflow="implicit_gemm")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="config"):
        F.set_global_conv_config("fast")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="config"):
        tl.nn.SubmConv3d(3, 2, config="fast")  # type: ignore[arg-type]


def test_resolved_dataflow_of_a_module() -> None:
    conv = tl.nn.Conv3d(3, 2, 2, stride=2, config=F.ConvConfig(dataflow=F.Dataflow.GatherScatter))
    assert F.resolved_dataflow(conv) is F.Dataflow.GatherScatter
    assert F.resolved_dataflow(tl.nn.Conv3d(3, 2)) is F.Dataflow.ImplicitGEMM
    with pytest.raises(TypeError, match="ConvConfig"):
        F.resolved_dataflow(42)


def test_cuda_default_is_the_verified_dataflow():
    # docs/gpu-validation.md: fetch-on-demand is the dataflow GPU run 4 verified fastest
    assert F.resolved_dataflow(device="cuda") is F.Dataflow.FetchOnDemand
    assert F.resolved_dataflow(device=torch.device("cuda", 0)) is F.Dataflow.FetchOnDemand
    assert F.resolved_dataflow(device=torch.device("cpu")) is F.Dataflow.ImplicitGEMM
    assert F.resolved_dataflow() is F.Dataflow.ImplicitGEMM
    # Anything set explicitly wins over the device's default.
    with F.conv_config(dataflow=F.Dataflow.ImplicitGEMM):
        assert F.resolved_dataflow(device="cuda") is F.Dataflow.ImplicitGEMM
    module_cfg = F.ConvConfig(dataflow=F.Dataflow.GatherScatter)
    assert F.resolved_dataflow(module_cfg, device="cuda") is F.Dataflow.GatherScatter
    assert resolve_config(device="cuda").allow_tf32 is False
    with pytest.raises(TypeError, match="device must be"):
        F.resolved_dataflow(device=3)


def test_resolution_follows_every_setting_it_reads() -> None:
    """resolve_config keeps one result per combination of what it reads (global, scoped
    and module configurations, the transpose kind, the device and deterministic mode):
    changing any of them between calls gives the new result, never a kept one."""
    from torch_lattice.nn.functional.config import resolve_config

    fod = F.ConvConfig(dataflow=F.Dataflow.FetchOnDemand)
    assert resolve_config(None).dataflow is F.Dataflow.ImplicitGEMM
    F.set_global_conv_config(fod)
    assert resolve_config(None).dataflow is F.Dataflow.FetchOnDemand
    with F.conv_config(dataflow=F.Dataflow.GatherScatter):
        assert resolve_config(None).dataflow is F.Dataflow.GatherScatter
        assert resolve_config(fod).dataflow is F.Dataflow.FetchOnDemand
        assert resolve_config(None, target_transpose=True).dataflow is F.Dataflow.GatherScatter
    assert resolve_config(None).dataflow is F.Dataflow.FetchOnDemand
    with pytest.raises(ValueError, match="GatherScatter"):  # the global's explicit dataflow
        resolve_config(None, target_transpose=True)
    F.clear_global_conv_config()
    assert resolve_config(None).dataflow is F.Dataflow.ImplicitGEMM
    assert resolve_config(None, target_transpose=True).dataflow is F.Dataflow.GatherScatter
    assert resolve_config(None, device="cuda").autotune is True
    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        assert resolve_config(None, device="cuda").dataflow is F.Dataflow.ImplicitGEMM
        assert resolve_config(None, device="cuda").autotune is False
    finally:
        torch.use_deterministic_algorithms(previous)
    assert resolve_config(None, device="cuda").autotune is True
