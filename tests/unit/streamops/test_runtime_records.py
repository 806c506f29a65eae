"""Every runtime file that crosses a process boundary has one typed record, used by the writer and
every reader (streamops.runtime_records): each round-trips through its file, a newer writer's extra
key is ignored, and a value of the wrong type is refused naming the file and the field."""

from __future__ import annotations

import json
import os
import socket

import pytest

from streamops import records
from streamops.app_runtime import AppRuntime
from streamops.catalog import load_catalog
from streamops.checkpoints import BACKUP_INFO, CLUSTER_FILE, backup_checkpoint, backup_info, bind_cluster, checkpoint_cluster
from streamops.driver_lease import DriverLease
from streamops.runtime_records import (
    DeadLetterEnvelope,
    DeadLetterSource,
    DesiredState,
    DriverRecord,
    FailedRoll,
    OperationRecord,
    QueryProgress,
    RateLine,
    ReplayLedgerEntry,
    RestartEntry,
    RunEvent,
    RuntimeRecordError,
    SkipEntry,
    SkipList,
    StopRequest,
    checked,
)
from streamops.standby import ABORT, GO, StandbySlot
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
    FailedRoll(declared_digest="sha256:ab", run_id="reconcile_1", at="2026-11-27T03:00:00.000Z", error="health gate failed"),
    ReplayLedgerEntry(source="ops/3/1207", dead_letter="ops.dead-letters/0/9", to="ops/3/2000", run_id="manual__replay",
                      at="2026-11-27T03:00:00.000Z"),
    OperationRecord(run_id="manual__reset", what="recover_reset_offsets apply", started_at="2026-11-27T03:00:00.000Z",
                    host="worker-a", pid=42, pid_created=1.5, failed_at="2026-11-27T03:01:00.000Z",
                    error="LaunchError: the driver exited", state_after="failed", backups=["/backups/x"]),
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


# --- the operation marker, restarts and the run history ----------------------------------------------

def test_the_operation_marker_is_written_and_read_as_one_record(tmp_path):
    runtime = AppRuntime(tmp_path)
    assert runtime.operation() is None
    assert runtime.begin_operation("manual__reset", "recover_reset_offsets apply") is None
    begun = runtime.operation()
    assert (begun.run_id, begun.what, begun.host, begun.failed) == ("manual__reset", "recover_reset_offsets apply",
                                                                     socket.gethostname(), False)
    runtime.fail_operation("manual__reset", "LaunchError: the driver exited", state_after="failed", backups=["/b/1"])
    failed = OperationRecord.from_file_value(json.loads(runtime.operation_file.read_text()), "operation.json")
    assert failed == runtime.operation() == begun.model_copy(update={
        "failed_at": failed.failed_at, "error": "LaunchError: the driver exited", "state_after": "failed", "backups": ["/b/1"]})
    assert failed.failed_at and failed.failed


def test_an_operation_marker_of_an_older_writer_is_read(tmp_path):
    runtime = AppRuntime(tmp_path)
    runtime.dir.mkdir(parents=True)
    runtime.operation_file.write_text(json.dumps({"run_id": "manual__7", "what": "stop_apps stop", "failed_at": "x",
                                                  "error": "boom", "retries": 3}))
    assert runtime.operation() == OperationRecord(run_id="manual__7", what="stop_apps stop", failed_at="x", error="boom")


def test_an_operation_marker_that_is_not_one_holds_the_app_naming_the_file_and_field(tmp_path):
    runtime = AppRuntime(tmp_path)
    runtime.dir.mkdir(parents=True)
    runtime.operation_file.write_text(json.dumps({"run_id": "manual__7", "what": "stop_apps stop", "pid": "forty-two"}))
    held = runtime.operation()
    assert (held.run_id, held.what, held.failed_at) == ("manual__7", "stop_apps stop", "unknown")
    assert held.error.startswith(f"{runtime.operation_file}: not a OperationRecord (pid: Input should be a valid integer")
    runtime.operation_file.write_text('{"run_id": "manual__7", "wha')  # torn: no marker, as before
    assert runtime.operation() is None


def test_restarts_round_trip_and_a_bad_line_is_refused_naming_it(tmp_path):
    runtime = AppRuntime(tmp_path)
    started: RestartEntry = {"at": "2026-11-27T03:00:00.000Z", "run_id": "scheduled__1", "outcome": "started", "attempt": 1,
                             "backoff_s": 0.0, "not_before": None, "version": "1.0.0", "after": "crashed", "pid": 42,
                             "backup": None}
    gave_up: RestartEntry = {"at": "2026-11-27T03:10:00.000Z", "run_id": "scheduled__4", "outcome": "gave up", "restarts": 3,
                             "after": None}
    runtime.record_restart(started)
    runtime.record_restart(gave_up)
    assert runtime.restarts() == [started, gave_up]
    with pytest.raises(RuntimeRecordError, match=r"restarts.jsonl: not a RestartEntry \(outcome: Input should be 'started', "):
        runtime.record_restart({**gave_up, "outcome": "maybe"})  # type: ignore[typeddict-item]
    with open(runtime.restarts_file, "a") as restarts:
        restarts.write('{"at": "2026-11-27T03:1\n')
    with pytest.raises(RuntimeRecordError, match=rf"^{runtime.restarts_file}:3: not a RestartEntry \(not JSON: "):
        runtime.restarts()


def test_the_run_history_keeps_the_driver_record_and_reads_back_typed(tmp_path):
    runtime = AppRuntime(tmp_path)
    runtime.acquire({"app": "demo", "version": "1.0.0", "launched_by": "manual__1"})
    runtime.update(failed_batches=[{"query": "route", "batch": 3, "ranges": []}])
    runtime.release("failed", "query route failed")
    started, stopped = runtime.history()
    assert (started["event"], started["launched_by"], started["version"]) == ("started", "manual__1", "1.0.0")
    assert (stopped["event"], stopped["outcome"], stopped["reason"]) == ("stopped", "failed", "query route failed")
    assert stopped["failed_batches"] == [{"query": "route", "batch": 3, "ranges": []}]
    assert stopped == {"event": "stopped", **json.loads(runtime.driver_file.read_text())}  # every key of driver.json kept
    with pytest.raises(RuntimeRecordError, match=r"runs.jsonl: not a RunEvent \(event: Input should be 'started', 'stopped' "):
        checked(RunEvent, {"event": "paused"}, str(runtime.history_file))


def test_a_driver_record_that_is_not_a_run_event_never_keeps_the_driver_from_ending(tmp_path, caplog):
    runtime = AppRuntime(tmp_path)
    runtime.acquire({"app": "demo"})
    runtime.update(failed_batches="route")  # a value of the wrong shape (the record keeps values as given)
    runtime.release("failed", "query route failed")
    assert not runtime.is_running() and runtime.state() == "failed"
    assert [event["event"] for event in runtime.history()] == ["started"]
    assert "runs.jsonl: not a RunEvent (failed_batches: Input should be a valid list" in caplog.text


# --- the standby handshake (streamops.standby) ----------------------------------------------------------

def test_the_standby_files_round_trip_and_keep_their_json_shape(tmp_path):
    slot = StandbySlot(tmp_path, "standby-abc123")
    verdict = {"checked": ["count"], "problems": ["query 'count': Spark refuses ..."]}
    slot.report_ready(verdict, "app-1", pid=4242, host="host-b")
    assert slot.ready() == {"pid": 4242, "host": "host-b", "state_check": verdict, "application_id": "app-1"}
    assert json.loads(slot.ready_file.read_text()) == slot.ready()
    slot.say(GO, by="manual__roll")
    assert slot.await_word(1, interrupted=lambda: False) == {"word": GO, "by": "manual__roll"}
    slot.say(ABORT, why="the plan changed")
    assert slot.await_word(1, interrupted=lambda: False) == {"word": ABORT, "why": "the plan changed"}


def test_a_standby_file_that_is_not_its_record_is_named(tmp_path):
    slot = StandbySlot(tmp_path, "standby-abc123")
    slot.dir.mkdir(parents=True)
    slot.ready_file.write_text(json.dumps({"pid": "4242", "host": "host-b", "state_check": ["route"]}))
    with pytest.raises(
        RuntimeRecordError, match=r"standby-abc123.ready.json: not a StandbyReady \(state_check: Input should "
    ):
        slot.ready()
    slot.word_file.write_text(json.dumps({"word": "later"}))
    heard = slot.await_word(1, interrupted=lambda: False)  # a word it does not understand: it never starts
    assert heard["word"] == ABORT and heard["why"].startswith(
        f"{slot.word_file}: not a StandbyWord (word: Input should be 'go' or"
    )


# --- beside the checkpoint: a snapshot's description, the cluster binding ----------------------------

def test_a_snapshot_describes_itself_in_a_backup_info(tmp_path):
    checkpoint = tmp_path / "cp"
    runtime = AppRuntime(checkpoint)
    runtime.acquire({"app": "demo", "version": "1.2.0", "launch": {"version": "1.2.0", "launch_id": "l-1"},
                     "code": {"artifact": "demo", "digest": "sha256:ab"}})
    runtime.release("stopped", "test")
    snapshot = backup_checkpoint(checkpoint, "before-test")
    info = backup_info(snapshot)
    assert info == json.loads((snapshot / BACKUP_INFO).read_text())
    assert {k: v for k, v in info.items() if k != "taken_at"} == {
        "label": "before-test", "version": "1.2.0", "launch": {"version": "1.2.0", "launch_id": "l-1"},
        "code": {"artifact": "demo", "digest": "sha256:ab"}}


def test_a_backup_info_that_is_not_one_is_read_by_the_snapshots_name_with_a_warning(tmp_path, caplog):
    snapshot = tmp_path / "_backups" / "cp" / "20261127T030000.000000Z-before-reset"
    snapshot.mkdir(parents=True)
    (snapshot / BACKUP_INFO).write_text(json.dumps({"label": "before-reset", "launch": "1.0.0"}))
    assert backup_info(snapshot) == {"label": "before-reset"}
    assert f"{snapshot / BACKUP_INFO}: not a BackupInfo (launch: Input should be a valid dictionary" in caplog.text


def test_the_cluster_binding_round_trips_and_one_that_is_not_one_counts_as_unbound(tmp_path):
    checkpoint = tmp_path / "cp"
    bind_cluster("demo", checkpoint, "cluster-A", "127.0.0.1:9092")
    bound = checkpoint_cluster(checkpoint)
    assert bound == json.loads((checkpoint / CLUSTER_FILE).read_text())
    assert (bound["cluster_id"], bound["bootstrap"], set(bound)) == (
        "cluster-A", "127.0.0.1:9092", {"cluster_id", "bootstrap", "at"}
    )
    (checkpoint / CLUSTER_FILE).write_text(json.dumps({"cluster_id": 7, "bootstrap": "127.0.0.1:9092"}))
    assert checkpoint_cluster(checkpoint) is None  # as before: the next launch binds it again


# --- the dead-letter envelope: the driver's struct is built from the model replay reads with -----------

# A dead letter as the driver writes it (Spark's to_json leaves out the null fields: a value kept by
# reference has no base64), and as the bench writes it.
SPARK_ENVELOPE = {
    "app": "oplog-router", "app_version": "1.0.0", "reason": "value is not JSON", "failed_at": "2026-11-27T03:00:00.000Z",
    "source": {"topic": "ops", "partition": 3, "offset": 1207, "timestamp": "2026-11-27T02:59:59.000Z"},
    "original_key_base64": "dTM=", "original_key_stored": "inline", "original_value_stored": "reference",
    "original_key_bytes": 2, "original_value_bytes": 2000000, "original_key_sha256": "a" * 64,
    "original_value_sha256": "b" * 64, "original_value_preview": "not json",
}
BENCH_ENVELOPE = {"app": "oplog-router", "reason": "invalid", "source": {"topic": "ops", "partition": 0, "offset": 5}}


@pytest.mark.parametrize("written", [SPARK_ENVELOPE, BENCH_ENVELOPE], ids=["driver", "bench"])
def test_every_writers_dead_letter_is_an_envelope_and_round_trips(written):
    envelope = DeadLetterEnvelope.model_validate_json(json.dumps(written))
    assert envelope.model_dump(mode="json", exclude_none=True) == written
    assert DeadLetterEnvelope.from_file_value({**written, "from_a_newer_writer": 1}, "dead letter") == envelope


@pytest.mark.parametrize("bad", [
    {**SPARK_ENVELOPE, "source": None},
    {**SPARK_ENVELOPE, "source": {"topic": "ops", "partition": "three", "offset": 1}},
    {k: v for k, v in SPARK_ENVELOPE.items() if k != "reason"},
    {**SPARK_ENVELOPE, "original_value_stored": "elsewhere"},
])
def test_a_dead_letter_that_is_not_an_envelope_is_refused(bad):
    with pytest.raises(RuntimeRecordError, match=r"^ops.dead-letters/0/9: not a DeadLetterEnvelope \("):
        DeadLetterEnvelope.from_file_value(bad, "ops.dead-letters/0/9")


class _Column:
    """A stand-in for a Spark column: every operation gives another; `alias` names it; a
    struct remembers the names of its fields."""

    def __init__(self, name: str | None = None, fields: list[str | None] | None = None):
        self.name, self.fields = name, fields

    def alias(self, name):
        return _Column(name, self.fields)

    def __getattr__(self, attr):
        return lambda *args, **kwargs: _Column()

    def _any(self, *args):
        return _Column()

    __or__ = __and__ = __invert__ = __add__ = __radd__ = __sub__ = __mul__ = __truediv__ = __floordiv__ = _any
    __le__ = __lt__ = __ge__ = __gt__ = __eq__ = __ne__ = _any


class _Functions:
    """pyspark.sql.functions as far as the dead-letter writer uses it, recording each struct."""

    def __init__(self):
        self.structs: list[list[str | None]] = []

    def struct(self, *columns):
        self.structs.append([c.name for c in columns])
        return _Column(fields=self.structs[-1])

    def __getattr__(self, name):
        return lambda *args, **kwargs: _Column()


def test_the_dead_letter_writer_builds_the_envelope_from_the_models_fields(monkeypatch):
    functions = _Functions()
    monkeypatch.setattr(records, "F", functions)
    records.dead_letter_record(load_catalog(check_programs=False).app("oplog-router"), "1.0.0")
    source, envelope, sink = functions.structs
    assert source == list(DeadLetterSource.model_fields) == ["topic", "partition", "offset", "timestamp"]
    assert envelope == DeadLetterEnvelope.field_names() and envelope[:5] == [
        "app", "app_version", "reason", "failed_at", "source"
    ]
    assert sink == ["key", "value", "topic"]


def test_a_struct_that_does_not_match_its_model_is_refused_before_spark_sees_it():
    with pytest.raises(ValueError, match=r"^the DeadLetterSource struct does not match its model: no column for: offset, "
                                         r"timestamp; not in the model: position$"):
        records.struct_of(DeadLetterSource, {"topic": _Column(), "partition": _Column(), "position": _Column()})


def test_a_dead_letter_is_read_as_an_envelope_and_anything_else_as_not_one():
    from streamops.dead_letters import decode_dead_letter
    from streamops.kafka_records import Record

    values = [json.dumps(SPARK_ENVELOPE).encode(), json.dumps(BENCH_ENVELOPE).encode(), None, b"not json",
              json.dumps({**BENCH_ENVELOPE, "source": {"topic": "ops"}}).encode(),
              json.dumps({**BENCH_ENVELOPE, "original_key_base64": "abc"}).encode()]
    spark, bench, *others = [decode_dead_letter(Record("dlq", 0, offset, None, value, 0)) for offset, value in enumerate(values)]
    assert (spark.at, spark.reason, spark.source, spark.source_topic, spark.source_partition, spark.source_offset) == (
        "dlq/0/0", "value is not JSON", "ops/3/1207", "ops", 3, 1207)
    assert (spark.key, spark.value, spark.by_reference, spark.verdict) == (b"u3", None, {"value": "b" * 64}, "")
    assert (bench.source, bench.key, bench.value, bench.by_reference) == ("ops/0/5", None, None, {})
    assert [(o.at, o.reason, o.source, o.verdict) for o in others] == [
        (f"dlq/0/{n}", "(not a dead-letter envelope)", None, "not an envelope") for n in range(2, 6)]


def test_the_replay_ledger_is_read_as_its_entries_and_a_bad_line_is_named(monkeypatch, tmp_path):
    from streamops.recovery import replay

    ledger = tmp_path / "replay-ledger.jsonl"
    monkeypatch.setattr(replay, "ledger_file", lambda app: ledger)
    entry = ReplayLedgerEntry(source="ops/3/1207", dead_letter="dlq/0/9", to="ops/3/2000", run_id="r", at="t")
    ledger.write_text(json.dumps(entry.to_json()) + "\n" + json.dumps({"source": "ops/3/1208"}) + "\n")  # an older line
    assert replay.replayed_sources(None) == {"ops/3/1207", "ops/3/1208"}
    ledger.write_text(ledger.read_text() + '{"dead_letter": "dlq/0/10"}\n')
    with pytest.raises(RuntimeRecordError, match=rf"^{ledger}:3: not a ReplayLedgerEntry \(source: Field required\)$"):
        replay.replayed_sources(None)


# --- the lease's files (streamops.driver_lease) -------------------------------------------------------

def test_the_lease_files_are_written_and_read_as_their_records(tmp_path):
    lease = DriverLease(tmp_path)
    epoch = lease.take({"app": "demo"}, ttl_s=30)
    try:
        holder = lease.live_holder()
        assert holder.record == json.loads((lease.dir / f"epoch-{epoch:010d}.json").read_text())
        assert (holder.epoch, holder.record["app"], holder.pid, holder.record["ttl_s"]) == (1, "demo", os.getpid(), 30.0)
        assert set(holder.record) == {"epoch", "app", "host", "address", "pid", "pid_created", "pid_start", "ttl_s", "taken_at_s",
                                      "taken_at"}
    finally:
        lease.end("stopped")
    ended = lease.holder(epoch).ended
    assert (ended["outcome"], ended["pid"]) == ("stopped", os.getpid())


def test_a_lease_file_of_an_older_driver_is_read_and_one_of_the_wrong_shape_is_refused(tmp_path):
    lease = DriverLease(tmp_path)
    lease.dir.mkdir(parents=True)
    (lease.dir / "epoch-0000000001.json").write_text(json.dumps({"host": "worker-b", "pid": 7, "taken_at_s": 5.0}))
    (lease.dir / "beat-0000000001.json").write_text(json.dumps({"at_s": 9.0}))
    holder = lease.holder()
    assert (holder.host, holder.pid, holder.last_beat_s, holder.ended) == ("worker-b", 7, 9.0, None)
    (lease.dir / "beat-0000000001.json").write_text(json.dumps({"at_s": "soon"}))
    with pytest.raises(RuntimeRecordError, match=r"beat-0000000001.json: not a LeaseBeat \(at_s: Input should be a valid number"):
        lease.holder()


def test_a_failed_roll_file_round_trips_and_one_that_is_not_one_counts_as_none(tmp_path, caplog):
    from types import SimpleNamespace

    from streamops.desired_state import FAILED_ROLL_FILE, failed_roll, record_roll_outcome

    runtime = AppRuntime(tmp_path)
    record_roll_outcome(runtime, SimpleNamespace(declared_digest="sha256:ab"), "reconcile_1", "health gate failed")
    failed = failed_roll(runtime)
    assert (failed.declared_digest, failed.run_id, failed.error) == ("sha256:ab", "reconcile_1", "health gate failed")
    assert failed == FailedRoll.from_file_value(json.loads((runtime.dir / FAILED_ROLL_FILE).read_text()), "f")
    (runtime.dir / FAILED_ROLL_FILE).write_text(json.dumps({"declared_digest": ["sha256:ab"]}))
    assert failed_roll(runtime) is None
    assert f"{runtime.dir / FAILED_ROLL_FILE}: not a FailedRoll (declared_digest: Input should be a valid string" in caplog.text
    record_roll_outcome(runtime, SimpleNamespace(declared_digest="sha256:ab"), "reconcile_2", None)
    assert failed_roll(runtime) is None and not (runtime.dir / FAILED_ROLL_FILE).exists()


def test_a_failed_batch_is_written_by_the_driver_and_read_back_from_driver_json_and_the_history(tmp_path):
    from types import SimpleNamespace

    from streamops.driver.stopping import record_failed_batches
    from tests.unit.streamops.test_checkpoints import commit_batch, new_query, plan_batch

    checkpoint = tmp_path / "cp"
    route = new_query(checkpoint, "route")
    plan_batch(route, 0, {"ops": {"0": 5, "1": 2}})
    commit_batch(route, 0)
    plan_batch(route, 1, {"ops": {"0": 9, "1": 2}})  # planned, never committed: the batch it failed on
    new_query(checkpoint, "count")  # failed before planning a batch
    runtime = AppRuntime(checkpoint)
    runtime.acquire({"app": "demo"})
    failed = [
        SimpleNamespace(name=f"demo.{name}", exception=lambda: "org.example.BoomException: boom") for name in ("route", "count")
    ]
    record_failed_batches(runtime, failed)
    runtime.release("failed", "query route failed")
    expected = [
        {"query": "route", "batch": 1, "ranges": [{"topic": "ops", "partition": 0, "first": 5, "last": 8}],
         "error": "org.example.BoomException: boom"},
        {"query": "count", "batch": None, "ranges": [], "error": "org.example.BoomException: boom"},
    ]
    assert runtime.driver().failed_batches == expected
    assert runtime.history()[-1]["failed_batches"] == expected
