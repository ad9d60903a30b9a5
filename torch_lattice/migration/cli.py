"""``convert-checkpoint``: legacy TorchSparse checkpoint to Torch Lattice safetensors.

Exit status: 0 converted; 1 an operating-system error while writing; 2 a refused
input (bad arguments, spec problems, optimizer state, unsafe pickle, a corrupted
archive (bad CRC, duplicate entries), an expanded tensor, a size beyond the memory
budget, an output path that is an input, existing output without ``--force``),
reported as one ``error: ...`` line on stderr with nothing written.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from torch_lattice.migration.checkpoint import convert_checkpoint
from torch_lattice.migration.errors import ConversionError

__all__ = ["main"]

EXIT_OK = 0
EXIT_OS_ERROR = 1
EXIT_REFUSED = 2


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


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the CLI; returns the exit status (see the module docstring)."""
    args = _parser().parse_args(argv)
    try:
        done = convert_checkpoint(
            args.source,
            args.output,
            args.kernel_spec,
            manifest=args.manifest,
            force=args.force,
        )
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
