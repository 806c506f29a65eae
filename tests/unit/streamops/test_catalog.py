"""Catalog validation: every bad catalog is refused with the file, entry, field and line."""

from __future__ import annotations

from pathlib import Path

import pytest

from streamops.catalog import CatalogError, load_catalog
from streamops.paths import PROJECT_ROOT

GOOD_TOPIC = """\
  - name: orders.placed
    partitions: 3
    replication_factor: 1
    owner: shop
    description: Orders as placed.
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "pipelines.yaml"
    path.write_text(text)
    return path


def problems(path: Path) -> list[str]:
    with pytest.raises(CatalogError) as caught:
        load_catalog(path)
    assert str(caught.value).startswith(f"catalog {path} is invalid")
    return caught.value.problems


def test_the_project_catalog_is_valid():
    catalog = load_catalog()
    assert "oplog.operations" in catalog.topic_names()
    assert catalog.topic("presence.latest-state").kafka_configs()["cleanup.policy"] == "compact"


def test_a_good_catalog_loads_with_configs_as_broker_strings(tmp_path):
    path = write(
        tmp_path,
        "version: 1\ntopics:\n"
        + GOOD_TOPIC
        + "    configs:\n      cleanup.policy: compact\n      retention.ms: 1000\n      preallocate: true\n",
    )
    topic = load_catalog(path).topic("orders.placed")
    assert topic.partitions == 3
    assert topic.kafka_configs() == {"cleanup.policy": "compact", "retention.ms": "1000", "preallocate": "true"}


def test_unknown_key_names_entry_field_and_line(tmp_path):
    path = write(tmp_path, "version: 1\ntopics:\n" + GOOD_TOPIC + "    partition_count: 3\n")
    assert problems(path) == [
        "topics[0] 'orders.placed' (line 8), field 'partition_count': "
        "unknown key (not part of the catalog format; check the spelling)"
    ]


def test_unknown_topic_config_is_refused(tmp_path):
    path = write(tmp_path, "version: 1\ntopics:\n" + GOOD_TOPIC + "    configs:\n      retention.msec: 10\n")
    assert problems(path) == [
        "topics[0] 'orders.placed' (line 8), field 'configs': unknown topic config 'retention.msec' "
        "(not a Kafka topic-level config; check the spelling)"
    ]


def test_wrong_type_is_refused(tmp_path):
    path = write(tmp_path, "version: 1\ntopics:\n" + GOOD_TOPIC.replace("partitions: 3", 'partitions: "three"'))
    assert problems(path) == [
        "topics[0] 'orders.placed' (line 4), field 'partitions': must be an integer (got str 'three')"
    ]


def test_numeric_string_is_not_silently_converted(tmp_path):
    path = write(tmp_path, "version: 1\ntopics:\n" + GOOD_TOPIC.replace("partitions: 3", 'partitions: "3"'))
    assert problems(path) == ["topics[0] 'orders.placed' (line 4), field 'partitions': must be an integer (got str '3')"]


@pytest.mark.parametrize("count", ["0", "-2"])
def test_non_positive_partitions_are_refused(tmp_path, count):
    path = write(tmp_path, "version: 1\ntopics:\n" + GOOD_TOPIC.replace("partitions: 3", f"partitions: {count}"))
    assert problems(path) == [
        f"topics[0] 'orders.placed' (line 4), field 'partitions': must be a positive integer (got {count})"
    ]


def test_duplicate_topic_name_is_refused(tmp_path):
    path = write(tmp_path, "version: 1\ntopics:\n" + GOOD_TOPIC + GOOD_TOPIC)
    assert problems(path) == [
        "topics[1] 'orders.placed' (line 8), field 'name': duplicate topic name 'orders.placed' "
        "(already declared at topics[0])"
    ]


def test_name_mixing_separators_with_the_rest_of_the_catalog_is_refused(tmp_path):
    other = GOOD_TOPIC.replace("orders.placed", "orders_shipped")
    path = write(tmp_path, "version: 1\ntopics:\n" + GOOD_TOPIC + other)
    assert problems(path) == [
        "topics[1] 'orders_shipped' (line 8), field 'name': 'orders_shipped' uses '_' but the catalog's "
        "names use '.' (from topics[0] 'orders.placed'); Kafka maps '.' and '_' to the same metric name, "
        "so one cluster must use only one"
    ]


def test_name_mixing_separators_within_itself_is_refused(tmp_path):
    path = write(tmp_path, "version: 1\ntopics:\n" + GOOD_TOPIC.replace("orders.placed", "orders.placed_v2"))
    assert problems(path) == [
        "topics[0] 'orders.placed_v2' (line 3), field 'name': "
        "mixes '.' and '_': Kafka maps both to the same metric name, so use one of them"
    ]


def test_illegal_characters_in_a_name_are_refused(tmp_path):
    path = write(tmp_path, "version: 1\ntopics:\n" + GOOD_TOPIC.replace("orders.placed", "orders/placed"))
    assert problems(path) == [
        "topics[0] 'orders/placed' (line 3), field 'name': must be 1-249 characters of letters, digits, "
        "'.', '_' and '-' (and not '.' or '..'), as Kafka requires"
    ]


def test_missing_field_is_named(tmp_path):
    path = write(tmp_path, "version: 1\ntopics:\n" + GOOD_TOPIC.replace("    owner: shop\n", ""))
    assert problems(path) == ["topics[0] 'orders.placed' (line 3), field 'owner': required but missing"]


def test_min_insync_replicas_above_replication_factor_is_refused(tmp_path):
    path = write(tmp_path, "version: 1\ntopics:\n" + GOOD_TOPIC + "    configs:\n      min.insync.replicas: 2\n")
    assert problems(path) == [
        "topics[0] 'orders.placed' (line 3): configs.min.insync.replicas (2) is larger than "
        "replication_factor (1): no write with acks=all could ever succeed"
    ]


def test_every_problem_is_reported_at_once(tmp_path):
    bad = GOOD_TOPIC.replace("partitions: 3", "partitions: 0").replace("replication_factor: 1", "replication_factor: x")
    path = write(tmp_path, "version: 1\ntopics:\n" + bad)
    assert problems(path) == [
        "topics[0] 'orders.placed' (line 4), field 'partitions': must be a positive integer (got 0)",
        "topics[0] 'orders.placed' (line 5), field 'replication_factor': must be an integer (got str 'x')",
    ]


def test_duplicate_yaml_key_is_refused(tmp_path):
    path = write(tmp_path, "version: 1\ntopics:\n" + GOOD_TOPIC + "    partitions: 6\n")
    assert problems(path) == ["line 8, column 5: not valid YAML: duplicate key 'partitions' (first at line 4)"]


def test_broken_yaml_is_reported_with_its_position(tmp_path):
    path = write(tmp_path, "version: 1\ntopics:\n  - name: [unclosed\n")
    assert problems(path) == ["line 4, column 1: not valid YAML: expected ',' or ']', but got '<stream end>'"]


def test_missing_file_is_reported(tmp_path):
    assert problems(tmp_path / "nope.yaml") == ["file not found"]


def test_unknown_top_level_key_is_refused(tmp_path):
    path = write(tmp_path, "version: 1\ntopic:\n" + GOOD_TOPIC)
    assert problems(path) == [
        "top level key 'topics' (line 1): required but missing",
        "top level key 'topic' (line 2): unknown key (not part of the catalog format; check the spelling)",
    ]


def test_a_catalog_written_back_to_yaml_loads_equal(tmp_path):
    catalog = load_catalog()
    path = tmp_path / "copy.yaml"
    path.write_text(catalog.to_yaml())
    assert load_catalog(path) == catalog


def test_topic_prefix_renames_topics_and_every_app_reference():
    catalog = load_catalog().with_topic_prefix("scratch")
    router = catalog.app("oplog-router")
    assert router.inputs == {"operations": "scratch.oplog.operations"}
    assert router.dead_letter_topic == "scratch.oplog.router.dead-letters"
    assert set(router.topics()) <= set(catalog.topic_names())


APP = """\
apps:
  - name: router
    program: spark_apps.oplog_router
    version: 1.0.0
    owner: shop
    description: Routes orders.
    inputs: {operations: orders.placed}
    outputs: {big: orders.big}
    dead_letter_topic: orders.dead
    settings:
      categories: {big: [LARGE_ORDER]}
    code: installed  # these tests check the installed program's declarations
"""
TOPICS = "version: 1\ntopics:\n" + GOOD_TOPIC + "".join(
    GOOD_TOPIC.replace("orders.placed", name) for name in ("orders.big", "orders.dead")
)


def test_a_good_app_loads_with_program_settings(tmp_path):
    app = load_catalog(write(tmp_path, TOPICS + APP)).app("router")
    assert app.settings == {"categories": {"big": ["LARGE_ORDER"]}}  # validated by the router's own model
    assert app.topics() == ["orders.placed", "orders.big", "orders.dead"]


def test_app_referencing_an_undeclared_topic_is_refused(tmp_path):
    path = write(tmp_path, TOPICS + APP.replace("dead_letter_topic: orders.dead", "dead_letter_topic: orders.dlq"))
    assert problems(path) == [
        "apps[0] 'router' (line 26), field 'dead_letter_topic': topic 'orders.dlq' is not declared under 'topics'"
    ]


def test_app_roles_must_fit_the_program(tmp_path):
    path = write(tmp_path, TOPICS + APP.replace("inputs: {operations: orders.placed}", "inputs: {ops: orders.placed}"))
    assert problems(path) == [
        "apps[0] 'router' (line 24), field 'inputs': program spark_apps.oplog_router reads the roles ['operations'], "
        "the catalog gives ['ops']"
    ]


def test_router_categories_must_match_its_outputs(tmp_path):
    path = write(tmp_path, TOPICS + APP.replace("categories: {big: [LARGE_ORDER]}", "categories: {huge: [LARGE_ORDER]}"))
    assert problems(path) == [
        "apps[0] 'router' (line 25), field 'outputs': program spark_apps.oplog_router writes one output role per key of "
        "settings.categories (['huge']), the catalog gives ['big']"
    ]


def test_app_settings_are_validated_with_their_line(tmp_path):
    path = write(
        tmp_path,
        TOPICS + APP.replace("program: spark_apps.oplog_router", "program: spark_apps.browser_activity").replace(
            "categories: {big: [LARGE_ORDER]}", "captcha_logger: x\n      window: 5 secs"
        ),
    )
    assert problems(path) == [
        "apps[0] 'router' (line 24), field 'inputs': program spark_apps.browser_activity reads the roles ['logs'], "
        "the catalog gives ['operations']",
        "apps[0] 'router' (line 25), field 'outputs': program spark_apps.browser_activity writes the roles "
        "['activity_counts', 'challenges'], the catalog gives ['big']",
        "apps[0] 'router' (line 29), field 'settings.window': '5 secs' does not have the expected form "
        "(a Spark interval such as '10 seconds' or '5 minutes') (program spark_apps.browser_activity)"
    ]


def test_unknown_program_is_refused(tmp_path):
    path = write(tmp_path, TOPICS + APP.replace("program: spark_apps.oplog_router", "program: spark_apps.oplog_routr"))
    assert problems(path) == [
        "apps[0] 'router' (line 20), field 'program': program 'spark_apps.oplog_routr': no module "
        "'spark_apps.oplog_routr' here (a typo, or a package not installed: name an artifact instead)"
    ]
    path = write(tmp_path, TOPICS + APP.replace("program: spark_apps.oplog_router", "program: 'oplog router'"))
    assert problems(path) == [
        "apps[0] 'router' (line 20), field 'program': 'oplog router' does not have the expected form (an importable "
        "reference such as 'my_pipelines.dedup' or 'my_pipelines.dedup:program')"
    ]
    path = write(tmp_path, TOPICS + APP.replace("program: spark_apps.oplog_router", "program: streamops.records:Field"))
    assert problems(path) == [
        "apps[0] 'router' (line 20), field 'program': streamops.records:Field is a type, not a streaming "
        "program (an instance of streamops.program_contract.StreamingProgram)"
    ]


def test_two_apps_writing_one_topic_is_refused(tmp_path):
    second = APP.replace("apps:\n", "").replace("name: router", "name: router-two")
    path = write(tmp_path, TOPICS + APP + second)
    assert problems(path) == [
        "apps[1] 'router-two' (line 36), field 'outputs.big': topic 'orders.big' is already written by app "
        "'router'; every topic has one writing app",
        "apps[1] 'router-two' (line 37), field 'dead_letter_topic': topic 'orders.dead' is already written by app "
        "'router'; every topic has one writing app",
    ]


# --- value schemas and expectation suites ---------------------------------------------------


def test_every_output_topic_has_a_suite_that_loads_with_its_catalog_parameters():
    from streamops.quality.suites import load_suite

    catalog = load_catalog()
    outputs = {t for app in catalog.apps for t in [*app.outputs.values(), app.dead_letter_topic]}
    assert set(catalog.validated_topics()) == outputs
    contacts = load_suite(catalog, "oplog.category.contacts")
    assert contacts.parameters["categories"] == catalog.app("oplog-router").settings["categories"]["contacts"]
    assert contacts.parameters["role"] == ["contacts"]
    assert contacts.reconciliation == "router"
    counts = load_suite(catalog, "presence.notification-counts")
    window_check = next(e for e in counts.record_expectations if "window size" in e["description"])
    assert "<> 600000" in window_check["kwargs"]["unexpected_rows_query"]  # 10 minutes, from the catalog


def test_a_suite_file_that_does_not_exist_is_named_with_its_line(tmp_path):
    path = write(tmp_path, "version: 1\ntopics:\n" + GOOD_TOPIC
                 + "    value_schema: {id: string}\n    expectation_suite: expectations/nope.json\n")
    assert problems(path) == [
        f"topics[0] 'orders.placed' (line 9), field 'expectation_suite': file {tmp_path / 'expectations' / 'nope.json'} not found"
    ]


def test_a_suite_needs_a_value_schema_and_schema_types_are_checked(tmp_path):
    (tmp_path / "s.json").write_text('{"expectations": []}')
    path = write(tmp_path, "version: 1\ntopics:\n" + GOOD_TOPIC + "    value_schema: {id: integer}\n  - name: orders.paid\n"
                 "    partitions: 1\n    replication_factor: 1\n    owner: shop\n    description: d\n"
                 "    expectation_suite: s.json\n")
    assert problems(path) == [
        "topics[0] 'orders.placed' (line 8), field 'value_schema.id': must be one of "
        "'string', 'bigint', 'double', 'boolean', 'timestamp' or 'json' (got 'integer')",
        "topics[1] 'orders.paid' (line 9): expectation_suite needs value_schema: the suite validates the decoded fields",
    ]


def test_a_suite_parameter_the_catalog_does_not_provide_is_refused(tmp_path):
    import json

    from streamops.quality.suites import SuiteError, load_suite

    catalog = load_catalog()
    suite_file = tmp_path / "contacts.json"
    suite_file.write_text(json.dumps({"name": "x", "expectations": [
        {"type": "expect_column_values_to_be_in_set", "kwargs": {"column": "op_type", "value_set": {"$PARAMETER": "op_typo"}}}]}))
    topics = [t.model_copy(update={"expectation_suite": str(suite_file)}) if t.name == "oplog.category.contacts" else t
              for t in catalog.topics]
    with pytest.raises(SuiteError) as caught:
        load_suite(catalog.model_copy(update={"topics": topics}), "oplog.category.contacts")
    assert str(caught.value) == (
        f"suite file {suite_file}, expectations[0], kwargs.value_set: parameter 'op_typo' is not provided by the "
        "catalog (available: app, categories, role)"
    )


# --- environments -------------------------------------------------------------------------------

ENVIRONMENTS = """\
version: 1
environments:
  local:
    brokers: 1
    topic_defaults: {replication_factor: 1, configs: {min.insync.replicas: 1}}
  cluster:
    brokers: 3
    tolerate_broker_loss: true
    topic_defaults: {replication_factor: 3, configs: {min.insync.replicas: 2}}
    topics:
      orders.placed: {partitions: 12, configs: {retention.ms: 1000}}
topics:
  - name: orders.placed
    partitions: 3
    owner: shop
    description: Orders as placed.
    configs: {cleanup.policy: delete}
  - name: orders.audit
    partitions: 1
    replication_factor: 2
    owner: shop
    description: Kept on two replicas everywhere but local.
    configs: {min.insync.replicas: 1}
"""


def test_one_catalog_resolves_per_environment(tmp_path, monkeypatch):
    path = write(tmp_path, ENVIRONMENTS)
    monkeypatch.delenv("STREAMOPS_ENVIRONMENT", raising=False)
    with pytest.raises(CatalogError, match="but the environment has 1 broker"):
        load_catalog(path)  # local by default
    cluster = load_catalog(path, environment="cluster")
    placed = cluster.topic("orders.placed")
    # Override > the entry's own value > defaults; configs merged in the same order.
    assert (placed.partitions, placed.replication_factor) == (12, 3)
    assert placed.kafka_configs() == {"min.insync.replicas": "2", "cleanup.policy": "delete", "retention.ms": "1000"}
    assert cluster.topic("orders.audit").replication_factor == 2
    monkeypatch.setenv("STREAMOPS_ENVIRONMENT", "cluster")
    assert load_catalog(path).topic("orders.placed").partitions == 12
    # Written back, a catalog is resolved and standalone: it loads the same in any environment.
    again = write(tmp_path / "..", cluster.to_yaml())
    monkeypatch.setenv("STREAMOPS_ENVIRONMENT", "local")
    assert load_catalog(again).topics == cluster.topics
    # ... and says which environment it was loaded in (a driver records it).
    assert (load_catalog(again).environment, load_catalog(again, environment="cluster").environment) == ("local", "cluster")


def test_the_project_catalog_has_a_local_and_a_cluster_environment():
    local, cluster = load_catalog(environment="local"), load_catalog(environment="cluster")
    assert {(t.replication_factor, t.configs["min.insync.replicas"]) for t in local.topics} == {(1, 1)}
    assert {(t.replication_factor, t.configs["min.insync.replicas"]) for t in cluster.topics} == {(3, 2)}
    assert [t.name for t in local.topics] == [t.name for t in cluster.topics]


def test_an_environment_asking_more_replicas_than_brokers_is_refused_with_entry_and_line(tmp_path):
    path = write(tmp_path, ENVIRONMENTS)
    with pytest.raises(CatalogError) as caught:
        load_catalog(path, environment="local")
    assert caught.value.problems == [
        "environment 'local': topics[1] 'orders.audit' (line 20), field 'replication_factor': 2 replicas, "
        "but the environment has 1 broker(s)",
    ]


def test_an_environment_that_must_survive_a_broker_loss_refuses_min_isr_equal_to_replicas(tmp_path):
    path = write(tmp_path, ENVIRONMENTS.replace("{min.insync.replicas: 2}", "{min.insync.replicas: 3}")
                 .replace("replication_factor: 2", "replication_factor: 3"))
    found = problems_in(path, "cluster")
    assert len(found) == 1 and all("field 'configs.min.insync.replicas': 3 with replication_factor 3 refuses acks=all "
                                   "writes as soon as one broker is down" in p for p in found)
    assert found[0].startswith("environment 'cluster': topics[0] 'orders.placed' (line 13)")


def test_an_unknown_environment_or_override_is_refused(tmp_path):
    path = write(tmp_path, ENVIRONMENTS.replace("orders.placed: {partitions", "orders.placd: {partitions"))
    assert problems_in(path, "staging") == [
        "environments (line 2): environment 'staging' ($STREAMOPS_ENVIRONMENT) is not defined; defined: local, cluster"]
    assert problems_in(path, "cluster") == [
        "environment 'cluster' (line 11), field 'topics.orders.placd': no topic 'orders.placd' in the catalog"]


def test_an_environments_own_settings_are_validated_with_their_line(tmp_path):
    path = write(tmp_path, ENVIRONMENTS.replace("brokers: 3", "brokers: three"))
    assert problems_in(path, "local") == [
        "environment 'cluster' (line 7), field 'brokers': must be an integer (got str 'three')"]


def test_an_environment_overrides_an_apps_trigger_and_merges_its_spark_conf(tmp_path):
    from streamops.catalog import EnvironmentSpec

    base = load_catalog(environment="local")
    data = __import__("yaml").safe_load(base.to_yaml())
    data["environments"] = {"local": {}, "cluster": EnvironmentSpec.model_validate({
        "brokers": 3, "topic_defaults": {"replication_factor": 3, "configs": {"min.insync.replicas": 2}},
        "apps": {"oplog-router": {"trigger": "1 second", "spark_conf": {"spark.sql.shuffle.partitions": 12}}},
    }).model_dump(exclude_none=True)}
    for topic in data["topics"]:
        topic.pop("replication_factor")
        topic["configs"].pop("min.insync.replicas")
    path = write(tmp_path, __import__("yaml").safe_dump(data))
    router = load_catalog(path, environment="cluster").app("oplog-router")
    assert router.trigger == "1 second"
    assert router.spark_conf == {**base.app("oplog-router").spark_conf, "spark.sql.shuffle.partitions": 12}


def problems_in(path: Path, environment: str) -> list[str]:
    with pytest.raises(CatalogError) as caught:
        load_catalog(path, environment=environment)
    return caught.value.problems


def test_the_router_may_run_in_real_time_with_a_checkpoint_interval_and_back_pressure(tmp_path):
    text = TOPICS + APP + "    trigger: real-time\n    checkpoint_interval: 30 seconds\n    max_offsets_per_trigger: 50000\n"
    app = load_catalog(write(tmp_path, text)).app("router")
    assert (app.real_time, app.real_time_interval(), app.commit_interval_ms(), app.max_offsets_per_trigger) == (
        True, "30 seconds", 30_000, 50_000)
    default = load_catalog(write(tmp_path, TOPICS + APP + "    trigger: real-time\n")).app("router")
    assert (default.real_time_interval(), default.commit_interval_ms()) == ("10 seconds", 10_000)
    micro = load_catalog(write(tmp_path, TOPICS + APP)).app("router")
    assert (micro.real_time, micro.commit_interval_ms(), micro.max_offsets_per_trigger) == (False, 5_000, None)


def test_real_time_is_refused_for_a_stateful_program_with_the_reason(tmp_path):
    text = (TOPICS + GOOD_TOPIC.replace("orders.placed", "orders.counts") + APP).replace(
        "program: spark_apps.oplog_router", "program: spark_apps.browser_activity"
    ).replace("inputs: {operations: orders.placed}", "inputs: {logs: orders.placed}").replace(
        "outputs: {big: orders.big}", "outputs: {activity_counts: orders.counts, challenges: orders.big}"
    ).replace("categories: {big: [LARGE_ORDER]}", "captcha_logger: x") + "    trigger: real-time\n"
    assert problems(write(tmp_path, text)) == [
        "apps[0] 'router' (line 35), field 'trigger': real-time mode runs stateless queries only (Spark 4.2 keeps no "
        "state in real-time mode), and program spark_apps.browser_activity keeps state (query challenge: "
        "groupBy(fingerprint) aggregation: actions, verified and the latest action per browser; query "
        "window-count: windowed count per fingerprint with a watermark); give this app a micro-batch interval such "
        "as '5 seconds'"
    ]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ("    checkpoint_interval: 30 seconds\n",
         "checkpoint_interval (30 seconds) applies to trigger: real-time only; with a micro-batch trigger (5 seconds) "
         "progress is committed after every batch"),
        ("    trigger: real-time\n    checkpoint_interval: 2 seconds\n",
         "checkpoint_interval 2 seconds is shorter than Spark's real-time minimum of 5 seconds"),
        ("    max_offsets_per_trigger: 0\n", "field 'max_offsets_per_trigger': must be at least 1 (got 0)"),
        ("    trigger: realtime\n", "'realtime'"),
    ],
)
def test_bad_trigger_settings_are_refused_with_the_reason(tmp_path, extra, message):
    found = problems(write(tmp_path, TOPICS + APP + extra))
    assert len(found) >= 1 and any(message in problem for problem in found), found


def test_real_time_checkpoint_interval_is_bounded_and_an_environment_may_switch_back_to_micro_batches(tmp_path):
    real_time = TOPICS + APP + "    trigger: real-time\n    checkpoint_interval: 30 seconds\n"
    assert any("checkpoint_interval 2 minutes is longer than 60 seconds: a graceful stop waits for the next checkpoint"
               in problem for problem in problems(write(tmp_path, real_time.replace("30 seconds", "2 minutes"))))
    switched = real_time.replace(
        "version: 1\n", "version: 1\nenvironments:\n  local:\n    apps:\n      router: {trigger: 2 seconds}\n", 1)
    app = load_catalog(write(tmp_path, switched)).app("router")
    assert (app.trigger, app.checkpoint_interval, app.real_time) == ("2 seconds", None, False)


# --- the input contract's rules per input ----------------------------------------------------


def test_input_contract_rules_load_on_top_of_the_programs_fields(tmp_path):
    from streamops.input_contract import DEFAULT_CONTRACT

    contract = ("    input_contract:\n      operations:\n        max_depth: 20\n        max_future: 30 seconds\n"
                "        max_past: null\n        fields:\n          seq: {minimum: 0, maximum: 1000}\n"
                "          user_id: {pattern: 'u[0-9]+', max_length: 32}\n")
    app = load_catalog(write(tmp_path, TOPICS + APP.replace("    settings:\n", contract + "    settings:\n"))).app("router")
    rules = app.contract("operations")
    assert (rules.max_depth, rules.max_future_ms(), rules.max_past_ms()) == (20, 30_000, None)
    assert rules.fields["seq"].set_rules() == {"minimum": 0, "maximum": 1000}
    # A role the catalog says nothing about gets the defaults: 64 levels, 5 minutes ahead, 3650 days back.
    assert load_catalog(write(tmp_path, TOPICS + APP)).app("router").contract("operations") == DEFAULT_CONTRACT
    assert (DEFAULT_CONTRACT.max_depth, DEFAULT_CONTRACT.max_future, DEFAULT_CONTRACT.max_past) == (64, "5 minutes", "3650 days")


@pytest.mark.parametrize(("contract", "expected"), [
    ("      operation:\n        max_depth: 10\n",
     "input_contract: ['operation'] are not input roles of this app (inputs: ['operations'])"),
    ("      operations:\n        max_depth: 999\n", "field 'input_contract.operations.max_depth': must be at most 998"),
    ("      operations:\n        max_future: soon\n", "field 'input_contract.operations.max_future'"),
    ("      operations:\n        fields:\n          sequence: {minimum: 0}\n",
     "field 'input_contract.operations.fields.sequence': the program's fields for this input are seq, user_id, op_type, "
     "event_time; there is no 'sequence' (program spark_apps.oplog_router)"),
    ("      operations:\n        fields:\n          seq: {min_length: 1}\n",
     "field 'input_contract.operations.fields.seq.min_length': applies to strings, and 'seq' is a bigint field "
     "(program spark_apps.oplog_router)"),
    ("      operations:\n        fields:\n          user_id: {minimum: 1}\n",
     "field 'input_contract.operations.fields.user_id.minimum': applies to integers, and 'user_id' is a string field"),
    ("      operations:\n        fields:\n          seq: {minimum: 5, maximum: 1}\n", "minimum 5 is more than maximum 1"),
    ("      operations:\n        fields:\n          user_id: {pattern: 'u[0-9', max_length: 9}\n",
     "pattern 'u[0-9' is not a regular expression"),
    # Patterns Java (Spark) would read differently from Python, or not at all, and one without a length bound.
    ("      operations:\n        fields:\n          user_id: {pattern: '(a)\\1', max_length: 9}\n",
     "the escape \\1 means something else"),
    ("      operations:\n        fields:\n          user_id: {pattern: '[A-Z]{,8}', max_length: 9}\n",
     "'{,n}' is a repetition to Python"),
    ("      operations:\n        fields:\n          user_id: {pattern: '(?i)u[0-9]+', max_length: 9}\n", "no flags, comments"),
    ("      operations:\n        fields:\n          user_id: {pattern: '[[]u', max_length: 9}\n", "inside a character class"),
    ("      operations:\n        fields:\n          user_id: {pattern: 'u[0-9]+'}\n",
     "needs max_length on the same field, at most 1000"),
])
def test_input_contract_mistakes_are_named_with_the_field(tmp_path, contract, expected):
    text = TOPICS + APP.replace("    settings:\n", "    input_contract:\n" + contract + "    settings:\n")
    found = problems(write(tmp_path, text))
    assert len(found) == 1 and expected in found[0] and "apps[0] 'router'" in found[0], found


def test_a_windowed_apps_event_time_bound_stays_below_its_watermark(tmp_path):
    """A record max_future ahead moves a windowed app's watermark that far: the catalog refuses a
    bound at or above the watermark, and an input without one gets half of it."""
    import shutil

    import yaml

    from streamops.paths import PROJECT_ROOT

    document = yaml.safe_load((PROJECT_ROOT / "catalog" / "pipelines.yaml").read_text())
    shutil.copytree(PROJECT_ROOT / "catalog" / "expectations", tmp_path / "expectations")
    notifier = next(app for app in document["apps"] if app["name"] == "presence-notifier")
    notifier["input_contract"]["events"]["max_future"] = "1 minute"  # the windows' watermark is 1 minute
    del notifier["input_contract"]["ticks"]["max_future"]
    path = tmp_path / "catalog.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    (problem,) = problems(path)
    assert "apps[1] 'presence-notifier'" in problem and problem.endswith(
        "field 'input_contract.events.max_future': max_future 1 minute is not shorter than settings.watermark (1 minute): one "
        "record that far ahead would move the windows' watermark past records still on time; keep it below (unset, it is half "
        "the watermark)")
    notifier["input_contract"]["events"]["max_future"] = "20 seconds"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    app = load_catalog(path).app("presence-notifier")
    assert (app.contract("events").max_future, app.contract("ticks").max_future) == ("20 seconds", "30 seconds")


def test_only_the_local_environment_may_apply_destructive_plans_unattended(tmp_path):
    text = (PROJECT_ROOT / "catalog" / "pipelines.yaml").read_text()
    assert load_catalog(environment="local", check_programs=False).unattended_allowed()
    assert not load_catalog(environment="cluster", check_programs=False).unattended_allowed()
    bad = tmp_path / "catalog.yaml"
    bad.write_text(text.replace("unattended_in: [local]", "unattended_in: [local, cluster]"))
    with pytest.raises(CatalogError) as refused:
        load_catalog(bad, check_programs=False)
    assert "only 'local' may apply such plans unattended, not 'cluster': everywhere else a second person approves " \
           "them" in str(refused.value)
