"""Test-session settings shared by every test file.

The end of a run says in one line why tests were skipped, grouped by reason (issue 25:
a CPU machine skips some 450 CUDA tests, and a bare count said nothing about why).
pyproject.toml's ``-rs`` lists the same skips per test location above it.
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
