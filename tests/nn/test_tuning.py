"""Autotuning (torch_lattice.nn.functional.tuning): a layer shape's first call times the
dataflows and later calls run the fastest; explicit dataflows, deterministic mode and
target transposes win over it; choices are saved and loaded only from valid files.

On the CPU tuning is opt-in (``ConvConfig(autotune=True)``), which runs the same code as
the CUDA default; tests/nn/test_cuda_tuning.py covers the default on a GPU.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

import torch_lattice as tl
from torch_lattice.nn import functional as F
from torch_lattice.nn.functional import relation, tuning
from torch_lattice.nn.functional.config import resolve_config

TUNE = F.ConvConfig(autotune=True)


@pytest.fixture(autouse=True)
def _fresh() -> Iterator[None]:
    tuning.clear_tuning()
    F.clear_global_conv_config()
    yield
    tuning.clear_tuning()
    F.clear_global_conv_config()


def _input(rows: int = 420, channels: int = 5, seed: int = 0) -> tl.SparseTensor:
    g = torch.Generator().manual_seed(seed)
    c = torch.unique(torch.randint(0, 12, (rows, 3), generator=g), dim=0)
    coords = torch.cat([torch.zeros(c.shape[0], 1, dtype=c.dtype), c], 1).int()
    return tl.SparseTensor(torch.randn(coords.shape[0], channels, generator=g), coords)


def _fake_times(monkeypatch: pytest.MonkeyPatch, ms: dict[F.Dataflow, float]) -> list:
    """Timings by dataflow instead of the clock; returns the list of timed dataflows."""
    timed: list[F.Dataflow] = []

    def seconds(run, device):
        dataflow = run.args[3]
        timed.append(dataflow)
        return ms[dataflow] * 1e-3

    monkeypatch.setattr(tuning, "_seconds", seconds)
    return timed


def _ran(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Which op family each relation ran through: "sparse_conv" or "pair_conv"."""
    ran: list[str] = []
    for name in ("sparse_conv", "pair_conv"):
        real = getattr(relation, name)

        def spy(*args, _real=real, _name=name):
            ran.append(_name + (":gather" if _name == "pair_conv" and args[9] else ""))
            return _real(*args)

        monkeypatch.setattr(relation, name, spy)
    return ran


def test_defaults_tune_on_cuda_only() -> None:
    assert resolve_config(device="cuda").autotune is True
    assert resolve_config(device="cpu").autotune is False
    assert resolve_config().autotune is False
    with pytest.raises(TypeError, match="autotune must be a bool"):
        F.ConvConfig(autotune=1)  # type: ignore[arg-type]


def test_first_call_times_every_dataflow_and_later_calls_run_the_fastest(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    x = _input()
    conv = tl.nn.SubmConv3d(5, 7, 3, config=TUNE)
    timed = _fake_times(monkeypatch, {F.Dataflow.ImplicitGEMM: 3.0,
                                      F.Dataflow.FetchOnDemand: 2.0,
                                      F.Dataflow.GatherScatter: 1.0})
    assert F.resolved_dataflow(conv, input=x) is F.Dataflow.ImplicitGEMM  # not tuned yet
    ref = tl.nn.SubmConv3d(5, 7, 3, config=F.ConvConfig(dataflow=F.Dataflow.ImplicitGEMM))
    ref.load_state_dict(conv.state_dict())
    ran = _ran(monkeypatch)
    y = conv(x)
    assert sorted(d.value for d in timed) == sorted(d.value for d in F.Dataflow)
    assert ran[-1] == "pair_conv:gather"  # the call itself ran the fastest
    assert F.resolved_dataflow(conv, input=x) is F.Dataflow.GatherScatter
    (key,) = tuning.tuning_choices()
    assert (key.c_in, key.c_out, key.kernel_volume, key.transposed) == (5, 7, 27, False)
    assert key.device == "cpu" and key.dtype == "float32"
    torch.testing.assert_close(y.feats, ref(x).feats, rtol=1e-5, atol=1e-5)
    timed.clear()
    ran.clear()
    conv(_input(seed=1))  # the same shape (rows within a factor of two): no timing
    assert timed == [] and ran == ["pair_conv:gather"]


def test_training_calls_are_keyed_apart_and_time_forward_and_backward(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A call that will be differentiated times each dataflow's forward and backward (the
    backward runs the dataflow its forward ran) on detached copies; an inference call
    times forwards alone, under its own key."""
    x = _input()
    conv = tl.nn.SubmConv3d(5, 7, 3, config=TUNE)
    ms = {F.Dataflow.ImplicitGEMM: 3.0, F.Dataflow.FetchOnDemand: 1.0,
          F.Dataflow.GatherScatter: 2.0}

    def seconds(run, device):
        run()  # the candidate itself, so what it runs is seen
        return ms[run.args[3]] * 1e-3

    monkeypatch.setattr(tuning, "_seconds", seconds)
    backward: list[int] = []
    real_grad = torch.autograd.grad

    def grad(outputs, inputs, grad_outputs=None, **kw):
        backward.append(len(inputs))
        return real_grad(outputs, inputs, grad_outputs, **kw)

    monkeypatch.setattr(relation.torch.autograd, "grad", grad)
    y = conv(x)  # the weight requires a gradient: a training call
    assert backward == [1, 1, 1]  # each dataflow's backward, to the weight only
    assert conv.weight.grad is None  # the caller's .grad fields are untouched
    assert y.feats.requires_grad
    (key,) = tuning.tuning_choices()
    assert key.training and tuning.tuning_choices()[key] is F.Dataflow.FetchOnDemand
    assert F.resolved_dataflow(conv, input=x) is F.Dataflow.FetchOnDemand

    backward.clear()
    ms[F.Dataflow.ImplicitGEMM] = 0.5
    with torch.no_grad():
        conv(x)  # inference: a key of its own, forwards alone
        assert F.resolved_dataflow(conv, input=x) is F.Dataflow.ImplicitGEMM
    assert backward == []
    assert sorted(k.training for k in tuning.tuning_choices()) == [False, True]

    tuning.clear_tuning()
    xg = tl.SparseTensor(x.feats.clone().requires_grad_(True), x.coords)
    conv(xg)
    assert backward == [2, 2, 2]  # to the features and the weight
    assert xg.feats.grad is None and conv.weight.grad is None


def test_the_real_clock_chooses_a_dataflow_and_the_result_is_the_relation() -> None:
    x = _input(rows=900, channels=8)
    conv = tl.nn.Conv3d(8, 6, 2, stride=2, config=TUNE)
    ref = tl.nn.Conv3d(8, 6, 2, stride=2)
    ref.load_state_dict(conv.state_dict())
    torch.testing.assert_close(conv(x).feats, ref(x).feats, rtol=1e-5, atol=1e-5)
    (choice,) = tuning.tuning_choices().values()
    assert F.resolved_dataflow(conv, input=x) is choice


def test_shapes_are_keyed_by_size_class_dtype_channels_and_direction(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _fake_times(monkeypatch, dict.fromkeys(F.Dataflow, 1.0))
    x = _input(rows=600)
    small = tl.SparseTensor.from_support(x.feats[:, :5], x.support)
    down = tl.nn.Conv3d(5, 5, 2, stride=2, config=TUNE)
    up = tl.nn.ConvTranspose3d(5, 5, 2, stride=2, config=TUNE)
    up(down(small))
    tl.nn.SubmConv3d(5, 5, 3, config=TUNE).double()(
        tl.SparseTensor.from_support(x.feats.double(), x.support))
    keys = tuning.tuning_choices()
    assert sorted((k.transposed, k.dtype, k.kernel_volume) for k in keys) == [
        (False, "float32", 8), (False, "float64", 27), (True, "float32", 8)]
    key = tuning.TuningKey.of(torch.zeros(1000, 5), torch.zeros(27, 5, 7), False)
    assert key.size_class == tuning.TuningKey.of(torch.zeros(600, 5), torch.zeros(27, 5, 7),
                                                 False).size_class
    assert key.size_class != tuning.TuningKey.of(torch.zeros(1100, 5), torch.zeros(27, 5, 7),
                                                 False).size_class


def test_an_explicit_dataflow_wins_and_autotune_true_turns_tuning_back_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    timed = _fake_times(monkeypatch, {F.Dataflow.ImplicitGEMM: 1.0,
                                      F.Dataflow.FetchOnDemand: 3.0,
                                      F.Dataflow.GatherScatter: 2.0})
    x = _input()
    F.set_global_conv_config(TUNE)
    pinned = tl.nn.SubmConv3d(5, 5, 3, config=F.ConvConfig(dataflow=F.Dataflow.FetchOnDemand))
    ran = _ran(monkeypatch)
    pinned(x)
    assert timed == [] and ran == ["pair_conv"] and tuning.tuning_choices() == {}
    assert F.resolved_dataflow(pinned, input=x) is F.Dataflow.FetchOnDemand
    with F.conv_config(dataflow=F.Dataflow.GatherScatter):  # a scope's dataflow wins too
        assert resolve_config().autotune is False
        with F.conv_config(autotune=True):  # and an inner scope tunes again
            assert resolve_config().autotune is True
            assert resolve_config().dataflow is F.Dataflow.GatherScatter  # the fallback
    F.set_global_conv_config(F.ConvConfig(dataflow=F.Dataflow.GatherScatter))
    tuned = tl.nn.SubmConv3d(5, 5, 3, config=TUNE)
    tuned(x)
    assert len(timed) == 3 and F.resolved_dataflow(tuned, input=x) is F.Dataflow.ImplicitGEMM


def test_deterministic_mode_and_target_transposes_are_not_tuned() -> None:
    F.set_global_conv_config(TUNE)
    assert resolve_config(target_transpose=True).autotune is False
    assert resolve_config(target_transpose=True).dataflow is F.Dataflow.GatherScatter
    was = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        cfg = resolve_config(device="cuda")
        assert (cfg.dataflow, cfg.autotune) == (F.Dataflow.ImplicitGEMM, False)
        assert F.resolved_dataflow(device="cuda") is F.Dataflow.ImplicitGEMM
        # on the CPU too: the configured dataflow, untimed (a choice may vary by run)
        cpu = resolve_config(device="cpu")
        assert (cpu.dataflow, cpu.autotune) == (F.Dataflow.ImplicitGEMM, False)
    finally:
        torch.use_deterministic_algorithms(was)


def test_a_candidate_that_fails_is_left_out_and_none_left_keeps_the_fallback() -> None:
    key = tuning.TuningKey("cpu", "float32", 1, 1, 1, 1, False)
    cpu = torch.device("cpu")

    def fails() -> None:
        raise RuntimeError("out of memory")

    runs = {F.Dataflow.ImplicitGEMM: fails, F.Dataflow.GatherScatter: lambda: None}
    assert tuning.tuned_dataflow(key, cpu, runs, F.Dataflow.FetchOnDemand) \
        is F.Dataflow.GatherScatter
    other = tuning.TuningKey("cpu", "float32", 2, 1, 1, 1, False)
    assert tuning.tuned_dataflow(other, cpu, {F.Dataflow.ImplicitGEMM: fails},
                                 F.Dataflow.FetchOnDemand) is F.Dataflow.FetchOnDemand
    assert other not in tuning.tuning_choices()  # tried again next time


def test_nothing_is_timed_while_torch_compiles(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    key = tuning.TuningKey("cpu", "float32", 1, 1, 1, 1, False)

    def never() -> None:
        raise AssertionError("timed while compiling")

    got = tuning.tuned_dataflow(key, torch.device("cpu"), {F.Dataflow.ImplicitGEMM: never},
                                F.Dataflow.GatherScatter)
    assert got is F.Dataflow.GatherScatter and tuning.tuning_choices() == {}


def test_choices_round_trip_through_a_file(tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_times(monkeypatch, {F.Dataflow.ImplicitGEMM: 2.0, F.Dataflow.FetchOnDemand: 1.0,
                              F.Dataflow.GatherScatter: 3.0})
    x = _input()
    tl.nn.SubmConv3d(5, 7, 3, config=TUNE)(x)
    made = tuning.tuning_choices()
    path = tmp_path / "tuning.json"
    assert tuning.save_tuning(path) == 1
    assert os.listdir(tmp_path) == ["tuning.json"]  # written in place, no temporary left
    tuning.clear_tuning()
    assert tuning.load_tuning(path) == 1
    assert tuning.tuning_choices() == made
    timed = _fake_times(monkeypatch, dict.fromkeys(F.Dataflow, 1.0))
    tl.nn.SubmConv3d(5, 7, 3, config=TUNE)(x)
    assert timed == []  # the loaded choice is used


def _doc(**entry: object) -> dict:
    base = {"device": "cpu", "dtype": "float32", "c_in": 4, "c_out": 4, "kernel_volume": 27,
            "size_class": 10, "transposed": False, "training": True,
            "dataflow": "implicit_gemm"}
    return {"format": "torch_lattice.tuning", "version": 2, "choices": [{**base, **entry}]}


def test_a_version_1_file_loads_as_inference_choices(tmp_path: Path) -> None:
    """Files saved before the key had ``training`` hold forward-timed choices."""
    doc = _doc()
    del doc["choices"][0]["training"]
    doc["version"] = 1
    path = tmp_path / "v1.json"
    path.write_text(json.dumps(doc))
    assert tuning.load_tuning(path) == 1
    (key,) = tuning.tuning_choices()
    assert key.training is False and key.c_in == 4
    doc["choices"][0]["training"] = False  # version 1 has no such key
    path.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match="exactly the keys"):
        tuning.load_tuning(path)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"\xff\xfe not json", "is not JSON"),
        (b"[1, 2]", '"format" must be'),
        (json.dumps({**_doc(), "version": 3}).encode(), '"version" must be 1 or 2'),
        (json.dumps({**_doc(), "version": True}).encode(), '"version" must be 1 or 2'),
        (json.dumps({**_doc(), "version": 2.0}).encode(), '"version" must be 1 or 2'),
        (json.dumps(_doc(training=1)).encode(), "training must be true or false"),
        (json.dumps({**_doc(), "choices": {}}).encode(), '"choices" must be a list'),
        (json.dumps({**_doc(), "choices": [None] * 5000}).encode(), "at most 4096"),
        (json.dumps(_doc(c_in=0)).encode(), r"choices\[0\]\.c_in must be an int in \[1, "),
        (json.dumps(_doc(c_out=2**40)).encode(), r"c_out must be an int in \[1, "),
        (json.dumps(_doc(kernel_volume=True)).encode(), "kernel_volume must be an int"),
        (json.dumps(_doc(size_class=64)).encode(), r"size_class must be an int in \[0, 63\]"),
        (json.dumps(_doc(transposed=1)).encode(), "transposed must be true or false"),
        (json.dumps(_doc(dtype="int8")).encode(), "dtype must be one of"),
        (json.dumps(_doc(device="")).encode(), "device must be a non-empty string"),
        (json.dumps(_doc(dataflow="fastest")).encode(), "dataflow must be one of"),
        (json.dumps(_doc(extra=1)).encode(), "exactly the keys"),
        # two choices for one layer: which one held was the file's order (the last)
        (json.dumps({**_doc(), "choices": _doc()["choices"] + _doc(
            dataflow="fetch_on_demand")["choices"]}).encode(),
         r"choices\[1\] repeats the layer of choices\[0\]"),
    ],
)
def test_a_bad_tuning_file_is_refused_whole(tmp_path: Path, content: bytes,
                                            message: str) -> None:
    good = _doc()["choices"][0]
    doc = _doc()
    doc["choices"] = [good]
    path = tmp_path / "t.json"
    path.write_bytes(content)
    with pytest.raises(ValueError, match=message):
        tuning.load_tuning(path)
    assert tuning.tuning_choices() == {}


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"[" * 100_000, "nests JSON too deeply"),  # Python's parser recurses per level
        (b'{"format": ' + b"1" * 5000 + b"}", "is not JSON: Exceeds the limit"),
        ('{"format": "torch_lattice.tuning"}'.encode("utf-16"), "is not JSON: 'utf-8'"),
        (b'{"format": "\xff"}', "is not JSON: 'utf-8'"),
        # json keeps the last of repeated keys: the first version would go unread
        (b'{"format": "torch_lattice.tuning", "version": 1, "version": 2, "choices": []}',
         "gives the key 'version' twice"),
    ],
)
def test_a_hostile_tuning_file_is_a_value_error_naming_it(tmp_path: Path, content: bytes,
                                                          message: str) -> None:
    path = tmp_path / "t.json"
    path.write_bytes(content)
    with pytest.raises(ValueError, match=f"^tuning file '{path}' {message}"):
        tuning.load_tuning(path)
    assert tuning.tuning_choices() == {}


def test_a_linked_tuning_file_is_read_through_its_link(tmp_path: Path) -> None:
    """A path the caller named: a link to a regular file is followed, to anything else not."""
    real = tmp_path / "real.json"
    real.write_text(json.dumps(_doc()))
    os.symlink(real, tmp_path / "link.json")
    assert tuning.load_tuning(tmp_path / "link.json") == 1
    os.mkfifo(tmp_path / "fifo")
    os.symlink(tmp_path / "fifo", tmp_path / "to_fifo.json")
    with pytest.raises(ValueError, match="is a FIFO"):
        tuning.load_tuning(tmp_path / "to_fifo.json")


def test_save_tuning_replaces_only_a_regular_file(tmp_path: Path) -> None:
    """The atomic rename would replace a link or a FIFO itself: both are refused."""
    real = tmp_path / "real.json"
    real.write_text("keep")
    os.symlink(real, tmp_path / "link.json")
    with pytest.raises(ValueError, match=r"link\.json' is a symbolic link"):
        tuning.save_tuning(tmp_path / "link.json")
    assert (tmp_path / "link.json").is_symlink() and real.read_text() == "keep"
    os.symlink(tmp_path / "missing.json", tmp_path / "dangling.json")
    with pytest.raises(ValueError, match="is a symbolic link"):
        tuning.save_tuning(tmp_path / "dangling.json")
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(ValueError, match="is a FIFO; only a regular file is replaced"):
        tuning.save_tuning(tmp_path / "fifo")
    assert (tmp_path / "fifo").is_fifo()
    assert tuning.save_tuning(real) == 0  # a regular file is replaced
    assert json.loads(real.read_text())["choices"] == []
    # A trailing separator names a folder (the rename failed naming the temporary file); a
    # name over 255 bytes cannot exist (a bare OSError): both refused by name, nothing left.
    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(ValueError, match=r"new/' ends in a separator, so it names a folder"):
        tuning.save_tuning(f"{tmp_path}/new/")
    with pytest.raises(ValueError, match="is 305 bytes, over the 255-byte limit"):
        tuning.save_tuning(tmp_path / ("a" * 300 + ".json"))
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_a_tuning_file_must_be_a_small_regular_file(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="does not exist"):
        tuning.load_tuning(tmp_path / "missing.json")
    with pytest.raises(ValueError, match="directory"):
        tuning.load_tuning(tmp_path)
    big = tmp_path / "big.json"
    big.write_bytes(b" " * (tuning.MAX_FILE_BYTES + 1))
    with pytest.raises(ValueError, match="tuning file"):
        tuning.load_tuning(big)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(ValueError, match="FIFO"):
        tuning.load_tuning(fifo)
    # one bad entry after a good one: nothing of the file is added
    doc = _doc()
    doc["choices"].append({**doc["choices"][0], "c_in": -1})
    part = tmp_path / "part.json"
    part.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match=r"choices\[1\]"):
        tuning.load_tuning(part)
    assert tuning.tuning_choices() == {}
