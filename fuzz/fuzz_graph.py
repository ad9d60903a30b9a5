"""Fuzz target: the artifact graph parser and its load-time checks.

libFuzzer mutates the bytes of small valid ``graph.mlir`` files
(fuzz/corpus/graph/); each input is decoded as UTF-8 (bad bytes replaced, as a
caller must decode before parsing) and given to ``read_header``,
``parse_module`` and the contract checks ``load_lattice_program`` runs on a parsed
module (``validation.check_module``; each weight bound to a stand-in tensor). The
contract: a bad graph raises ``ValueError`` (``MlirSyntaxError`` with its line,
or the loader's own) or ``TypeError``, with a message. Anything else
(RecursionError, MemoryError, IndexError, KeyError, AttributeError, an
assertion, a hang past libFuzzer's -timeout) is a finding.
"""

from __future__ import annotations

import sys

if __package__ in (None, ""):
    import os

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch

from fuzz._common import Finding, main, require_clean
from torch_lattice.artifact import mlir_parse, replay_weights, validation
from torch_lattice.artifact.mlir_parse import parse_module, read_header

CLEAN = (ValueError, TypeError)


def _loader_checks(text: str) -> None:
    read_header(text)
    module = parse_module(text)
    validation.check_module(module)
    # What a successful parse promises the executors.
    defined = {a.name for a in module.arguments}
    for op in module.operations:
        missing = [v for v in op.operands if v not in defined]
        if missing:
            raise Finding(f"line {op.line}: operands {missing} used before definition passed")
        defined.update(op.results)
    if not set(module.returns) <= defined:
        raise Finding("a return of an undefined value passed")
    # Bind every weight to a stand-in tensor of its layout's rank (the loader's weight check).
    for op in module.operations:
        if op.spec.name == "weight":
            rank = {"conv3d": 5, "linear": 2, "embedding": 2}.get(op.result_types[0].family, 1)
            stored = {k: torch.zeros((1,) * rank) for k in replay_weights.storage_keys(op)}
            replay_weights.check_weight(op, stored)


def check(data: bytes) -> None:
    text = data.decode("utf-8", errors="replace")
    require_clean(lambda: _loader_checks(text), CLEAN)


def _instrument_parser() -> None:
    """Coverage feedback from the parser and checks themselves, not only this file."""
    import atheris

    for mod in (mlir_parse, validation, replay_weights):
        for obj in list(vars(mod).values()):
            if getattr(obj, "__module__", None) != mod.__name__:
                continue
            if hasattr(obj, "__code__"):
                atheris.instrument_func(obj)
            if isinstance(obj, type):
                for meth in vars(obj).values():
                    if hasattr(meth, "__code__"):
                        atheris.instrument_func(meth)


if __name__ == "__main__":
    _instrument_parser()
    main(check)
