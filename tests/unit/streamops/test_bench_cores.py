"""The cores bench's reading of a driver's batches and its check of the throughput model
(docs/performance.md "A model of throughput per added worker host")."""

# ruff: noqa: E501 - the log lines below are the driver's lines, whole

from __future__ import annotations

import pytest

from streamops.bench_probes import batch_costs, batches_by_query, cpu_role, cpu_used, logged_batches, predicted_rate
from streamops.bench_report import model_check

LOG = """\
2026-12-02 12:00:01 INFO streamops.driver.progress: query oplog-router.route batch 0: 0 rows in, 0.0 rows/s processed, 310 ms (queryPlanning 100, walCommit 20), state rows 0, dropped as late 0, metrics {}
2026-12-02 12:00:03 INFO streamops.driver.progress: query oplog-router.route batch 1: 600000 rows in, 30000.0 rows/s processed, 20000 ms (addBatch 19000, queryPlanning 500), state rows 0, dropped as late 0, metrics {}
2026-12-02 12:00:05 INFO streamops.driver.progress: query oplog-router.route batch 2: 100000 rows in, 33333.3 rows/s processed, 3000 ms (addBatch 2000, queryPlanning 600, walCommit 300), state rows 0, dropped as late 0, metrics {"router": {"records_in": 1}}
2026-12-02 12:00:09 INFO streamops.driver.progress: query oplog-router.route batch 3: 300000 rows in, 42857.1 rows/s processed, 7000 ms (addBatch 6000, queryPlanning 700), state rows 0, dropped as late 0, metrics {}
2026-12-02 12:00:19 INFO streamops.driver.progress: query oplog-router.route batch 4: 500000 rows in, 45454.5 rows/s processed, 11000 ms (addBatch 10000, walCommit 200), state rows 0, dropped as late 0, metrics {}
"""


def test_the_batches_after_the_warm_up_with_input_are_read_from_the_drivers_log_with_their_writing_time():
    assert logged_batches(LOG) == [(1, 600000, 20000, 19000), (2, 100000, 3000, 2000), (3, 300000, 7000, 6000),
                                   (4, 500000, 11000, 10000)]
    assert logged_batches(LOG, after_batch=1) == [(2, 100000, 3000, 2000), (3, 300000, 7000, 6000),
                                                  (4, 500000, 11000, 10000)]


def test_a_batch_logged_again_by_a_restarted_query_counts_once():
    again = LOG + LOG.splitlines()[-1].replace("11000 ms", "12000 ms") + "\n"
    assert logged_batches(again, after_batch=1)[-1] == (4, 500000, 12000, 10000)
    assert len(logged_batches(again, after_batch=1)) == 3


def test_a_batch_costs_its_time_outside_the_writing_plus_its_records_at_the_writing_rate():
    # Each batch spends 1 s outside addBatch; the writing runs at 50,000 records/s.
    costs = batch_costs([(2, 100000, 3000, 2000), (3, 300000, 7000, 6000), (4, 500000, 11000, 10000)])
    assert costs["batches"] == 3
    assert costs["fixed_cost_s"] == pytest.approx(1.0)
    assert costs["writing_rate"] == pytest.approx(50_000)
    assert costs["inside_batches_rate"] == pytest.approx(900_000 / 21)
    assert costs["mean_batch"] == pytest.approx(300_000)
    assert predicted_rate(300_000, 1.0, 50_000) == pytest.approx(300_000 / 7)


def test_a_run_without_batches_has_no_costs():
    assert batch_costs([]) == {"batches": 0, "inside_batches_rate": None, "fixed_cost_s": None, "writing_rate": None,
                               "mean_batch": None}


def _warm(place: str, cores: int, **batches) -> dict:
    return {"place": place, "cores": cores, "run": "warm", **batches}


def test_the_model_predicts_two_cores_from_one_and_says_what_k_the_measurement_implies():
    rows = [_warm("local", 1, fixed_cost_s=0.5, writing_rate=40_000, mean_batch=200_000, inside_batches_rate=36_000),
            # k = 1.5: 200,000 / (0.5 + 200,000 / 60,000) = 52,174 records/s measured
            _warm("local", 2, fixed_cost_s=0.4, writing_rate=60_000, mean_batch=200_000,
                  inside_batches_rate=200_000 / (0.5 + 200_000 / 60_000))]
    [line] = model_check(rows)
    predicted = predicted_rate(200_000, 0.5, 80_000)
    assert line == (f"model, local: one core F = 0.50 s per batch, R = 40,000 records/s; two cores at 200,000 records per "
                    f"batch: predicted {predicted:,.0f} records/s (k = 2), measured 52,174 inside batches (k = 1.50)")


def test_no_model_line_for_a_place_without_a_fit():
    assert model_check([_warm("standalone", 1, writing_rate=None), _warm("standalone", 2, mean_batch=1.0)]) == []
    # A two-core run whose batches were not logged, and rows of an older figures.json (no place or run).
    one = _warm("local", 1, fixed_cost_s=0.5, writing_rate=40_000, mean_batch=200_000, inside_batches_rate=36_000)
    assert model_check([one, _warm("local", 2, mean_batch=200_000, inside_batches_rate=None)]) == []
    assert model_check([{"engine": "Spark router, 1 core (local[1])", "rate": 13662}]) == []


def test_cpu_is_told_apart_by_what_each_process_runs():
    def role(*argv: str, pid: int = 10) -> str:
        return cpu_role(list(argv), own_pid=1, pid=pid)

    assert role("java", "-cp", "x", "org.apache.spark.executor.CoarseGrainedExecutorBackend", "--driver-url", "y") == \
        "Spark executors"
    assert role("java", "-cp", "x", "org.apache.spark.deploy.SparkSubmit", "--master", "spark://h:1") == "Spark driver (JVM)"
    assert role("python", "/work/plugins/streamops/entrypoints/driver.py", "--app", "r") == "Spark driver (Python)"
    assert role("java", "org.apache.spark.deploy.worker.Worker", "spark://h:1") == "Spark master and workers"
    assert role("/work/.venv/bin/python3", "-m", "pyspark.daemon") == "Python workers (pyspark)"
    assert role("java", "-Xmx1g", "kafka.Kafka", "server.properties") == "Kafka broker"
    assert role("bash") == "other"
    assert role("python", "-m", "streamops", pid=1) == "bench (producer)"


def test_cpu_used_counts_what_each_role_spent_between_two_snapshots():
    before = {1: ("Kafka broker", 100.0), 2: ("Spark executors", 50.0), 3: ("other", 9.0)}
    # 4 started in between (counted from 0); 3 ended (not counted); a reused pid with another role counts from 0.
    after = {1: ("Kafka broker", 112.5), 2: ("Spark executors", 80.0), 4: ("Spark executors", 5.0), 5: ("other", 0.01)}
    assert cpu_used(before, after) == {"Spark executors": 35.0, "Kafka broker": 12.5}
    assert list(cpu_used(before, after)) == ["Spark executors", "Kafka broker"]
    assert cpu_used({7: ("other", 1.0)}, {7: ("Kafka broker", 3.0)}) == {"Kafka broker": 3.0}


def test_a_stateful_runs_batches_are_summed_up_query_by_query():
    log = ("query presence-notifier.notify batch 7: 20000 rows in, 1.0 rows/s processed, 3000 ms (addBatch 2500, queryPlanning 300), x\n"
           "query presence-notifier.count batch 3: 0 rows in, 0.0 rows/s processed, 100 ms (queryPlanning 50), x\n"
           "query presence-notifier.notify batch 8: 10000 rows in, 1.0 rows/s processed, 2000 ms (addBatch 1700), x\n"
           "query presence-notifier.count batch 4: 900 rows in, 1.0 rows/s processed, 800 ms (addBatch 500), x\n")
    assert batches_by_query(log) == {
        "presence-notifier.count": {"batches": 1, "mean_rows": 900, "mean_ms": 800, "mean_outside_writing_ms": 300},
        "presence-notifier.notify": {"batches": 2, "mean_rows": 15000, "mean_ms": 2500, "mean_outside_writing_ms": 400},
    }
