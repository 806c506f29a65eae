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
checkpoint's _runtime folder. Each file has one typed record, here with the words because
nothing but the two sides of this exchange reads them: `StandbyReady` and `StandbyWord`
(JSON objects, checked by pydantic as streamops.runtime_records' are). A ready file that is not a
StandbyReady is refused naming the file and the field (the rollout sends that standby away); a
word that is not a StandbyWord is an abort that says so. Imported by the Spark apps, so no
Airflow here.
"""

from __future__ import annotations

import os
import re
import secrets
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Final, Literal, NotRequired, Required

# pydantic reads a TypedDict of typing_extensions only, before Python 3.12.
from typing_extensions import TypedDict

from streamops.runtime_files import read_json_object, write_json_atomic
from streamops.runtime_records import RuntimeRecordError, checked
from streamops.waiting import poll_until

GO: Final = "go"
ABORT: Final = "abort"
_TOKEN = re.compile(r"^[a-z0-9-]{6,64}$")


class StandbyReady(TypedDict, total=False):
    """<token>.ready.json: the standby driver is ready (its session and plans are built)."""

    pid: Required[int]
    host: Required[str]
    state_check: StateCheckRecord  # Spark's verdict on restarting from the running version's checkpoint
    application_id: str | None  # its Spark application


class StateCheckRecord(TypedDict):
    """What driver.state_check found: the queries Spark checked on a copy, and each problem in
    words (none: this version restarts from the checkpoint); or why the standby left the check
    to the rollout (deferred: it had no executor to run it on)."""

    checked: list[str]
    problems: list[str]
    deferred: NotRequired[str]


class StandbyWord(TypedDict, total=False):
    """<token>.word.json: the rollout's word, go (by: the run that rolls) or abort (why)."""

    word: Required[Literal["go", "abort"]]
    by: str
    why: str


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

    def _write(self, path: Path, payload: StandbyReady | StandbyWord) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        write_json_atomic(path, payload)

    # --- the standby driver's side ---------------------------------------------------------------

    def report_ready(self, state_check: StateCheckRecord, application_id: str | None = None, *,
                     pid: int | None = None, host: str | None = None) -> None:
        """Say this driver is ready (`pid` and `host`: this process's unless given), with Spark's
        verdict on its restart from the checkpoint."""
        ready = StandbyReady(pid=os.getpid() if pid is None else pid, host=host or socket.gethostname(),
                             state_check=state_check)
        if application_id is not None:
            ready["application_id"] = application_id
        self._write(self.ready_file, checked(StandbyReady, ready, str(self.ready_file)))

    def await_word(self, timeout_s: float, interrupted: Callable[[], bool]) -> StandbyWord:
        """The rollout's word ({"word": "go"|"abort", ...}); {"word": "abort", "why": ...} when
        `interrupted()` (a signal), or the word is not a StandbyWord (why names the file and the
        field); DeadlineExceeded when nothing came within `timeout_s`."""
        def heard() -> StandbyWord | None:
            if interrupted():
                return StandbyWord(word=ABORT, why="signalled while waiting")
            value = read_json_object(self.word_file)
            if value is None:
                return None
            try:
                return checked(StandbyWord, value, str(self.word_file))
            except RuntimeRecordError as exc:  # a rollout this standby does not understand: it never starts
                return StandbyWord(word=ABORT, why=str(exc))

        # Polled often: the time between the word and this driver's start is the roll's gap.
        return poll_until(heard, timeout=timeout_s, what="the rollout's word", interval=0.02, max_interval=0.05)

    def clear(self) -> None:
        for path in (self.ready_file, self.word_file):
            path.unlink(missing_ok=True)

    # --- the rollout's side ----------------------------------------------------------------------

    def ready(self) -> StandbyReady | None:
        """The standby's report (None: not ready yet, or its file is torn); RuntimeRecordError
        names a file that is not a StandbyReady."""
        value = read_json_object(self.ready_file)
        return None if value is None else checked(StandbyReady, value, str(self.ready_file))

    def say(self, word: Literal["go", "abort"], *, by: str | None = None, why: str | None = None) -> None:
        said = StandbyWord(word=word)
        if by is not None:
            said["by"] = by
        if why is not None:
            said["why"] = why
        self._write(self.word_file, said)
