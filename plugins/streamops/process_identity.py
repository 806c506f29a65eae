"""Which process a recorded pid names: the pid with a start mark that no clock change moves.

Records (driver, lease, operation) and pid files name a process by its pid and when it started, so a
pid the OS hands to another process later is never taken for it. `psutil.Process.create_time()`
cannot be that start: on Linux it is the process's start in ticks since boot plus the boot time as
the wall clock gives it *now* (/proc/stat `btime`), and a stepped clock (NTP, a resumed VM, an
operator's `date -s`) moves every process's create time at once: each recorded process then looked
like another one, the local stack's services "not running" while they ran, a live driver's lease
"gone". The mark is the boot's id and the start in ticks since that boot, both fixed for the life
of the process. Where /proc is not there (a laptop's macOS running the CLI), the create time.
Read from /proc here because psutil keeps its clock-free start (ticks since boot) private: its
public API gives only the create time.
"""

from __future__ import annotations

import psutil

_BOOT_ID_FILE = "/proc/sys/kernel/random/boot_id"
_LEGACY_TOLERANCE_S = 1.0  # create times (records from before the mark, or no /proc) compared a second apart


def _boot_id() -> str | None:
    try:
        with open(_BOOT_ID_FILE) as f:
            return f.read().strip()
    except OSError:
        return None


_BOOT = _boot_id()


def _start_ticks(pid: int) -> int:
    """Field 22 of /proc/<pid>/stat (after the command name, which may hold spaces and parentheses)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except FileNotFoundError:
        raise psutil.NoSuchProcess(pid) from None
    return int(stat[stat.rindex(b")") + 2:].split()[19])


def start_mark(process: psutil.Process | None = None) -> str:
    """This process's (or `process`'s) start mark; raises psutil.NoSuchProcess when it is gone."""
    process = process or psutil.Process()
    if _BOOT is not None:
        return f"{_BOOT}+{_start_ticks(process.pid)}"
    return f"created:{process.create_time():.2f}"


def _same_start(process: psutil.Process, mark: str | None, created: float | None) -> bool | None:
    """Whether `process` started when the record says; None when that cannot be told here."""
    if mark and not mark.startswith("created:"):
        if _BOOT is None:
            return None  # a boot's mark read where /proc is not: no way to compare
        return start_mark(process) == mark  # another boot's id: another process
    if mark:  # the create time (no /proc where it was written): as clock-bound as it is
        try:
            created = float(mark.removeprefix("created:"))
        except ValueError:
            return None
    if isinstance(created, (int, float)):  # that, or a record from before the mark
        return abs(process.create_time() - created) < _LEGACY_TOLERANCE_S
    return None


def live_process(pid: object, mark: str | None, created: float | None = None) -> psutil.Process | None:
    """The live process the record names (its pid, started when the mark says), else None: gone, a
    zombie, the pid reused, or a record that names no start."""
    if not isinstance(pid, int) or pid <= 0:
        return None
    try:
        process = psutil.Process(pid)
        if process.status() == psutil.STATUS_ZOMBIE or _same_start(process, mark, created) is not True:
            return None
        return process
    except psutil.Error:
        return None


def certainly_gone(pid: object, mark: str | None, created: float | None = None) -> bool:
    """True only when the named process no longer exists (no such pid, a zombie, or the pid now
    another process's); False when that cannot be told (a live pid with no start to compare,
    access refused): a lease is never taken from a holder that may still run."""
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        process = psutil.Process(pid)
        return process.status() == psutil.STATUS_ZOMBIE or _same_start(process, mark, created) is False
    except psutil.NoSuchProcess:
        return True
    except psutil.Error:
        return False
