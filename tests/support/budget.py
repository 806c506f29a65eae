"""The suite's time budget, visible at the end of every run: the wall-clock total and each test
module's time (setup, call and teardown of its tests), slowest first.

The project's budget for the whole test command is 40 minutes from a clean clone (docs/testing.md);
a module that grows shows here first. With two test processes the module times add up to more
than the wall clock: they ran side by side."""

from __future__ import annotations

import time
from collections import defaultdict

import pytest

BUDGET_MINUTES = 40


class ModuleTimes:
    def __init__(self) -> None:
        self.started = time.monotonic()
        self.seconds: dict[str, float] = defaultdict(float)
        self.tests: dict[str, set[str]] = defaultdict(set)

    @pytest.hookimpl
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        module = report.nodeid.split("::", 1)[0]
        self.seconds[module] += report.duration
        self.tests[module].add(report.nodeid)

    @pytest.hookimpl(trylast=True)
    def pytest_terminal_summary(self, terminalreporter) -> None:
        if not self.seconds:
            return
        wall = time.monotonic() - self.started
        summed = sum(self.seconds.values())
        terminalreporter.write_sep("=", f"time per test module, slowest first (budget: {BUDGET_MINUTES} min for the "
                                        "whole test command from a clean clone)")
        for module, seconds in sorted(self.seconds.items(), key=lambda item: -item[1]):
            terminalreporter.write_line(f"{seconds:8.1f} s  {len(self.tests[module]):4d} tests  {module}")
        terminalreporter.write_line(f"{summed:8.1f} s in the modules; {wall:.1f} s ({wall / 60:.1f} min) of wall clock "
                                    f"since pytest started")


def pytest_configure(config: pytest.Config) -> None:
    # Under pytest-xdist only the controller prints the summary (the workers' reports reach it).
    if not hasattr(config, "workerinput"):
        config.pluginmanager.register(ModuleTimes(), "streamops-module-times")
