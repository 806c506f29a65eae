"""A warm standby driver: the next version's driver, started while the current one still runs.

A rolling restart starts the new version with `--standby TOKEN`. That driver loads its program,
builds its Spark session and its queries' plans (the slow part of a start), reports itself ready
here, and waits, without the lease, for the rollout's word:

    <checkpoint>/_runtime/standby/<token>.ready.json   the standby: pid, host, plan fingerprint
    <checkpoint>/_runtime/standby/<token>.word.json    the rollout: "go" (after the old driver
                                                       stopped and the checkpoint was backed up)
                                                       or "abort" (with why)

On "go" it takes the lease like any driver (a live holder still refuses it) and starts its queries
from the checkpoint, so the output gap of a roll is the old driver's stop plus a query start, not a
JVM and session start. A standby that hears nothing within its timeout exits by itself (the rollout
that started it is gone); it never held the lease, so nothing else needs to notice.
Files, not signals: the rollout and the standby may run on different hosts that share the
checkpoint's _runtime folder. Imported by the Spark apps, so no Airflow here.
"""

from __future__ import annotations

import os
import re
import secrets
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

from streamops.runtime_files import read_json_object, write_json_atomic
from streamops.waiting import poll_until

GO, ABORT = "go", "abort"
_TOKEN = re.compile(r"^[a-z0-9-]{6,64}$")


def new_token() -> str:
    return f"standby-{secrets.token_hex(6)}"


class StandbySlot:
    """The two files one standby and its rollout talk through."""

    def __init__(self, runtime_dir: Path, token: str):
        if not _TOKEN.match(token):
            raise ValueError(f"a standby token is 6-64 lowercase letters, digits or dashes, not {token!r}")
        self.dir = Path(runtime_dir) / "standby"
        self.token = token
        self.ready_file = self.dir / f"{token}.ready.json"
        self.word_file = self.dir / f"{token}.word.json"

    def _write(self, path: Path, payload: dict[str, Any]) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        write_json_atomic(path, payload)

    # --- the standby driver's side ---------------------------------------------------------------

    def report_ready(self, **details: Any) -> None:
        self._write(self.ready_file, {"pid": os.getpid(), "host": socket.gethostname(), **details})

    def await_word(self, timeout_s: float, interrupted: Callable[[], bool]) -> dict[str, Any]:
        """The rollout's word ({"word": "go"|"abort", ...}); {"word": "abort", "why": ...} when
        `interrupted()` (a signal) or nothing came within `timeout_s` (DeadlineExceeded)."""
        def heard() -> dict[str, Any] | None:
            if interrupted():
                return {"word": ABORT, "why": "signalled while waiting"}
            return read_json_object(self.word_file)

        # Polled often: the time between the word and this driver's start is the roll's gap.
        return poll_until(heard, timeout=timeout_s, what="the rollout's word", interval=0.02, max_interval=0.05)

    def clear(self) -> None:
        for path in (self.ready_file, self.word_file):
            path.unlink(missing_ok=True)

    # --- the rollout's side ----------------------------------------------------------------------

    def ready(self) -> dict[str, Any] | None:
        return read_json_object(self.ready_file)

    def say(self, word: str, **details: Any) -> None:
        self._write(self.word_file, {"word": word, **details})
