"""Every runtime file that crosses a process boundary has one typed record, used by the writer and
every reader (streamops.runtime_records): each round-trips through its file, a newer writer's extra
key is ignored, and a value of the wrong type is refused naming the file and the field."""

from __future__ import annotations

import json

import pytest

from streamops.app_runtime import AppRuntime
from streamops.runtime_records import (
    DesiredState,
    DriverRecord,
    QueryProgress,
    RateLine,
    RuntimeRecordError,
    SkipEntry,
    SkipList,
    StopRequest,
)
from tests.unit.streamops.test_driver_record import CURRENT

PROGRESS = QueryProgress(
    query="oplog-router.route", batch_id=7, timestamp="2026-11-27T03:00:00.000Z", published_at="2026-11-27T03:00:01.000Z",
    input_rows=500, input_rows_per_second=250.0, processed_rows_per_second=900.5, batch_duration_ms=555, state_rows=3,
    dropped_by_watermark=1, state_rows_updated=2, stateful=True, watermark="2026-11-27T02:59:00.000Z",
    end_offsets={"ops": {"0": 250, "1": 250}}, observed={"route": {"records_in": 500, "dead_letters": 4}},
)
SKIP = SkipEntry(topic="ops", partition=1, first=3, last=5, reason="skipped by oncall", run_id="manual__x", user="oncall",
                 at="2026-11-27T03:00:00Z", note="poison")


@pytest.mark.parametrize("record", [
    PROGRESS,
    RateLine.of("route", PROGRESS, at="unused"),
    SkipList(entries=[SKIP, SKIP.model_copy(update={"partition": 2})]),
    StopRequest(requested_at="2026-11-27T03:00:00.000Z", by="manual__stop", deadline_s=30.0),
    DesiredState(state="stopped", run_id="manual__stop", by="oncall", at="2026-11-27T03:00:00.000Z", version="1.1.0"),
], ids=lambda record: type(record).__name__)
def test_each_record_round_trips_through_its_file(record):
    on_disk = json.loads(json.dumps(record.to_json()))
    assert type(record).from_file_value(on_disk, "f.json") == record
    assert type(record).from_file_value({**on_disk, "from_a_newer_writer": 1}, "f.json") == record


def test_the_driver_record_round_trips_and_its_writer_is_the_record():
    record = DriverRecord.from_json(CURRENT)
    assert record is not None and DriverRecord.from_json(record.to_json()) == record
    assert record.to_json() == CURRENT  # the driver writes exactly what readers read


def test_what_the_writer_wrote_is_what_every_reader_reads(tmp_path):
    runtime = AppRuntime(tmp_path)
    runtime.write_progress("route", PROGRESS)
    runtime.add_skip_records([SKIP])
    runtime.request_stop(by="manual__stop", deadline_s=12)
    runtime.set_desired("running", run_id="manual__deploy", by="oncall", version="1.1.0")
    assert runtime.progress() == {"route": PROGRESS}
    assert [(r.input_rows, r.dead_letters, r.watermark) for r in runtime.rates(within_s=10**9)] == [
        (500, 4, "2026-11-27T02:59:00.000Z")]
    assert runtime.skip_records() == [SKIP]
    assert (runtime.stop_request().by, runtime.stop_request().deadline_s) == ("manual__stop", 12.0)
    assert (runtime.desired().state, runtime.desired().version, runtime.desired().inferred) == ("running", "1.1.0", False)


def test_a_skip_list_of_the_wrong_shape_is_refused_naming_the_file_and_entry(tmp_path):
    runtime = AppRuntime(tmp_path)
    runtime.dir.mkdir(parents=True)
    runtime.skip_file.write_text(json.dumps({"entries": [{**SKIP.to_json(), "first": "three"}]}))
    with pytest.raises(RuntimeRecordError) as refused:
        runtime.skip_records()
    assert str(refused.value).startswith(f"{runtime.skip_file}: not a SkipList (entries.0.first: Input should be a valid integer")


def test_a_progress_file_of_the_wrong_shape_is_left_out_with_a_warning(tmp_path, caplog):
    runtime = AppRuntime(tmp_path)
    runtime.write_progress("route", PROGRESS)
    (runtime.progress_dir / "count.json").write_text(json.dumps({"query": "x.count", "batch_id": "seven"}))
    assert runtime.progress() == {"route": PROGRESS}
    assert f"{runtime.progress_dir / 'count.json'}: not a QueryProgress (batch_id: Input should be a valid integer" in caplog.text


def test_a_desired_state_that_is_neither_running_nor_stopped_is_refused(tmp_path):
    runtime = AppRuntime(tmp_path)
    runtime.dir.mkdir(parents=True)
    runtime.desired_file.write_text(json.dumps({"state": "paused"}))
    with pytest.raises(RuntimeRecordError,
                       match=r"desired.json: not a DesiredState \(state: Input should be 'running' or 'stopped'"):
        runtime.desired()


def test_the_driver_records_only_fields_it_has(tmp_path):
    runtime = AppRuntime(tmp_path)
    runtime.acquire({"app": "demo"})
    try:
        with pytest.raises(TypeError, match=r"driver.json has no field applicaton_id \(DriverRecord\)"):
            runtime.update(applicaton_id="local-1")
    finally:
        runtime.release("stopped", "test")
