"""The rollout's pure decisions: the order apps roll in, and the words of a refused state check
(Spark's check itself: tests/test_state_check.py). Rolls on real drivers: tests/test_rolling_restart.py."""

from __future__ import annotations

import yaml

from streamops.catalog import load_catalog
from streamops.driver.state_check import setting_changes, spark_words
from streamops.rollout import dependency_order, on_this_host


def test_dependency_order_puts_writers_before_their_readers():
    catalog = load_catalog()
    data = yaml.safe_load(catalog.to_yaml())
    downstream = dict(data["apps"][0])
    downstream.update(name="contacts-router", inputs={"operations": "oplog.category.contacts"},
                      outputs={"contacts": "presence.ticks"}, dead_letter_topic="presence.events",
                      settings={"categories": {"contacts": ["ADD_CONTACT"]}})
    data["apps"] = [downstream] + [a for a in data["apps"] if a["name"] != "presence-notifier"]
    chained = type(catalog).model_validate(data)
    assert dependency_order(chained, ["contacts-router", "oplog-router", "browser-activity"]) == [
        "oplog-router", "contacts-router", "browser-activity",
    ]


def test_a_declared_state_setting_changed_is_named_with_both_values():
    declared = {"count": ("count_window", "count_slide")}
    running = {"count_window": "10 minutes", "count_slide": "1 minute", "message": "hi"}
    assert setting_changes(declared, running, {**running, "message": "hello"}) == []  # not a state setting
    assert setting_changes(declared, running, {**running, "count_window": "11 minutes"}) == [
        "query 'count': setting count_window changes from 10 minutes to 11 minutes, and the state holds what 10 minutes "
        "made (the program declares it shapes the state; Spark checks the state's schema, not this)"]
    assert setting_changes(declared, None, {}) == []  # a driver that recorded no settings: Spark's check alone


def test_sparks_refusal_is_told_in_a_line_with_its_error_class():
    message = ("[STATE_STORE_KEY_SCHEMA_NOT_COMPATIBLE] Provided key schema does not match existing state key schema.\n"
               "Please check number and type of fields.\nExisting key_schema=StructType(StructField(k,LongType,true)) and "
               "new key_schema=StructType(StructField(k,StringType,true)).\nIf you want to force running the query without "
               "schema validation, please set spark.sql.streaming.stateStore.stateSchemaCheck to false.\n"
               "=== Streaming Query ===\nIdentifier: [id = 1]")
    assert spark_words(message) == (
        "Spark refuses to restart it from the running version's checkpoint: Provided key schema does not match existing "
        "state key schema. Please check number and type of fields. Existing key_schema=StructType(StructField(k,LongType,"
        "true)) and new key_schema=StructType(StructField(k,StringType,true)). (STATE_STORE_KEY_SCHEMA_NOT_COMPATIBLE)")


def test_a_failure_that_is_not_about_state_says_the_check_could_not_judge():
    assert spark_words("[KAFKA_UNREACHABLE] Timed out waiting for a node assignment.") == (
        "Spark's check could not judge (its empty batch on a copy of the checkpoint failed): Timed out waiting for a "
        "node assignment. (KAFKA_UNREACHABLE)")
    assert spark_words("java.lang.OutOfMemoryError: Java heap space") == (
        "Spark's check could not judge (its empty batch on a copy of the checkpoint failed): java.lang.OutOfMemoryError: "
        "Java heap space")


def test_a_duration_written_another_way_is_no_change():
    declared = {"count": ("count_window",)}
    assert setting_changes(declared, {"count_window": "10 minutes"}, {"count_window": "10 minute"}) == []
    assert setting_changes(declared, {"count_window": "600 seconds"}, {"count_window": "10 minutes"}) == []


def test_the_state_check_runs_spark_on_this_host_whatever_the_apps_master():
    argv = ["spark-submit", "--master", "spark://127.0.0.21:7077", "--name", "streamops-x", "--conf", "spark.cores.max=2",
            "--jars", "a.jar", "driver.py", "--app", "x"]
    assert on_this_host(argv) == [*argv[:2], "local[1]", *argv[3:]]
    cluster_mode = ["spark-submit", "--master", "k8s://https://k:6443", "--deploy-mode", "cluster", "driver.py"]
    assert on_this_host(cluster_mode) == ["spark-submit", "--master", "local[1]", "--deploy-mode", "client", "driver.py"]
    assert argv[2] == "spark://127.0.0.21:7077"  # the launch's own argv is left as it was
