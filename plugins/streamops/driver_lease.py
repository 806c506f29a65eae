"""Exactly one driver per checkpoint, across hosts: a lease with an epoch, kept with the checkpoint.

    <checkpoint>/_runtime/lease/epoch-0000000007.json   who took epoch 7 (host, pid, app, ttl_s, when);
                                                        created once and never rewritten
    <checkpoint>/_runtime/lease/beat-0000000007.json    the holder's latest heartbeat (rewritten)
    <checkpoint>/_runtime/lease/ended-0000000007.json   how the holder of epoch 7 ended

A driver takes the lease by creating the next epoch's file. The file is written whole to a temporary
name and then hard-linked to its final name: link() fails if the name exists, on local disks and on
NFS alike, so of two drivers (on any hosts) racing for the same epoch exactly one wins, and nobody
ever reads half a record. A new epoch may only be taken when the current holder has ended, or its
heartbeat is older than the holder's own ttl_s (it died on another host, or it is paused), or it is
a process of this host that no longer exists (kill -9 here: no need to wait out the ttl).

The holder heartbeats from a thread of its own and checks, before each batch it writes and again
before the batch is committed, that no later epoch exists (`still_held`). A driver that was paused
(SIGSTOP, a long GC, a frozen VM) and wakes up after another took over sees the later epoch and
stops without committing. Clocks: the age of a heartbeat is read against the reader's clock, so the
hosts' clocks must agree to well within ttl_s (NTP does).

Each file has its record here (`LeaseEpoch`, `LeaseBeat`, `LeaseEnd`: JSON objects checked by
pydantic as streamops.runtime_records' are), written and read through it. Every field may be
missing (the readers' defaults stand in, as for files of older drivers); a file of the wrong shape
is refused where it is read (RuntimeRecordError naming the file and the field): the lease never
guesses who holds it. A torn file, or one that is not a JSON object, counts as absent, as before.

Storage: link() and rename() need a POSIX filesystem the drivers and the DAGs share (a local disk,
NFS, a cluster filesystem mount). An object store has no atomic create of a file that must not
exist (S3 has conditional writes, but not through a filesystem path), so an app whose checkpoint is
on an object store keeps its _runtime folder on a shared mount (streamops.app_runtime).
Imported by the Spark apps, so no Airflow here.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import psutil

# pydantic reads a TypedDict of typing_extensions only, before Python 3.12.
from typing_extensions import TypedDict

from streamops import settings
from streamops.process_identity import certainly_gone, start_mark
from streamops.runtime_files import read_json_object, write_json_atomic
from streamops.runtime_records import RuntimeRecordError, checked
from streamops.timestamps import iso_seconds

log = logging.getLogger("streamops.lease")

DEFAULT_TTL_S = 30.0
EPOCHS_KEPT = 50


def lease_ttl_s() -> float:
    """The ttl a driver declares when it takes the lease (STREAMOPS_LEASE_TTL_S, default 30 s):
    how long another driver waits for a silent holder before taking over."""
    raw = settings.LEASE_TTL_S.get()
    if not raw:
        return DEFAULT_TTL_S
    try:
        ttl = float(raw)
    except ValueError:
        raise ValueError(f"STREAMOPS_LEASE_TTL_S must be a number of seconds, not {raw!r}") from None
    if not 2 <= ttl <= 3600:
        raise ValueError(f"STREAMOPS_LEASE_TTL_S must be between 2 and 3600 seconds, not {ttl:g}")
    return ttl


class LeaseEpoch(TypedDict, total=False):
    """epoch-N.json: who took epoch N (DriverLease.take), with what the driver told it (`app`)."""

    epoch: int
    app: str | None
    host: str
    address: str | None  # the host's address in the cluster profile (STREAMOPS_HOST_ADDRESS)
    pid: int
    pid_created: float  # its create time (wall clock), for people to read
    pid_start: str  # process_identity.start_mark: a reused pid is never taken for it (absent: older)
    ttl_s: float  # how long others wait for a silent holder
    taken_at_s: float
    taken_at: str


class LeaseBeat(TypedDict, total=False):
    """beat-N.json: the holder's latest heartbeat."""

    at_s: float
    pid: int


class LeaseEnd(TypedDict, total=False):
    """ended-N.json: how the holder of epoch N ended (a driver's outcome: stopped, failed, fenced)."""

    outcome: str
    at_s: float
    pid: int


_LeaseRecord = TypeVar("_LeaseRecord", LeaseEpoch, LeaseBeat, LeaseEnd)


def _read(kind: type[_LeaseRecord], path: Path) -> _LeaseRecord | None:
    """The record in a lease file (None: none, or torn); RuntimeRecordError names a file of the
    wrong shape."""
    value = read_json_object(path)
    return None if value is None else checked(kind, value, str(path))


class LeaseTaken(RuntimeError):
    """Another driver holds the lease; `holder` says who."""

    def __init__(self, message: str, holder: Holder):
        super().__init__(message)
        self.holder = holder


@dataclass(frozen=True)
class Holder:
    """One epoch's holder, as its files say."""

    epoch: int
    record: LeaseEpoch
    last_beat_s: float  # wall-clock seconds of its newest heartbeat (or of taking the lease)
    ended: LeaseEnd | None

    @property
    def host(self) -> str:
        return str(self.record.get("host", "?"))

    @property
    def pid(self) -> Any:
        return self.record.get("pid", "?")

    @property
    def where(self) -> str:
        """The host, with the address the cluster profile gave it when there is one."""
        address = self.record.get("address")
        return f"{self.host} ({address})" if address and address != self.host else self.host

    def silent_for_s(self, now: float | None = None) -> float:
        return max(0.0, (now if now is not None else time.time()) - self.last_beat_s)

    def describe(self) -> str:
        return f"epoch {self.epoch}: driver pid {self.pid} on {self.where}, heartbeat {self.silent_for_s():.0f}s ago"


def _process_gone(record: LeaseEpoch) -> bool:
    """True only when the holder is a process of this host that no longer exists (its pid and start
    mark, so a reused pid is not mistaken for it). Another host's process is never 'gone' from
    here: only its heartbeat can tell."""
    if record.get("host") != socket.gethostname():
        return False
    return certainly_gone(record.get("pid"), record.get("pid_start"), record.get("pid_created"))


def _alive(holder: Holder | None) -> Holder | None:
    if holder is None or holder.ended is not None:
        return None
    if holder.silent_for_s() > float(holder.record.get("ttl_s", DEFAULT_TTL_S)):
        return None
    if _process_gone(holder.record):
        return None
    return holder


class DriverLease:
    """The lease of one checkpoint's runtime folder."""

    def __init__(self, runtime_dir: Path):
        self.dir = Path(runtime_dir) / "lease"
        self.epoch: int | None = None  # the epoch this process holds, once taken
        self._beater: threading.Thread | None = None
        self._stop_beating = threading.Event()
        self._lost_callbacks: list[Callable[[Holder | None], None]] = []
        self._lost: Holder | None = None
        self._lost_reported = False
        self._lost_lock = threading.Lock()
        self.ttl_s = DEFAULT_TTL_S
        self._last_beat = 0.0
        self._beat_callbacks: list[Callable[[], None]] = []

    def _epoch_file(self, epoch: int) -> Path:
        return self.dir / f"epoch-{epoch:010d}.json"

    def _beat_file(self, epoch: int) -> Path:
        return self.dir / f"beat-{epoch:010d}.json"

    def _ended_file(self, epoch: int) -> Path:
        return self.dir / f"ended-{epoch:010d}.json"

    # --- reading -------------------------------------------------------------------------------

    def latest_epoch(self) -> int:
        if not self.dir.exists():
            return 0
        numbers = [int(p.name[6:16]) for p in self.dir.glob("epoch-*.json") if p.name[6:16].isdigit()]
        return max(numbers, default=0)

    def holder(self, epoch: int | None = None) -> Holder | None:
        """The holder of `epoch` (default: the latest), or None when no driver ever took one."""
        epoch = epoch if epoch is not None else self.latest_epoch()
        record = _read(LeaseEpoch, self._epoch_file(epoch)) if epoch else None
        if record is None:
            return None
        beat = _read(LeaseBeat, self._beat_file(epoch)) or LeaseBeat()
        last = max(record.get("taken_at_s", 0.0), beat.get("at_s", 0.0))
        return Holder(epoch, record, last, _read(LeaseEnd, self._ended_file(epoch)))

    def live_holder(self) -> Holder | None:
        """The latest epoch's holder while it holds the lease: not ended, heartbeat within its
        ttl, and not a vanished process of this host. None when the lease is free to take."""
        return _alive(self.holder())

    # --- the holder's side ---------------------------------------------------------------------

    def take(self, info: dict[str, Any], ttl_s: float | None = None) -> int:
        """Take the next epoch for this process and start heartbeating; raise LeaseTaken naming
        the holder when a live driver holds it, or when another driver won the same epoch."""
        ttl = ttl_s if ttl_s is not None else lease_ttl_s()
        self.dir.mkdir(parents=True, exist_ok=True)
        # The epoch judged is the one taken over: a driver that takes it meanwhile makes the
        # link below fail, so a live holder is never replaced.
        latest = self.latest_epoch()
        current = _alive(self.holder(latest))
        if current is not None:
            raise LeaseTaken(f"the lease is held ({current.describe()})", current)
        epoch = latest + 1
        now = time.time()
        record = {**info, "epoch": epoch, "host": socket.gethostname(), "address": settings.HOST_ADDRESS.get(),
                  "pid": os.getpid(), "pid_created": psutil.Process().create_time(), "pid_start": start_mark(),
                  "ttl_s": ttl, "taken_at_s": now,
                  "taken_at": iso_seconds(int(now * 1000))}
        staged = self.dir / f".epoch-{epoch:010d}.{socket.gethostname()}.{os.getpid()}.tmp"
        staged.write_text(json.dumps(checked(LeaseEpoch, record, str(self._epoch_file(epoch))), sort_keys=True))
        try:
            os.link(staged, self._epoch_file(epoch))
        except FileExistsError:
            winner = self.holder(epoch)
            raise LeaseTaken(
                f"another driver took epoch {epoch} at the same moment ({winner.describe() if winner else 'unreadable'})",
                winner or Holder(epoch, LeaseEpoch(), 0.0, None),
            ) from None
        finally:
            staged.unlink(missing_ok=True)
        self.epoch = epoch
        self.ttl_s = ttl
        self._last_beat = time.monotonic()
        self._prune(epoch)
        self._stop_beating.clear()
        self._beater = threading.Thread(target=self._beat_loop, args=(ttl / 6,), name="streamops-lease", daemon=True)
        self._beater.start()
        return epoch

    def on_lost(self, callback: Callable[[Holder | None], None]) -> None:
        """Call `callback(new_holder)` once, from the heartbeat thread, when a later epoch appears."""
        self._lost_callbacks.append(callback)

    def still_held(self) -> bool:
        """True while no later epoch exists and this holder's own heartbeats kept it alive:
        checked before a batch is written and before it is committed. A holder whose last
        heartbeat is older than 90% of its ttl (it was paused, or could not write) counts as
        lost even before anyone takes over: others may call it dead any moment now."""
        if self.epoch is None:
            return False
        if self._lost is not None or self._silent_too_long():
            self._note_lost()
            return False
        try:
            taken = self._epoch_file(self.epoch + 1).exists()
        except OSError:  # the mount is not answering: we cannot know, so we must not write
            return False
        if taken:
            self._note_lost()
            return False
        return True

    def _silent_too_long(self) -> bool:
        return time.monotonic() - self._last_beat > 0.9 * self.ttl_s

    @property
    def lost_to(self) -> Holder | None:
        """The driver that took over, once this one has noticed."""
        return self._lost

    def lost_reason(self) -> str:
        taker = self._lost
        if taker is None:
            return (f"the lease of epoch {self.epoch} ran out: this driver wrote no heartbeat for more than its ttl "
                    f"({self.ttl_s:g}s; paused, or its runtime folder did not answer), so another driver may take over; "
                    "it stopped without committing")
        return (f"the lease of epoch {self.epoch} was taken over by driver pid {taker.pid} on {taker.where} "
                f"(epoch {taker.epoch}) while this driver was silent (paused or cut off); it stopped without committing")

    def end(self, outcome: str) -> None:
        """Record how the holder ended and stop heartbeating (the lease is then free to take)."""
        self._stop_beating.set()
        if self._beater is not None and self._beater is not threading.current_thread():
            self._beater.join(timeout=5)
        if self.epoch is not None:
            self._write(self._ended_file(self.epoch), LeaseEnd(outcome=outcome, at_s=time.time(), pid=os.getpid()))

    def _note_lost(self) -> None:
        with self._lost_lock:
            if self._lost_reported:
                return
            self._lost_reported = True
            try:
                self._lost = self.holder(self.epoch + 1) if self.epoch is not None else None
            except (OSError, RuntimeRecordError):  # the reason is then told without the new holder
                self._lost = None
        log.error("%s", self.lost_reason())
        # In a thread of their own: the caller may be a micro-batch (the sink's check), and
        # stopping a query from inside its own batch would wait for itself.
        threading.Thread(target=self._run_lost_callbacks, name="streamops-lease-lost", daemon=True).start()

    def _run_lost_callbacks(self) -> None:
        for callback in self._lost_callbacks:
            try:
                callback(self._lost)
            except Exception:  # one callback must not keep the others from running
                log.exception("a lease-lost callback failed")

    def on_beat(self, callback: Callable[[], None]) -> None:
        """Call `callback()` after each heartbeat, from the heartbeat thread, while the lease is held."""
        self._beat_callbacks.append(callback)

    def _beat_loop(self, interval_s: float) -> None:
        while not self._stop_beating.wait(interval_s):
            try:
                epoch = self.epoch
                if epoch is None or not self.still_held():
                    return
                self._write(self._beat_file(epoch), LeaseBeat(at_s=time.time(), pid=os.getpid()))
                self._last_beat = time.monotonic()
                for callback in self._beat_callbacks:
                    callback()
            except Exception as exc:  # noqa: BLE001 - a full or unreachable mount: keep trying; the ttl decides
                log.warning("could not renew the lease heartbeat: %s", exc)

    def _write(self, path: Path, payload: LeaseBeat | LeaseEnd) -> None:
        write_json_atomic(path, payload)

    def _prune(self, epoch: int) -> None:
        for path in self.dir.glob("*-*.json"):
            number = path.name.split("-", 1)[1][:10]
            if number.isdigit() and int(number) <= epoch - EPOCHS_KEPT:
                path.unlink(missing_ok=True)
