"""``python -m torch_lattice.migration``: the ``convert-checkpoint`` CLI."""

import sys

from torch_lattice.migration.cli import main

sys.exit(main())
