"""Every baseline's output is compared with the library's before anything is timed.

A speed-up is only a claim when both sides computed the same numbers, so a workload gives,
beside the callables it times, one callable per implementation that returns its outputs as
named tensors (``{"out": ..., "grad_in": ...}``). :func:`disagreements` runs them once and
names every baseline whose outputs differ from the library's by more than the tolerance;
the workload then reports that baseline as ``disagrees: max |diff| = ...`` instead of
timing it. Names present on one side only (a baseline that gives no weight gradient) are
not compared; a baseline that raises is reported as failing.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch

__all__ = ["ATOL", "RTOL", "Outputs", "compare", "disagreements", "outputs_of"]

Outputs = dict[str, torch.Tensor]

# fp32 results of different summation orders differ by ~1e-6 of their magnitude; a missing
# or doubled contribution (a race, a wrong index) is a sizeable fraction of it.
RTOL = 1e-3
ATOL = 1e-5
HALF_TYPES = (torch.bfloat16, torch.float16)


def _rtol(*dtypes: torch.dtype) -> float:
    """RTOL, or 4 units of the coarsest half type's rounding among ``dtypes`` (a bfloat16
    result is rounded once in ours and after every kernel row in a bfloat16 baseline)."""
    return max([RTOL] + [4 * torch.finfo(d).eps for d in dtypes if d in HALF_TYPES])


def outputs_of(value: object) -> Outputs:
    """Named tensors from what an implementation returned: a dict, a tensor or a
    ``SparseTensor`` (its ``feats``), under the name ``out``.

    Raises:
        TypeError: ``value`` is none of those.
    """
    if isinstance(value, dict):
        return dict(value)
    if isinstance(value, torch.Tensor):
        return {"out": value}
    feats = getattr(value, "feats", None)
    if isinstance(feats, torch.Tensor):
        return {"out": feats}
    raise TypeError(f"check: expected a tensor, a SparseTensor or a dict, got {type(value)!r}")


def compare(ours: Outputs, theirs: Outputs) -> str | None:
    """None when every shared name agrees, else why not (shape, dtype kind or max |diff|).

    Integer tensors (neighbour tables) must be equal; floating ones agree when
    ``max |diff| <= ATOL + RTOL * max |ours|``, RTOL widened to 4 units of rounding
    where either side is bfloat16 or float16.
    """
    shared = [k for k in ours if k in theirs]
    if not shared:
        return f"disagrees: no output in common (ours {sorted(ours)}, theirs {sorted(theirs)})"
    for name in shared:
        a, b = ours[name].detach(), theirs[name].detach()
        if a.shape != b.shape:
            return f"disagrees: {name} shape {tuple(b.shape)}, ours {tuple(a.shape)}"
        if a.is_floating_point() != b.is_floating_point():
            return f"disagrees: {name} dtype {b.dtype}, ours {a.dtype}"
        if a.numel() == 0:
            continue
        if not a.is_floating_point():
            diff = float((a.long() - b.long()).abs().max())
            tol = 0.0
        else:
            a64, b64 = a.double(), b.double()
            if not bool(torch.isfinite(b64).all()):
                return f"disagrees: {name} has non-finite values"
            diff = float((a64 - b64).abs().max())
            tol = ATOL + _rtol(a.dtype, b.dtype) * float(a64.abs().max())
        if diff > tol:
            return f"disagrees: max |diff| = {diff:.3g} ({name}; tolerance {tol:.3g})"
    return None


def disagreements(reference: str, checks: Mapping[str, Callable[[], object]]) -> dict[str, str]:
    """Runs every check once; returns ``impl -> status`` for each baseline that disagrees
    with ``reference`` or raises (absent from the result: it agrees).

    Raises:
        ValueError: ``reference`` has no check.
    """
    if reference not in checks:
        raise ValueError(f"reference: {reference!r} has no check (have {sorted(checks)})")
    ours = outputs_of(checks[reference]())
    bad: dict[str, str] = {}
    for impl, fn in checks.items():
        if impl == reference:
            continue
        try:
            theirs = outputs_of(fn())
        except Exception as exc:  # a baseline that cannot compute is reported, not timed
            bad[impl] = f"failed in the check ({type(exc).__name__}: {exc})"[:160]
            continue
        why = compare(ours, theirs)
        if why is not None:
            bad[impl] = why
    return bad
