"""The skip DAG's refusals and the skip list on a bounded run, on real components. (A poison record
in the middle of a partition skipped exactly, with zero loss, after the supervisor's restarts and
the crash-loop guard: tests/test_supervision.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from streamops.app_runtime import AppRuntime
from streamops.audit import read_audit
from streamops.checkpoints import list_backups
from streamops.kafka_offsets import end_offsets
from streamops.kafka_records import produce, read_all
from streamops.runtime_records import SkipEntry
from tests.support.apps import run_available_now
from tests.support.operations import checkpoint_state
from tests.support.oplog_events import event, produce_to_partitions
from tests.support.routes import expected_routes, routed


def test_skip_refusals_name_the_problem_and_change_nothing(spark, run_dag, app_env, app_catalog, broker, admin):
    from airflow.sdk.definitions.param import ParamValidationError

    from streamops.recovery.common import RecoveryRefused
    from streamops.recovery.skip import plan_skip

    catalog_file, runtime = app_env
    spec = app_catalog.app("oplog-router")
    source = spec.inputs["operations"]
    kafka = broker.client_config
    produce_to_partitions(kafka, source, range(1, 41))
    checkpoint = spec.checkpoint_location()
    run_available_now(spark, app_catalog, "oplog-router", broker, checkpoint)
    runtime.acquire({"app": "oplog-router", "version": "1.0.0"})  # a driver that ran and stopped
    runtime.release("stopped", "test")
    produce(kafka, source, [event(s) for s in range(100, 105)], partition=1)
    ends = {p: hi for p, (_, hi) in end_offsets(kafka, source).items()}
    files = checkpoint_state(Path(checkpoint))

    def problems(*records: str, note: str | None = None) -> list[str]:
        with pytest.raises(RecoveryRefused) as refused:
            plan_skip(admin, kafka, app_catalog, "oplog-router", list(records), note, user="test", run_id="r1")
        return refused.value.problems

    assert problems(f"{source}:0:0") == [
        f"record '{source}:0:0' was already processed (query route is at offset {ends[0]} of {source} partition 0): "
        "skipping it now changes nothing; to process records again use recover_reset_offsets"]
    assert problems(f"{source}:1:{ends[1]}") == [
        f"record '{source}:1:{ends[1]}': offset {ends[1]} is past the end of {source} partition 1 (it holds offsets "
        f"0-{ends[1] - 1})"]
    assert problems(f"{source}:9:0") == [
        f"record '{source}:9:0': partition 9 of '{source}' does not exist (it has partitions 0-5)"]
    assert problems("no.such.topic:0:1", f"{spec.outputs['contacts']}:0:1") == [
        f"record 'no.such.topic:0:1': topic 'no.such.topic' is not an input of oplog-router (inputs: {source})",
        f"record '{spec.outputs['contacts']}:0:1': topic '{spec.outputs['contacts']}' is not an input of oplog-router "
        f"(inputs: {source})"]
    assert problems(f"{source}:one:1", f"{source}:1:{2**70}", f"{source}:1:9-3", note="two\nlines") == [
        f"record '{source}:one:1' is not 'topic:partition:offset' or 'topic:partition:first-last' "
        "(e.g. 'oplog.operations:3:1200' or 'oplog.operations:3:1200-1210')",
        f"record '{source}:1:{2**70}': offset {2**70} is out of range (Kafka offsets are at most {2**63 - 1})",
        f"record '{source}:1:9-3': the range ends before it starts (9-3)",
        "note contains a line break, control or formatting character: keep it to one line of plain text"]
    assert problems(f"{source}:1:0-20000") == [
        "records name 20001 offsets; a skip takes at most 10000: to move past more, use recover_reset_offsets"]

    # Through the DAG: a running app, audited; the form refuses malformed items and 2**70 before any task.
    holder = AppRuntime(checkpoint)
    holder.acquire({"app": "oplog-router", "version": "9.9.9"})
    try:
        refused = run_dag("recover_skip_records", catalog_file, app="oplog-router", records=[f"{source}:1:{ends[1] - 1}"],
                          dry_run=False)
    finally:
        holder.release("stopped", "test")
    assert refused.task_states == {
        "plan": "failed", "approve": "upstream_failed", "apply": "upstream_failed", "verify": "upstream_failed"}
    (entry,) = read_audit(run_id=refused.run_id)
    assert (entry["step"], entry["outcome"]) == ("plan", "refused")
    assert "oplog-router is running (driver pid" in entry["error"] and "stop it with the stop_apps DAG first" in entry["error"]
    for bad in ([f"{source}:1:{2**70}"], [f"{source}:1:5; rm -rf /"], [f"../{source}:1:5"], [], ["x" * 400]):
        with pytest.raises(ParamValidationError):
            run_dag("recover_skip_records", catalog_file, dry_run=True, app="oplog-router", records=bad)
    with pytest.raises(ParamValidationError):
        run_dag("recover_skip_records", catalog_file, dry_run=True, app="oplog-router", records=[f"{source}:1:1"], note="n" * 501)

    # A valid dry run: the record, the batch it will be in; nothing changes.
    plan = plan_skip(admin, kafka, app_catalog, "oplog-router", [f"{source}:1:{ends[1] - 4}-{ends[1] - 2}"], None,
                     user="test", run_id="r2")
    assert [(r["offset"], r["batch"]) for r in plan.shown] == [
        (o, f"route: a later batch (at {ends[1] - 5})") for o in range(ends[1] - 4, ends[1] - 1)]
    assert plan.reason == "skipped by operator test (run r2)" and plan.records == 3
    assert checkpoint_state(Path(checkpoint)) == files and list_backups(checkpoint) == []
    assert runtime.skip_records() == []

    # The skip list on a run: exactly the three records are dead letters, every other one routed.
    runtime.add_skip_records([SkipEntry.model_validate({k: v for k, v in e.items() if k != "offsets"}) for e in plan.entries])
    run_available_now(spark, app_catalog, "oplog-router", broker, checkpoint)
    letters = [json.loads(r.value) for r in read_all(kafka, spec.dead_letter_topic)]
    assert [(v["reason"], v["source"]["partition"], v["source"]["offset"]) for v in letters] == [
        ("skipped by operator test (run r2)", 1, o) for o in range(ends[1] - 4, ends[1] - 1)]
    skipped = {f"{source}/1/{o}" for o in range(ends[1] - 4, ends[1] - 1)}
    assert set(routed(broker.client_config, spec)) == {
        pair for pair in expected_routes(broker.client_config, spec) if pair[0] not in skipped}
