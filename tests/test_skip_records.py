"""A poison record in the middle of a partition, on real components: the router fails on it, a
restart fails on the same batch again and the restart plan says so, recover_skip_records skips
exactly that record into the dead-letter topic, and every other record is routed (zero loss).
Plus the skip DAG's refusals and the skip list on a bounded run."""

from __future__ import annotations

import base64
import json
import random
from pathlib import Path

import pytest

from tests.support.apps import run_available_now
from streamops.app_runtime import AppRuntime
from streamops.app_status import app_status
from streamops.kafka_offsets import end_offsets
from streamops.kafka_records import produce, read_all
from streamops.audit import read_audit
from streamops.checkpoints import backup_info, list_backups
from streamops.waiting import DeadlineExceeded, poll_until
from tests.support.routes import expected_routes, routed, routed_except
from tests.support.operations import checkpoint_state, steps_of, stop_driver
from tests.support.oplog_events import NOT_CONTACTS, POISON_PARTITION, event, produce_to_partitions, with_small_output_topic

def test_a_poison_record_mid_partition_fails_every_restart_and_skipping_exactly_it_loses_nothing(
    run_dag, app_env, app_catalog, broker, admin
):
    catalog_file, runtime = app_env
    spec = app_catalog.app("oplog-router")
    source, contacts = spec.inputs["operations"], spec.outputs["contacts"]
    # The broker refuses any contacts record over 20000 bytes: a valid input whose routed output
    # is bigger fails the Kafka sink (RecordTooLargeException), and with it the query.
    with_small_output_topic(app_catalog, admin, catalog_file, contacts, 20000)
    kafka = broker.client_config

    produce_to_partitions(kafka, source, range(1, 41))
    deployed = run_dag("deploy_apps", catalog_file, apps=["oplog-router"])
    assert deployed.state == "success", deployed.task_states
    routed_except(broker.client_config, spec, set())

    # The poison: valid JSON, a known op type, 48 KB of incompressible text (lz4 cannot shrink
    # it under the limit), IN THE MIDDLE of partition 2, with valid records around it.
    noise = base64.b64encode(random.Random(7).randbytes(36000)).decode()
    before = [event(s, op_types=NOT_CONTACTS) for s in range(100, 106)]
    after = [event(s, op_types=NOT_CONTACTS) for s in range(107, 113)]
    poison_offset = end_offsets(kafka, source)[POISON_PARTITION][1] + len(before)
    poison = event(106, "BLOCK_CONTACT", note=noise)
    produce(kafka, source, [*before, poison, *after], partition=POISON_PARTITION)
    produce_to_partitions(kafka, source, range(200, 220), NOT_CONTACTS)
    poison_id = f"{source}/{POISON_PARTITION}/{poison_offset}"

    try:
        poll_until(lambda: runtime.state() == "failed", timeout=180, what="the router to fail on the poison record")
    except DeadlineExceeded:  # say what happened to the poison instead
        where = {t: [(r.partition, r.offset, len(r.value or b"")) for r in read_all(kafka, t) if len(r.value or b"") > 20000]
                 for t in [*spec.outputs.values(), spec.dead_letter_topic]}
        raise AssertionError(f"the poison record did not fail the router: records over 20000 bytes: {where}; "
                             f"progress {runtime.progress()}") from None
    (failed,) = runtime.driver().failed_batches
    assert failed["query"] == "route" and "RecordTooLargeException" in failed["error"], failed
    # The record says what went wrong in a line; Spark's whole plan stays in the driver log.
    assert runtime.driver().reason == f"query {spec.name}.route failed: {failed['error']}"
    assert failed["error"].startswith("org.apache.kafka.common.errors.RecordTooLargeException: ") and len(failed["error"]) <= 400
    assert "Logical Plan" in runtime.driver_log().read_text()
    assert any(r["topic"] == source and r["partition"] == POISON_PARTITION and r["first"] <= poison_offset <= r["last"]
               for r in failed["ranges"]), failed
    status = app_status(spec, kafka)
    assert status.state == "failed" and status.reason.startswith(f"query route failed on batch {failed['batch']} ("), status.reason

    first_plan = run_dag("recover_restart_app", catalog_file, dry_run=True, app="oplog-router").xcoms["plan"]
    assert first_plan["failed_batches"] == [failed] and first_plan["failed_again"] is False
    restarted = run_dag("recover_restart_app", catalog_file, app="oplog-router", dry_run=False)
    # It starts, runs the same batch and fails again (in apply when that happens before the
    # start-up wait ends, else in verify): either way the run fails, saying why.
    assert restarted.state == "failed", restarted.task_states
    poll_until(lambda: runtime.state() == "failed", timeout=120, what="the restarted router to fail again")
    (second,) = runtime.driver().failed_batches
    assert {k: second[k] for k in ("query", "batch", "ranges")} == {k: failed[k] for k in ("query", "batch", "ranges")}

    again = run_dag("recover_restart_app", catalog_file, dry_run=True, app="oplog-router")
    plan = again.xcoms["plan"]
    assert plan["failed_again"] is True
    from streamops.recovery.restart import RestartPlan

    said = RestartPlan(**{k: v for k, v in plan.items() if k != "summary"}).failure()
    print(f"\nrecover_restart_app's plan after the second failure:\n{said}")
    assert said.startswith(f"oplog-router failed on batch {failed['batch']} again (the same batch as the previous failure): "
                           "restarting will fail the same way.")
    assert f"{source} partition {POISON_PARTITION} offsets" in said and "RecordTooLargeException" in said
    assert f'recover_skip_records (records: ["{source}:' in said
    assert "AGAIN" in plan["summary"]
    assert plan["largest_records"][0] == {"record": f"{source}:{POISON_PARTITION}:{poison_offset}",
                                          "bytes": len(poison[0]) + len(poison[1])}

    record = f"{source}:{POISON_PARTITION}:{poison_offset}"
    dry = run_dag("recover_skip_records", catalog_file, dry_run=True, app="oplog-router", records=[record], note="OPS-7 too big for contacts")
    assert dry.task_states == {"plan": "success", "approve": "skipped", "apply": "skipped", "verify": "skipped"}
    (shown,) = dry.xcoms["plan"]["shown"]
    assert (shown["partition"], shown["offset"], shown["key"]) == (POISON_PARTITION, poison_offset, "u1")
    assert shown["size"] > 48000 and shown["preview"].startswith('{"seq": 106, "user_id": "u1", "op_type": "BLOCK_CONTACT"')
    assert shown["batch"] == f"route: batch {failed['batch']} (planned, not committed)"
    assert AppRuntime(spec.checkpoint_location()).skip_records() == [] and runtime.state() == "failed"

    result = run_dag("recover_skip_records", catalog_file, app="oplog-router", records=[record], note="OPS-7 too big for contacts",
                     dry_run=False)
    assert result.state == "success", result.task_states
    assert steps_of(result.run_id) == [("plan", "done"), ("apply", "done"), ("verify", "done")]
    assert backup_info(Path(result.xcoms["apply"]["backup"]))["label"] == "before-skip"
    reason = f"skipped by operator dag_test (run {result.run_id}): OPS-7 too big for contacts"
    assert result.xcoms["verify"]["dead_lettered"] == 1 and runtime.state() == "running"

    produce_to_partitions(kafka, source, range(300, 320))  # and the app runs on
    expected, got = routed_except(broker.client_config, spec, {poison_id})
    assert set(got) - expected == set(), "output records no input explains (the poison must not be routed)"
    duplicates = {pair: n - 1 for pair, n in got.items() if n > 1}
    letters = read_all(kafka, spec.dead_letter_topic)
    assert [(v["reason"], v["source"]["topic"], v["source"]["partition"], v["source"]["offset"])
            for v in (json.loads(r.value) for r in letters)] == [(reason, source, POISON_PARTITION, poison_offset)]
    assert letters[0].key == b"u1"
    print(f"skip of {record}: {len(expected)} routed records, none lost, exactly 1 dead letter (the skipped record), "
          f"{sum(duplicates.values())} duplicates (from the failed attempts of batch {failed['batch']}): {sorted(duplicates)}")
    stop_driver(runtime)


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
    assert problems(f"{source}:9:0") == [f"record '{source}:9:0': partition 9 of '{source}' does not exist (it has partitions 0-5)"]
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
    assert refused.task_states == {"plan": "failed", "approve": "upstream_failed", "apply": "upstream_failed", "verify": "upstream_failed"}
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
    runtime.add_skip_records([{k: v for k, v in e.items() if k != "offsets"} for e in plan.entries])
    run_available_now(spark, app_catalog, "oplog-router", broker, checkpoint)
    letters = [json.loads(r.value) for r in read_all(kafka, spec.dead_letter_topic)]
    assert [(v["reason"], v["source"]["partition"], v["source"]["offset"]) for v in letters] == [
        ("skipped by operator test (run r2)", 1, o) for o in range(ends[1] - 4, ends[1] - 1)]
    skipped = {f"{source}/1/{o}" for o in range(ends[1] - 4, ends[1] - 1)}
    assert set(routed(broker.client_config, spec)) == {pair for pair in expected_routes(broker.client_config, spec) if pair[0] not in skipped}
