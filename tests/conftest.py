"""Test-session settings shared by every test file.

The end of a run says in one line why tests were skipped, grouped by reason (issue 25:
a CPU machine skips some 450 CUDA tests, and a bare count said nothing about why).
pyproject.toml's ``-rs`` lists the same skips per test location above it.

Layout: the tests mirror the package (ops/, nn/, artifact/, migration/, and project/ for
the build, docs and tooling); the helper modules shared by several folders
(``cuda_helpers``, ``dense_oracle``, ...) stay here beside this file. No folder of tests/
has an ``__init__.py``, on purpose. pytest's default import mode (prepend) then puts this
file's folder and each test file's own folder first on ``sys.path`` and imports a test
file under its basename: a test imports a shared helper as ``import dense_oracle`` from
any folder, and pytest adds no folder above tests/ to ``sys.path``, so the tests import
the installed torch_lattice (scripts/check-wheel.sh runs them beside a wheel). Packages
would change both: pytest would insert the repository root, whose ``torch_lattice/``
then shadows the installed one, and import ``tests.ops.test_ops``. The price is that
basenames must be unique across tests/; tests/project/test_pytest_config.py checks that.
"""

from __future__ import annotations

from collections import Counter

import pytest


def skip_reasons(reports: list[pytest.TestReport]) -> Counter[str]:
    """How many skipped tests gave each reason."""
    reasons: Counter[str] = Counter()
    for report in reports:
        longrepr = report.longrepr
        # A skip's longrepr is (file, line, "Skipped: reason").
        text = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
        reasons[text.removeprefix("Skipped: ")] += 1
    return reasons


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    reasons = skip_reasons(terminalreporter.stats.get("skipped", []))
    if reasons:
        grouped = "; ".join(f"{n} {why}" for why, n in reasons.most_common())
        terminalreporter.write_line(f"skip reasons: {grouped}")
