"""Every time format the suite writes, and the one reader of the times it recorded.

Each format is a named function taking an instant as an aware `datetime` or as epoch
milliseconds (`int`, exact: no float in between); a naive datetime is taken as local time, as
`datetime.astimezone` does. Every output is UTC but `iso_as_given`'s.

    iso_ms(t)          2026-11-24T01:00:00.123Z    runtime files, ledgers, history, audit, outputs' times
    iso_seconds(t)     2026-11-24T01:00:00Z        the lease's taken_at, window bounds in a comparison
    iso_seconds_utc(t) 2026-11-24T01:00:00+00:00   when a plan, artifact, report, validation or binding was made
    iso_as_given(t)    2026-11-24T02:00:00+01:00   an operator's own time echoed back, in the offset they gave
    page_time(t)       2026-11-24 01:00:00 UTC     the apps page's "as of"
    file_stamp(t)      20261124T010000.123456Z     names that sort by time: driver logs, snapshots, run ids
    run_tag(t)         20261124t010000             a default tag in topic names ([a-z0-9-]: lower-case t)

Spark writes the same texts in SQL (`date_format`): `SPARK_ISO_MS` is `iso_ms`'s pattern,
`SPARK_ISO_MS_OFFSET` the dead-letter envelope's (a zero offset prints as "Z", so under the UTC
session every driver runs in it is `iso_ms`'s text too).

`parse_recorded_time` reads any of the ISO texts above back (and those older versions of the
suite wrote: "+00:00" or "Z", with or without a fraction), None for nothing or a text that is not
a time: a reader of a runtime file tolerates a value it cannot read. (What an operator types, a
time with its timezone, is read by `streamops.kafka_offsets.parse_time`, which refuses in words.)

`epoch_ms` and `from_epoch_ms` convert exactly between the two ways the suite holds an instant.

This module imports nothing of the project and nothing beyond the standard library: the shipped
programs' Python code (`streamops.records.iso_ms` in Spark's Python workers) imports it.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MS = timedelta(milliseconds=1)

# Spark SQL's date_format patterns for the same texts.
SPARK_ISO_MS = "yyyy-MM-dd'T'HH:mm:ss.SSS'Z'"
SPARK_ISO_MS_OFFSET = "yyyy-MM-dd'T'HH:mm:ss.SSSXXX"


def utc_now() -> datetime:
    return datetime.now(UTC)


def epoch_ms(moment: datetime) -> int:
    """Milliseconds since 1970 (floored, exact: Kafka's timestamps and offsets-for-time take them)."""
    return (_utc(moment) - EPOCH) // _MS


def from_epoch_ms(ms: int) -> datetime:
    """The UTC instant of epoch milliseconds (any year 0001-9999)."""
    return EPOCH + timedelta(milliseconds=int(ms))


def _utc(moment: datetime | int) -> datetime:
    if isinstance(moment, bool) or not isinstance(moment, datetime | int):
        raise TypeError(f"an instant is a datetime or epoch milliseconds, not {type(moment).__name__}: {moment!r}")
    return from_epoch_ms(moment) if isinstance(moment, int) else moment.astimezone(UTC)


def _date_time(moment: datetime) -> str:
    # strftime's %Y does not pad a year before 1000 on every platform: the year is written by hand.
    return f"{moment.year:04d}-{moment:%m-%dT%H:%M:%S}"


def iso_ms(moment: datetime | int) -> str:
    """'2026-11-24T01:00:00.123Z': an instant, UTC, to the millisecond (cut, not rounded)."""
    utc = _utc(moment)
    return f"{_date_time(utc)}.{utc.microsecond // 1000:03d}Z"


def now_iso() -> str:
    """The current instant as `iso_ms` writes it: what a runtime file records as "now"."""
    return iso_ms(utc_now())


def iso_seconds(moment: datetime | int) -> str:
    """'2026-11-24T01:00:00Z': an instant, UTC, to the second."""
    return _date_time(_utc(moment)) + "Z"


def iso_seconds_utc(moment: datetime | int) -> str:
    """'2026-11-24T01:00:00+00:00': an instant, UTC, to the second, with its offset spelt out."""
    return _date_time(_utc(moment)) + "+00:00"


def iso_as_given(moment: datetime) -> str:
    """'2026-11-24T02:00:00+01:00': an aware time in the offset it carries (a fraction only if it
    has one): an operator's time echoed back as they meant it."""
    if moment.tzinfo is None:
        raise ValueError(f"{moment!r} has no timezone: an instant echoed back must say its offset")
    return moment.isoformat()


def page_time(moment: datetime | int) -> str:
    """'2026-11-24 01:00:00 UTC': an instant for a person reading a page."""
    return _date_time(_utc(moment)).replace("T", " ") + " UTC"


def file_stamp(moment: datetime | int) -> str:
    """'20261124T010000.123456Z': a UTC stamp for names that sort by time (file and folder
    names, run ids): digits only around the T, to the microsecond."""
    utc = _utc(moment)
    return f"{utc.year:04d}{utc:%m%dT%H%M%S}.{utc.microsecond:06d}Z"


def parse_file_stamp(stamp: str) -> datetime | None:
    """The time a `file_stamp` says (None: the text is not one)."""
    try:
        return datetime.strptime(stamp, "%Y%m%dT%H%M%S.%fZ").replace(tzinfo=UTC)
    except ValueError:
        return None


def run_tag(moment: datetime | int) -> str:
    """'20261124t010000': a UTC stamp to the second that may be part of a topic name (lower case)."""
    utc = _utc(moment)
    return f"{utc.year:04d}{utc:%m%dt%H%M%S}"


def parse_recorded_time(moment: Any) -> datetime | None:
    """An ISO-8601 time as the suite records it ('...Z' or '...+00:00'), or None for nothing or
    anything that is not one."""
    if not moment:
        return None
    try:
        return datetime.fromisoformat(str(moment).replace("Z", "+00:00"))
    except ValueError:
        return None
