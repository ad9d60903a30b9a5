"""``convert-checkpoint``: legacy TorchSparse checkpoint to Torch Lattice safetensors.

Exit status: 0 converted; 1 an operating-system error while writing; 2 a refused
input (bad arguments, spec problems, optimizer state, unsafe pickle, a corrupted
archive (bad CRC, duplicate entries), an expanded tensor, a size beyond the memory
budget, an output path that is an input or lies under a file, existing output without
``--force``), reported as one ``error: ...`` line on stderr with nothing written; 143 ended by
SIGTERM, 130 by Ctrl-C (SIGINT), each after removing its temporary files (the outputs are both
the previous ones, or absent, or, where it came while they were put in place, both complete),
reported as one ``error: ...`` line.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import sys
import threading
from collections.abc import Iterator, Sequence

from torch_lattice.migration.checkpoint import convert_checkpoint
from torch_lattice.migration.errors import ConversionError

__all__ = ["main"]

EXIT_OK = 0
EXIT_OS_ERROR = 1
EXIT_REFUSED = 2
EXIT_TERMINATED = 128 + signal.SIGTERM  # what a shell reports for a process SIGTERM ended
EXIT_INTERRUPTED = 128 + signal.SIGINT  # and for one Ctrl-C ended


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="convert-checkpoint",
        description=(
            "Convert a legacy TorchSparse checkpoint (model state only) into Torch Lattice "
            "safetensors plus a JSON manifest. The source is read with "
            "torch.load(weights_only=True); optimizer state is refused."
        ),
    )
    parser.add_argument("source", help="legacy checkpoint (.pt/.pth)")
    parser.add_argument("output", help="safetensors file to write")
    parser.add_argument(
        "--kernel-spec",
        required=True,
        metavar="SPEC.json",
        help='JSON {"<module>.kernel": [Kx, Ky, Kz] | {"kernel_size": [...], '
        '"row_order": "x_fastest" | "z_fastest"}} listing every legacy kernel; a single '
        'module\'s own state dict lists its kernel as "kernel"',
    )
    parser.add_argument(
        "--manifest", metavar="M.json", help="manifest path (default: OUTPUT with .json suffix)"
    )
    parser.add_argument("--force", action="store_true", help="overwrite existing outputs")
    return parser


class _Terminated(BaseException):
    """SIGTERM arrived: raised where the conversion is, so its clean-up runs (a
    BaseException, like KeyboardInterrupt, so no ``except Exception`` takes it)."""


def _terminate(signum: int, frame: object) -> None:
    raise _Terminated


@contextlib.contextmanager
def _cleanup_on_sigterm() -> Iterator[None]:
    """SIGTERM (``kill``, a job scheduler's stop) ends the process without running any
    clean-up, leaving its temporary files; as an exception it unwinds like Ctrl-C. Python
    runs the handler between bytecodes, so a file that safetensors is writing is
    finished (and then removed) first. Only the main thread may set handlers."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _terminate)
    try:
        yield
    finally:
        # None: a handler set outside Python, which cannot be put back from here.
        signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the CLI; returns the exit status (see the module docstring)."""
    args = _parser().parse_args(argv)
    try:
        with _cleanup_on_sigterm():
            done = convert_checkpoint(
                args.source,
                args.output,
                args.kernel_spec,
                manifest=args.manifest,
                force=args.force,
            )
    except _Terminated:
        print("error: terminated (SIGTERM); the outputs are either both the previous "
              "ones (or absent) or both complete, and no temporary file is left",
              file=sys.stderr)
        return EXIT_TERMINATED
    except KeyboardInterrupt:  # unwound like SIGTERM: one line, not a traceback
        print("error: interrupted (Ctrl-C); the outputs are either both the previous ones "
              "(or absent) or both complete, and no temporary file is left", file=sys.stderr)
        return EXIT_INTERRUPTED
    except (ConversionError, ValueError, TypeError) as exc:  # a refused input, or the budget
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    except OSError as exc:
        print(f"error: cannot write outputs: {exc}", file=sys.stderr)
        return EXIT_OS_ERROR
    summary = {
        "output": str(done.output),
        "manifest": str(done.manifest_path),
        "tensor_count": done.manifest["tensor_count"],
        "kernel_count": len(done.result.kernels),
    }
    print(json.dumps(summary, sort_keys=True))
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
