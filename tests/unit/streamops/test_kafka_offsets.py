"""streamops.kafka_offsets without a broker: the duration grammar, the time bounds, and the one
parser of "from when / until when" (each accepted form, each refusal in its exact words, the
boundaries at 1970, 3000 and 3650 days). The broker half (watermarks, offsets for a time, end
offsets) is exercised by the tests of its callers against a real broker."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest

from streamops.kafka_offsets import (
    BACK,
    DURATION_FORM_PATTERN,
    DURATION_PATTERN,
    EARLIEST,
    EARLIEST_TIME,
    LATEST_TIME,
    MAX_LOOKBACK,
    MAX_OFFSET,
    MAX_PARTITION,
    MOMENT_FORMS,
    NOW,
    TIME,
    TIME_PATTERN,
    Moment,
    duration_ms,
    moment_pattern,
    parse_moment,
    parse_time,
    time_back,
)

UTC = UTC
NOW_AT = datetime(2026, 11, 23, 3, 0, tzinfo=UTC)
OUT_OF_RANGE = ("is out of range: a time must be from 1970-01-01T00:00:00Z (where Kafka timestamps start) to "
                "before 3000-01-01T00:00:00Z")
NO_TIMEZONE = "has no timezone: add Z or an offset such as +01:00"
NOT_ISO = "is not an ISO-8601 time (e.g. 2026-11-22T10:00:00Z)"
NOT_DURATION = "must look like '30 minutes' or '6 hours' (a time back from now)"
TOO_FAR_BACK = "is more than 3650 days back; for everything retained use 'earliest'"
BEFORE_1970 = "reaches back before 1970-01-01T00:00:00Z, where Kafka timestamps start"


def refusal(call, *args, **kwargs) -> str:
    with pytest.raises(ValueError) as refused:
        call(*args, **kwargs)
    return str(refused.value)


# --- bounds and grammar -----------------------------------------------------------------------------


def test_the_bounds_are_kafkas():
    assert MAX_OFFSET == 2**63 - 1 and MAX_PARTITION == 2**31 - 1
    assert EARLIEST_TIME == datetime(1970, 1, 1, tzinfo=UTC) and LATEST_TIME == datetime(3000, 1, 1, tzinfo=UTC)
    assert MAX_LOOKBACK == timedelta(days=3650)


def test_the_patterns_are_the_ones_the_catalog_and_the_forms_always_used():
    # Pinned: the catalog's Duration type and every trigger form's schema carry these strings.
    assert DURATION_PATTERN == r"^[1-9][0-9]* (millisecond|second|minute|hour|day)s?$"
    assert DURATION_FORM_PATTERN == r"^[1-9][0-9]{0,11} (millisecond|second|minute|hour|day)s?$"
    assert TIME_PATTERN == r"^(19[7-9][0-9]|2[0-9]{3})-[0-9]{2}-[0-9]{2}([T ][0-9:.]+)?(Z|[+-][0-9]{2}:?[0-9]{2})?$"


def test_the_catalog_reads_durations_with_the_same_grammar():
    from streamops.catalog import Duration

    assert Duration.__metadata__[0].pattern == DURATION_PATTERN


@pytest.mark.parametrize(("text", "ms"), [
    ("1 millisecond", 1), ("250 milliseconds", 250), ("1 second", 1_000), ("10 seconds", 10_000), ("1 minute", 60_000),
    ("5 minutes", 300_000), ("1 hour", 3_600_000), ("6 hours", 21_600_000), ("1 day", 86_400_000), ("3650 days", 315_360_000_000),
])
def test_duration_ms(text, ms):
    assert re.fullmatch(DURATION_PATTERN, text)
    assert duration_ms(text) == ms


def test_the_form_bounds_a_duration_to_12_digits_the_code_does_not():
    assert re.fullmatch(DURATION_FORM_PATTERN, "999999999999 days") and re.fullmatch(DURATION_PATTERN, "999999999999 days")
    assert not re.fullmatch(DURATION_FORM_PATTERN, "1000000000000 days") and re.fullmatch(DURATION_PATTERN, "1000000000000 days")
    for text in ("0 days", "06 hours", "6 hour s", "6 weeks", "6hours", "-6 hours", "6.5 hours", " 6 hours", "6 Hours"):
        assert not re.fullmatch(DURATION_PATTERN, text) and not re.fullmatch(DURATION_FORM_PATTERN, text), text


# --- parse_time ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "at"), [
    ("2026-11-22T10:00:00Z", datetime(2026, 11, 22, 10, tzinfo=UTC)),
    ("2026-11-22T10:00:00+01:00", datetime(2026, 11, 22, 9, tzinfo=UTC)),
    ("2026-11-22 10:00:00-05:00", datetime(2026, 11, 22, 15, tzinfo=UTC)),
    ("2026-11-22T04:00:00.5Z", datetime(2026, 11, 22, 4, 0, 0, 500_000, tzinfo=UTC)),
    (" 2026-11-22T10:00:00Z ", datetime(2026, 11, 22, 10, tzinfo=UTC)),
    # The bounds: 1970 is in, 3000 is out, measured as instants (the offset counts).
    ("1970-01-01T00:00:00Z", EARLIEST_TIME),
    ("1970-01-01T00:00:00-01:00", datetime(1970, 1, 1, 1, tzinfo=UTC)),
    ("2999-12-31T23:59:59.999999Z", LATEST_TIME - timedelta(microseconds=1)),
    ("3000-01-01T00:30:00+01:00", datetime(2999, 12, 31, 23, 30, tzinfo=UTC)),
])
def test_a_time_with_a_timezone_is_accepted(text, at):
    assert parse_time(text, "start") == at


@pytest.mark.parametrize(("text", "reason"), [
    ("0001-01-01T00:00:00Z", OUT_OF_RANGE),
    ("1969-12-31T23:59:59.999Z", OUT_OF_RANGE),
    ("1970-01-01T00:30:00+01:00", OUT_OF_RANGE),
    ("3000-01-01T00:00:00Z", OUT_OF_RANGE),
    ("2999-12-31T23:30:00-01:00", OUT_OF_RANGE),
    ("9999-12-31T23:59:59-05:00", OUT_OF_RANGE),
    ("2026-11-22T10:00:00", NO_TIMEZONE),
    ("2026-11-22", NO_TIMEZONE),
    ("2026-13-01T00:00:00Z", NOT_ISO),
    ("yesterday", NOT_ISO),
    ("", NOT_ISO),
    ("6 hours", NOT_ISO),
])
def test_a_time_is_refused_naming_the_field_and_the_text(text, reason):
    assert refusal(parse_time, text, "to_datetime") == f"to_datetime {text!r} {reason}"


def test_a_time_that_is_not_text_is_refused_in_words():
    assert refusal(parse_time, None, "end") == f"end None {NOT_ISO}"
    assert refusal(parse_time, 1700000000, "end") == f"end 1700000000 {NOT_ISO}"


# --- time_back ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "back"), [
    ("6 hours", timedelta(hours=6)),
    ("1 millisecond", timedelta(milliseconds=1)),
    ("30 minutes", timedelta(minutes=30)),
    ("1 day", timedelta(days=1)),
    ("3650 days", timedelta(days=3650)),
    ("87600 hours", timedelta(days=3650)),
    ("315360000000 milliseconds", timedelta(days=3650)),
])
def test_a_duration_back_from_now(text, back):
    assert time_back(text, "duration", NOW_AT) == NOW_AT - back


@pytest.mark.parametrize("text", ["3651 days", "87601 hours", "315360000001 milliseconds", "99999999999999999 days"])
def test_more_than_3650_days_back_is_refused(text):
    assert refusal(time_back, text, "duration", NOW_AT) == f"duration {text!r} {TOO_FAR_BACK}"


def test_a_duration_back_stops_at_1970():
    exactly = EARLIEST_TIME + MAX_LOOKBACK  # 1979-12-30
    assert time_back("3650 days", "start", exactly) == EARLIEST_TIME
    just_before = exactly - timedelta(milliseconds=1)
    assert refusal(time_back, "3650 days", "start", just_before) == f"start '3650 days' {BEFORE_1970}"


@pytest.mark.parametrize("text", ["", "0 hours", "06 hours", "6 weeks", "6 hours ago", " 6 hours", "6 hours\n",
                                  "2026-11-22T10:00:00Z", "earliest", None, 6])
def test_a_malformed_duration_is_refused(text):
    assert refusal(time_back, text, "duration", NOW_AT) == f"duration {text!r} {NOT_DURATION}"


# --- parse_moment ------------------------------------------------------------------------------------


def test_each_form_is_read():
    assert parse_moment("earliest", "start", NOW_AT) == Moment(EARLIEST)
    assert parse_moment("now", "end", NOW_AT) == Moment(NOW)
    assert parse_moment("6 hours", "start", NOW_AT) == Moment(BACK, NOW_AT - timedelta(hours=6))
    assert parse_moment("2026-11-22T10:00:00Z", "start", NOW_AT) == Moment(TIME, datetime(2026, 11, 22, 10, tzinfo=UTC))
    assert parse_moment("earliest", "start").at is None and parse_moment("now", "end").at is None
    assert MOMENT_FORMS == {EARLIEST, NOW, TIME, BACK}


def test_a_start_as_reprocess_reads_it():
    """earliest | time | duration back; a refused time names the other forms, a refused duration does not."""
    def start(text):
        return parse_moment(text, "start", NOW_AT, allowed={EARLIEST, TIME, BACK},
                            hint="; or use 'earliest' or a duration such as '6 hours'")

    assert start("earliest") == Moment(EARLIEST)
    assert start("6 hours").at == datetime(2026, 11, 22, 21, tzinfo=UTC)
    assert start("2026-11-22T10:00:00+01:00").at == datetime(2026, 11, 22, 9, tzinfo=UTC)
    assert refusal(start, "2026-11-22T10:00:00") == (
        "start '2026-11-22T10:00:00' has no timezone: add Z or an offset such as +01:00; "
        "or use 'earliest' or a duration such as '6 hours'")
    assert refusal(start, "0001-01-01T00:00:00Z") == (
        f"start '0001-01-01T00:00:00Z' {OUT_OF_RANGE}; or use 'earliest' or a duration such as '6 hours'")
    assert refusal(start, "9999999999 days") == f"start '9999999999 days' {TOO_FAR_BACK}"
    assert refusal(start, "now") == f"start 'now' {NOT_ISO}; or use 'earliest' or a duration such as '6 hours'"
    # A duration with a final line break is read as a (malformed) duration, not as a time.
    assert refusal(start, "6 hours\n") == f"start '6 hours\\n' {NOT_DURATION}"


def test_an_end_as_reprocess_reads_it():
    def end(text):
        return parse_moment(text, "end", NOW_AT, allowed={NOW, TIME}, hint="; or use 'now'")

    assert end("now") == Moment(NOW)
    assert end("2026-11-22T10:00:00Z").at == datetime(2026, 11, 22, 10, tzinfo=UTC)
    assert refusal(end, "6 hours") == f"end '6 hours' {NOT_ISO}; or use 'now'"
    assert refusal(end, "earliest") == f"end 'earliest' {NOT_ISO}; or use 'now'"
    assert refusal(end, "9999-12-31T23:59:59-05:00") == f"end '9999-12-31T23:59:59-05:00' {OUT_OF_RANGE}; or use 'now'"


def test_without_a_hint_the_refusal_is_the_time_s_own():
    """As replay reads its range: either end may also be a duration back."""
    allowed = {NOW, TIME, BACK}
    assert parse_moment("1 hour", "end", NOW_AT, allowed=allowed).at == NOW_AT - timedelta(hours=1)
    assert refusal(parse_moment, "0001-01-01T00:00:00+01:00", "end", NOW_AT, allowed=allowed) == (
        f"end '0001-01-01T00:00:00+01:00' {OUT_OF_RANGE}")
    assert refusal(parse_moment, "99999999999 hours", "start", NOW_AT, allowed=allowed) == (
        f"start '99999999999 hours' {TOO_FAR_BACK}")


def test_one_form_reads_every_text_as_that_form():
    """As reset's modes read them: mode datetime takes a time, mode duration a duration back."""
    assert refusal(parse_moment, "2 hours", "to_datetime", allowed={TIME}) == f"to_datetime '2 hours' {NOT_ISO}"
    assert refusal(parse_moment, "", "to_datetime", allowed={TIME}) == f"to_datetime '' {NOT_ISO}"
    assert refusal(parse_moment, "now", "to_datetime", allowed={TIME}) == f"to_datetime 'now' {NOT_ISO}"
    assert refusal(parse_moment, "2026-11-22T03:00:00Z", "duration", NOW_AT, allowed={BACK}) == (
        f"duration '2026-11-22T03:00:00Z' {NOT_DURATION}")
    assert refusal(parse_moment, "", "duration", NOW_AT, allowed={BACK}) == f"duration '' {NOT_DURATION}"
    assert refusal(parse_moment, "3651 days", "duration", NOW_AT, allowed={BACK}) == f"duration '3651 days' {TOO_FAR_BACK}"
    assert parse_moment("3650 days", "duration", NOW_AT, allowed={BACK}).at == datetime(2016, 11, 25, 3, tzinfo=UTC)


def test_words_are_exact():
    for text in ("Earliest", "earliest ", "NOW", "latest"):
        assert refusal(parse_moment, text, "start", NOW_AT) == f"start {text!r} {NOT_ISO}"


def test_a_moment_that_is_not_text_is_refused_in_words():
    assert refusal(parse_moment, None, "start", NOW_AT) == f"start None {NOT_ISO}"
    assert refusal(parse_moment, 6, "start", NOW_AT, hint="; or use 'now'") == f"start 6 {NOT_ISO}; or use 'now'"
    assert refusal(parse_moment, ["6 hours"], "start", NOW_AT) == f"start ['6 hours'] {NOT_ISO}"


def test_a_caller_s_mistake_is_not_an_operator_s_refusal():
    with pytest.raises(TypeError):
        parse_moment("6 hours", "start", allowed={EARLIEST, BACK})  # no `now` to count back from
    with pytest.raises(TypeError):
        parse_moment("earliest", "start", NOW_AT, allowed={EARLIEST})  # neither a time nor a duration
    with pytest.raises(TypeError):
        parse_moment("latest", "start", NOW_AT, allowed={"latest", TIME})


# --- the forms' patterns -----------------------------------------------------------------------------


def test_the_forms_patterns_for_a_range_are_unchanged():
    assert moment_pattern({EARLIEST, BACK, TIME}) == (
        "^(earliest|[1-9][0-9]{0,11} (millisecond|second|minute|hour|day)s?|"
        "(19[7-9][0-9]|2[0-9]{3})-[0-9]{2}-[0-9]{2}([T ][0-9:.]+)?(Z|[+-][0-9]{2}:?[0-9]{2})?)$")
    assert moment_pattern({NOW, TIME}) == (
        "^(now|(19[7-9][0-9]|2[0-9]{3})-[0-9]{2}-[0-9]{2}([T ][0-9:.]+)?(Z|[+-][0-9]{2}:?[0-9]{2})?)$")
    assert moment_pattern({TIME}) == TIME_PATTERN and moment_pattern({BACK}) == DURATION_FORM_PATTERN
    with pytest.raises(TypeError):
        moment_pattern({"latest"})


@pytest.mark.parametrize(("text", "start", "end"), [
    ("earliest", True, False), ("now", False, True), ("6 hours", True, False), ("999999999999 days", True, False),
    ("1000000000000 days", False, False), ("2026-11-22T03:00:00Z", True, True), ("2026-11-22T04:00:00.5+01:00", True, True),
    ("0001-01-01T00:00:00Z", False, False), ("9999-12-31T00:00:00Z", False, False), ("latest", False, False),
])
def test_the_forms_patterns_take_the_forms_each_field_takes(text, start, end):
    assert bool(re.search(moment_pattern({EARLIEST, BACK, TIME}), text)) == start
    assert bool(re.search(moment_pattern({NOW, TIME}), text)) == end
