"""How a driver process ends, as its exit code: the one list launchers and supervisors read."""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    OK = 0  # finished (available-now), stopped on request, or a standby sent away
    FAILED = 1  # a query failed; driver.json says which batch and why
    USAGE = 2  # the command line was refused (argparse's own code)
    ALREADY_RUNNING = 3  # another driver holds the app's lease: nothing was started
    FENCED = 4  # a newer driver took the lease over: this one stopped without committing
    ARTIFACT_REFUSED = 5  # the artifact's bytes are not the ones its version was built with
