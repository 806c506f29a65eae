"""Golden tests of the browser-activity app on a real broker and real Spark."""

from __future__ import annotations

import json

from streamops.driver.queries import observed_totals
from streamops.kafka_records import produce, read_all
from streamops.state_query import StateRequest, read_state
from tests.support.apps import run_available_now

CAPTCHA = "com.example.security.CaptchaVerifier"
ACTION = "com.example.web.CheckoutController"


def log_event(browser, time, logger=ACTION):
    return "thread-1", json.dumps(
        {"@timestamp": f"2026-01-01T14:{time}Z", "level": "INFO", "logger_name": logger, "thread_name": "http-1",
         "message": "checkout step", "browserHash": browser}
    )


FAR_FUTURE, FAR_PAST = "9999-12-31T23:59:59.999Z", "0001-01-01T00:00:00Z"


def timed_event(browser, timestamp):
    return "thread-1", json.dumps({"@timestamp": timestamp, "logger_name": ACTION, "browserHash": browser})


def window(browser, start, end, count):
    return {
        "fingerprint": browser,
        "window_start": f"2026-01-01T14:{start}.000Z",
        "window_end": f"2026-01-01T14:{end}.000Z",
        "count": count,
    }


def appended(broker, topic, since):
    """Records of `topic` that were not there when `since` was read."""
    seen = {(r.partition, r.offset) for r in since}
    return [r for r in read_all(broker.client_config, topic) if (r.partition, r.offset) not in seen]


def by_window(values):
    return sorted(values, key=lambda v: (v["fingerprint"], v["window_start"]))


def test_challenges_left_join_windows_watermark_and_dead_letters(spark, broker, app_catalog, tmp_path, monkeypatch):
    spec = app_catalog.app("browser-activity")
    logs = spec.inputs["logs"]
    checkpoint = tmp_path / "ckpt"
    produce(
        broker.client_config,
        logs,
        [
            # b1: five actions -> challenged with 5.
            log_event("b1", "11:52.000"),  # offset 0
            log_event("b1", "11:53.000"),
            log_event("b1", "11:54.000"),
            log_event("b1", "11:55.500"),
            log_event("b1", "11:58.000"),  # offset 4
            # b2: six actions but verified by the captcha: counts as 0, never challenged (a tombstone:
            # whatever challenge it had is retracted).
            *[log_event("b2", "12:00.000") for _ in range(6)],  # offsets 5-10
            log_event("b2", "12:00.000", CAPTCHA),  # offset 11
            # b3: four actions: under the threshold.
            *[log_event("b3", "11:52.500") for _ in range(4)],  # offsets 12-15
            ("thread-1", json.dumps({"@timestamp": "2026-01-01T14:11:59Z", "logger_name": ACTION})),  # 16
            # Outside the input contract's event-time bounds: dead letters. Let through, the first
            # would move the watermark to the year 9999 and the second run would count nothing.
            timed_event("b4", FAR_FUTURE),  # 17
            timed_event("b4", FAR_PAST),  # 18
            log_event("", "11:59.000"),  # 19: an empty fingerprint
        ],
        partition=0,
    )

    first = run_available_now(spark, app_catalog, "browser-activity", broker, checkpoint)

    challenges = read_all(broker.client_config, spec.outputs["challenges"])
    assert sorted(((r.key_text, r.json()) for r in challenges), key=lambda kv: kv[0]) == [
        ("b1", {"fingerprint": "b1", "actions": 5, "verified": False, "threshold": 5,
                "last_event_id": f"{logs}/0/4", "last_event_time": "2026-01-01T14:11:58.000Z"}),
        ("b2", None),
    ]
    counts_first = read_all(broker.client_config, spec.outputs["activity_counts"])
    assert by_window(r.json() for r in counts_first) == [
        # 5-second windows starting every 2 seconds: an event at :52 is in [:48,:53), [:50,:55), [:52,:57).
        window("b1", "11:48", "11:53", 1),
        window("b1", "11:50", "11:55", 3),
        window("b1", "11:52", "11:57", 4),
        window("b1", "11:54", "11:59", 3),
        window("b1", "11:56", "12:01", 1),
        window("b1", "11:58", "12:03", 1),
        window("b2", "11:56", "12:01", 6),  # the captcha event is not an action
        window("b2", "11:58", "12:03", 6),
        window("b2", "12:00", "12:05", 6),
        window("b3", "11:48", "11:53", 4),
        window("b3", "11:50", "11:55", 4),
        window("b3", "11:52", "11:57", 4),
    ]
    dead = [r.json() for r in read_all(broker.client_config, spec.dead_letter_topic)]
    kafka_time = {d["source"]["offset"]: d["source"]["timestamp"] for d in dead}
    assert [(d["source"]["offset"], d["reason"]) for d in dead] == [
        (16, "missing field 'browserHash' (input contract field-present)"),
        (17, f"field '@timestamp' '{FAR_FUTURE}' is more than 5 seconds after the record's Kafka timestamp {kafka_time[17]} "
             "(input contract event-time: max_future 5 seconds)"),
        (18, f"field '@timestamp' '{FAR_PAST}' is more than 3650 days before the record's Kafka timestamp {kafka_time[18]} "
             "(input contract event-time: max_past 3650 days)"),
        (19, "field 'browserHash' must not be empty, got '' (0 characters) (input contract length)"),
    ]
    assert observed_totals(first) == {"records_in": 20, "dead_letters": 4, "captcha_verifications": 1}
    # The state per key (streamops app state's read), as of the last batch: b1's challenge row and
    # its open windows, equal to the records above.
    files_before = sorted((str(f), f.stat().st_size, f.stat().st_mtime_ns) for f in checkpoint.rglob("*") if f.is_file())
    state = read_state(spark, spec, StateRequest(key="b1"), checkpoint=str(checkpoint))
    assert sorted((str(f), f.stat().st_size, f.stat().st_mtime_ns) for f in checkpoint.rglob("*") if f.is_file()) == \
        files_before  # a read writes nothing in the checkpoint
    stores = {store.query: store for store in state.stores}
    (challenge,) = stores["challenge"].rows
    assert (challenge["key"], challenge["value"]["count"], challenge["value"]["valueWithExtremumOrdering"]) == (
        {"fingerprint": "b1"}, 5, {"event_id": f"{logs}/0/4", "event_time": "2026-01-01T14:11:58.000Z"})
    windows = stores["window-count"]
    assert [(r["key"]["window"]["start"][11:19], r["value"]["count"]) for r in windows.rows] == [
        ("14:11:48", 1), ("14:11:50", 3), ("14:11:52", 4), ("14:11:54", 3), ("14:11:56", 1), ("14:11:58", 1)]
    assert windows.watermark == "2026-01-01T14:11:50.000Z" and not windows.more
    assert windows.batch_id == max(int(p.name) for p in (checkpoint / "window-count" / "commits").iterdir()
                                   if p.name.isdigit())  # as of the last committed batch
    # One read per record in each query: the challenge query's union of challenges and dead
    # letters shares one parse (the driver's records.shared_parses), read once, not twice.
    assert {q.name: sum(p.numInputRows for p in q.recentProgress) for q in first} == {
        "browser-activity.challenge": 20, "browser-activity.window-count": 20}
    # A roll's standby rehearses the plans its queries will run with (the shared parse too), as
    # batch jobs over the latest records: every query's plan runs.
    from streamops.driver import warm_standby
    from streamops.driver.options import RunOptions
    from streamops.driver.warm_standby import warm_up
    from streamops.programs import load_program

    # The rehearsal's time bound is the product's; here every plan must run, however busy the host.
    monkeypatch.setattr(warm_standby, "WARM_UP_LIMIT_S", 900.0)
    rehearsal = warm_up(spark, spec, load_program(spec),
                        RunOptions(kafka=broker.client_config, checkpoint=str(checkpoint), trigger="2 seconds"))
    assert "query challenge, query window-count, the Kafka producer" in rehearsal and "skipped" not in rehearsal, rehearsal

    # Second run from the same checkpoint: the watermark is now 14:12:00 - 10 s = 14:11:50.
    produce(
        broker.client_config,
        logs,
        [
            log_event("b1", "12:02.000"),  # b1's 6th action ...
            log_event("b1", "12:03.000", CAPTCHA),  # ... then b1 verifies: its challenge is retracted
            log_event("b3", "12:02.000"),  # b3's 5th action: challenged now (state survived the restart)
            log_event("b5", "11:45.000"),  # later than the watermark: dropped and counted
            log_event("b5", "12:01.000"),
        ],
        partition=0,
    )

    second = run_available_now(spark, app_catalog, "browser-activity", broker, checkpoint)

    new_challenges = appended(broker, spec.outputs["challenges"], since=challenges)
    assert sorted(((r.key_text, r.json()) for r in new_challenges), key=lambda kv: kv[0]) == [
        ("b1", None),  # tombstone: verified browsers count as 0
        ("b3", {"fingerprint": "b3", "actions": 5, "verified": False, "threshold": 5,
                "last_event_id": f"{logs}/0/22", "last_event_time": "2026-01-01T14:12:02.000Z"}),
    ]
    new_counts = [r.json() for r in appended(broker, spec.outputs["activity_counts"], since=counts_first)]
    assert by_window(new_counts) == [
        window("b1", "11:58", "12:03", 2),  # updated: :58 and 12:02
        window("b1", "12:00", "12:05", 1),
        window("b1", "12:02", "12:07", 1),
        window("b3", "11:58", "12:03", 1),
        window("b3", "12:00", "12:05", 1),
        window("b3", "12:02", "12:07", 1),
        window("b5", "11:58", "12:03", 1),  # only the on-time event
        window("b5", "12:00", "12:05", 1),
    ]
    window_query = next(q for q in second if q.name.endswith("window-count"))
    dropped = sum(op.numRowsDroppedByWatermark for p in window_query.recentProgress for op in p.stateOperators)
    # Spark counts a late record once per window it would have joined: 14:11:45 falls in the
    # windows starting 14:11:42 and 14:11:44.
    assert dropped == 2

    # Third run: a verified browser with activity is retracted again (the table's update stream);
    # a challenged one is updated with its new count and latest action; one under the threshold
    # writes nothing.
    produce(
        broker.client_config,
        logs,
        [
            log_event("b1", "12:04.000"),  # offset 25
            log_event("b2", "12:04.000", CAPTCHA),
            log_event("b3", "12:03.000"),  # 27: b3's 6th action
            log_event("b3", "12:01.000"),  # 28: its 7th, earlier in event time: not its latest action
            log_event("b5", "12:04.000"),  # b5's 3rd action (the late one counts here: no watermark)
        ],
        partition=0,
    )
    run_available_now(spark, app_catalog, "browser-activity", broker, checkpoint)
    since = challenges + new_challenges
    assert sorted(((r.key_text, r.json()) for r in appended(broker, spec.outputs["challenges"], since=since)),
                  key=lambda kv: kv[0]) == [
        ("b1", None),
        ("b2", None),
        ("b3", {"fingerprint": "b3", "actions": 7, "verified": False, "threshold": 5,
                "last_event_id": f"{logs}/0/27", "last_event_time": "2026-01-01T14:12:03.000Z"}),
    ]


def _windows_of(events: list[tuple[str, int]], base: str = "2026-01-01T14:20:") -> list[dict]:
    """The exact 5-second windows every 2 seconds of (fingerprint, second) actions within one minute:
    a window starts at an even second s and holds the actions at s <= t < s + 5."""
    counts: dict[tuple[str, int], int] = {}
    for browser, second in events:
        for start in range(second - 4, second + 1):
            if start % 2 == 0:
                counts[(browser, start)] = counts.get((browser, start), 0) + 1
    return by_window({"fingerprint": browser, "window_start": f"{base}{start:02d}.000Z",
                      "window_end": f"{base}{start + 5:02d}.000Z", "count": count}
                     for (browser, start), count in counts.items())


def test_a_hijacked_watermark_is_output_stopped_and_the_rebuild_with_the_bound_restores_exact_windows(
    spark, broker, admin, app_catalog, tmp_path, monkeypatch
):
    """With the event-time bound turned off, one far-future record moves the watermark to the year
    9999: later records are all dropped as late, and health says "output stopped" with the
    evidence. The documented way back (the bound on, recover_rebuild_state's live rebuild: its plan
    and apply steps, the start being an in-process run from earliest) writes the exact windows."""
    from types import SimpleNamespace

    from streamops.app_runtime import AppRuntime
    from streamops.app_status import app_status
    from streamops.driver.progress import ProgressPublisher
    from streamops.input_contract import InputContract
    from streamops.recovery.rebuild import apply_rebuild_live, plan_rebuild
    from streamops.supervision import evaluate

    monkeypatch.setenv("STREAMOPS_CHECKPOINT_ROOT", str(tmp_path / "checkpoints"))
    unbounded = app_catalog.model_copy(update={"apps": [
        app.model_copy(update={"input_contract": {"logs": InputContract(max_future=None, max_past=None)}})
        if app.name == "browser-activity" else app for app in app_catalog.apps]})
    spec = app_catalog.app("browser-activity")
    logs, counts_topic, checkpoint = spec.inputs["logs"], spec.outputs["activity_counts"], spec.checkpoint_location()
    runtime = AppRuntime(checkpoint)
    runtime.acquire({"app": spec.name, "version": spec.version})  # this process plays the running driver
    publisher = ProgressPublisher(runtime)
    spark.streams.addListener(publisher)

    def run(catalog, records, **options):
        produce(broker.client_config, logs, records, partition=0)
        queries = run_available_now(spark, catalog, "browser-activity", broker, checkpoint, **options)
        publisher.publish_last(queries)  # as the driver does: not left to the listener's thread
        return queries

    def at(browser, second):
        return log_event(browser, f"20:{second:02d}.000")

    try:
        run(unbounded, [at("b1", 10), at("b1", 11), timed_event("b9", FAR_FUTURE)])
        hijacked_counts = read_all(broker.client_config, counts_topic)
        run(unbounded, [at("b1", 13), at("b2", 14)])
        run(unbounded, [at("b2", 15)])
        assert appended(broker, counts_topic, since=hijacked_counts) == []  # every later record dropped as late

        health = evaluate(spec, app_status(spec, broker.client_config), runtime)
        assert health.state == "output stopped", health.evidence
        # Spark counts a late record once per window it would have joined: :13 in 2 windows, :14 in 3,
        # :15 in 2.
        assert health.evidence.startswith("query window-count: its last 2 batch(es) with input (within 5 minutes) read 3 "
                                          "record(s) and updated no state: all of them dropped as late (7 late drop(s)); ")
        assert "its watermark is 9999-12-31T23:59:49.999Z, 7972 years ahead of now" in health.evidence
        assert "recover_rebuild_state" in health.evidence

        # The way back: the bound on again (the catalog as shipped), then the live rebuild.
        plan = plan_rebuild(admin, app_catalog, "browser-activity", "live")
        assert plan.records == 6
        before_rebuild = read_all(broker.client_config, counts_topic)
        letters_before = read_all(broker.client_config, spec.dead_letter_topic)
        applied = apply_rebuild_live(
            spec, plan,
            start=lambda starting: (run(app_catalog, [], starting_offsets=starting), SimpleNamespace(pid=0, driver_log=None))[1],
            stop_app=lambda: runtime.release("stopped", "stopped for the rebuild"),
        )
        assert applied["backup"] and "before-rebuild" in applied["backup"]
    finally:
        spark.streams.removeListener(publisher)
        if runtime.is_running():
            runtime.release("stopped", "test over")

    rebuilt = [r.json() for r in appended(broker, counts_topic, since=before_rebuild)]
    assert by_window(rebuilt) == _windows_of([("b1", 10), ("b1", 11), ("b1", 13), ("b2", 14), ("b2", 15)])
    (letter,) = [r.json() for r in appended(broker, spec.dead_letter_topic, since=letters_before)]
    assert (letter["source"]["offset"], letter["reason"]) == (2, (
        f"field '@timestamp' '{FAR_FUTURE}' is more than 5 seconds after the record's Kafka timestamp "
        f"{letter['source']['timestamp']} (input contract event-time: max_future 5 seconds)"))
