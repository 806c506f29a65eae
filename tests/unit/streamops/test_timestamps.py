"""streamops.timestamps: each format the suite writes, exactly; the reader of recorded times; and no
time formatted anywhere else."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import numpy
import pytest

from streamops import records, timestamps
from streamops.timestamps import (
    epoch_ms,
    file_stamp,
    from_epoch_ms,
    iso_as_given,
    iso_ms,
    iso_seconds,
    iso_seconds_utc,
    page_time,
    parse_recorded_time,
    run_tag,
)

PLUGINS = Path(__file__).resolve().parents[3] / "plugins"
MOMENT = datetime(2026, 11, 24, 1, 2, 3, 456789, tzinfo=UTC)
MOMENT_MS = 1_795_482_123_456  # MOMENT in epoch milliseconds
PLUS_ONE = timezone(timedelta(hours=1))


def test_epoch_milliseconds_convert_exactly_both_ways():
    assert epoch_ms(MOMENT) == MOMENT_MS
    assert from_epoch_ms(MOMENT_MS) == MOMENT.replace(microsecond=456000)
    assert epoch_ms(MOMENT.astimezone(PLUS_ONE)) == MOMENT_MS
    assert epoch_ms(from_epoch_ms(1_764_000_000_123)) == 1_764_000_000_123
    assert epoch_ms(datetime(1969, 12, 31, 23, 59, 59, 999500, tzinfo=UTC)) == -1  # floored


@pytest.mark.parametrize("moment", [MOMENT, MOMENT_MS, MOMENT.astimezone(PLUS_ONE)], ids=["datetime", "epoch ms", "+01:00"])
def test_every_format_writes_the_same_instant_in_utc(moment):
    assert iso_ms(moment) == "2026-11-24T01:02:03.456Z"
    assert iso_seconds(moment) == "2026-11-24T01:02:03Z"
    assert iso_seconds_utc(moment) == "2026-11-24T01:02:03+00:00"
    assert page_time(moment) == "2026-11-24 01:02:03 UTC"
    assert run_tag(moment) == "20261124t010203"


def test_a_file_stamp_keeps_microseconds_and_sorts_by_time():
    assert file_stamp(MOMENT) == "20261124T010203.456789Z"
    assert file_stamp(MOMENT_MS) == "20261124T010203.456000Z"
    later = MOMENT + timedelta(microseconds=1)
    assert sorted([file_stamp(later), file_stamp(MOMENT)]) == [file_stamp(MOMENT), file_stamp(later)]


def test_the_formats_match_what_the_suite_wrote_before_them():
    """The texts the replaced strftime/isoformat calls wrote (files on disk, run ids, tags)."""
    assert iso_ms(MOMENT) == MOMENT.strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
    assert iso_seconds_utc(MOMENT) == MOMENT.isoformat(timespec="seconds")
    assert iso_seconds_utc(MOMENT_MS) == datetime.fromtimestamp(MOMENT_MS / 1000, tz=UTC).isoformat(timespec="seconds")
    assert iso_seconds(MOMENT) == MOMENT.strftime("%Y-%m-%dT%H:%M:%SZ")
    assert file_stamp(MOMENT) == MOMENT.strftime("%Y%m%dT%H%M%S.%fZ")
    assert run_tag(MOMENT) == MOMENT.strftime("%Y%m%dt%H%M%S")
    assert page_time(MOMENT) == MOMENT.strftime("%Y-%m-%d %H:%M:%S") + " UTC"


def test_years_before_1000_and_up_to_9999_keep_four_digits():
    assert iso_ms(from_epoch_ms(-62135596800000)) == "0001-01-01T00:00:00.000Z"
    assert iso_ms(datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC)) == "9999-12-31T23:59:59.999Z"
    assert run_tag(datetime(999, 1, 2, tzinfo=UTC)) == "09990102t000000"


def test_an_operators_time_is_echoed_in_the_offset_it_was_given():
    assert iso_as_given(datetime(2026, 11, 24, 1, tzinfo=UTC)) == "2026-11-24T01:00:00+00:00"
    assert iso_as_given(datetime(2026, 11, 24, 2, tzinfo=PLUS_ONE)) == "2026-11-24T02:00:00+01:00"
    assert iso_as_given(datetime(2026, 11, 24, 2, 0, 0, 500000, tzinfo=UTC)) == "2026-11-24T02:00:00.500000+00:00"
    with pytest.raises(ValueError, match="has no timezone"):
        iso_as_given(datetime(2026, 11, 24, 2))


def test_something_that_is_not_an_instant_is_refused_naming_its_type():
    with pytest.raises(TypeError, match="an instant is a datetime or epoch milliseconds, not str: '2026-11-24'"):
        iso_ms("2026-11-24")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="not bool"):
        iso_seconds(True)


@pytest.mark.parametrize("text", ["2026-11-24T01:02:03.456Z", "2026-11-24T01:02:03.456+00:00"])
def test_recorded_times_are_read_back_in_every_form_the_suite_wrote(text):
    assert parse_recorded_time(text) == MOMENT.replace(microsecond=456000)


def test_the_reader_reads_each_format_back_to_its_instant():
    for write in (iso_ms, iso_seconds, iso_seconds_utc):
        assert parse_recorded_time(write(MOMENT)) == MOMENT.replace(microsecond=0 if write is not iso_ms else 456000)


@pytest.mark.parametrize("value", [None, "", "t", "yesterday", 17])
def test_a_recorded_value_that_is_not_a_time_reads_as_none(value):
    assert parse_recorded_time(value) is None


def test_the_programs_write_times_through_the_same_function():
    assert records.iso_ms(MOMENT_MS) == timestamps.iso_ms(MOMENT_MS) == "2026-11-24T01:02:03.456Z"
    # A program's data may hold the milliseconds as a float (a column with nulls) or a numpy integer.
    assert records.iso_ms(float(MOMENT_MS)) == records.iso_ms(numpy.int64(MOMENT_MS)) == "2026-11-24T01:02:03.456Z"
    assert timestamps.SPARK_ISO_MS == "yyyy-MM-dd'T'HH:mm:ss.SSS'Z'"
    assert timestamps.SPARK_ISO_MS_OFFSET == "yyyy-MM-dd'T'HH:mm:ss.SSSXXX"


# What formats or parses a time by hand. kafka_offsets.parse_time reads what an operator types
# (a time with its timezone, refused in words), not a recorded time.
_AD_HOC = re.compile(r"strftime|strptime|isoformat|fromisoformat|fromtimestamp|gmtime|timestamp\(\) \* 1000|yyyy-MM")
_ALLOWED = {("streamops/kafka_offsets.py", "value = datetime.fromisoformat(text.strip())")}


def test_no_module_but_timestamps_formats_a_time():
    roots = [PLUGINS, PLUGINS.parent / "spark_apps", PLUGINS.parent / "dags"]
    found = []
    for path in sorted(p for root in roots for p in root.rglob("*.py")):
        if path == PLUGINS / "streamops" / "timestamps.py":
            continue
        where = str(path.relative_to(PLUGINS if path.is_relative_to(PLUGINS) else PLUGINS.parent))
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if _AD_HOC.search(line) and (where, line.strip()) not in _ALLOWED:
                found.append(f"{where}:{number}: {line.strip()}")
    assert found == []
