"""The trigger forms as Airflow validates them (each DAG's params, no run): hostile Spark
settings, out-of-range numbers and times, memory sizes, names and notes. What the code does with a
value that gets past a form is in tests/test_trigger_params.py."""

from __future__ import annotations

import copy

import pytest

from streamops.launch_overrides import ALLOWED_SPARK_CONF, LaunchOverrideRefused
from tests.support import PROJECT_ROOT
from tests.support.hostile import hostile_confs

APP = "oplog-router"
MAX_OFFSET = 2**63 - 1


@pytest.fixture(scope="module")
def dags():
    """The project's DAGs as Airflow parses them (for their param schemas)."""
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(PROJECT_ROOT / "dags"))
    assert not bag.import_errors, bag.import_errors
    return bag.dags


def form_refusal(dags, dag_id: str, **conf) -> str | None:
    """Airflow's validation of a trigger's conf against the DAG's params (None: accepted)."""
    from airflow.sdk.definitions.param import ParamValidationError

    params = copy.deepcopy(dags[dag_id].params)
    try:
        params.update(conf)  # checks each value as it is set
        params.validate()
    except ParamValidationError as exc:
        return str(exc)
    return None


def test_the_trigger_form_refuses_every_hostile_spark_conf(dags, canary):
    for dag_id in ("deploy_apps", "roll_restart_apps"):
        schema = dags[dag_id].params.get_param("spark_conf").schema
        assert schema["additionalProperties"] is False and set(schema["properties"]) == set(ALLOWED_SPARK_CONF)
        for conf, _ in hostile_confs(*canary):
            refused = form_refusal(dags, dag_id, apps=[APP], spark_conf=conf)
            assert refused is not None, (dag_id, conf)
            assert refused.startswith("Invalid input for param spark_conf: "), refused
            (key, value), = conf.items()
            if key in ALLOWED_SPARK_CONF:
                assert (f"{value!r} does not match" in refused
                        or f"{value} is greater than the maximum of 10000" in refused), refused
            else:
                assert f"({key!r} was unexpected)" in refused, refused
        assert form_refusal(dags, dag_id, apps=[APP], spark_conf={
            "spark.driver.memory": "2g", "spark.executor.memory": "512m", "spark.sql.shuffle.partitions": 8,
            "spark.sql.streaming.noDataMicroBatches.enabled": False}) is None
    assert form_refusal(dags, "deploy_apps", apps=[APP], version="1.0.0; touch x").startswith("Invalid input for param version: ")
    roll_version = dags["roll_restart_apps"].params.get_param("version")
    assert roll_version.schema["type"] == "string" and "semantic version such as 1.4.0" in roll_version.description
    assert not canary[0].exists()


def test_out_of_range_numbers_and_times_are_refused_by_the_forms(dags):
    cases = [
        ("recover_reset_offsets", {"mode": "shift", "shift": 2**70}, "Invalid input for param shift: 1180591620717411303424 "
                                                                      f"is greater than the maximum of {MAX_OFFSET}"),
        ("recover_reset_offsets", {"mode": "offsets", "offsets": {"t": {"0": 2**70}}},
         f"Invalid input for param offsets: 1180591620717411303424 is greater than the maximum of {MAX_OFFSET}"),
        ("recover_reset_offsets", {"mode": "duration", "duration": "99999999999999 days"},
         "Invalid input for param duration: '99999999999999 days' does not match"),
        ("recover_reset_offsets", {"mode": "datetime", "to_datetime": "0001-01-01T00:00:00Z"},
         "Invalid input for param to_datetime: '0001-01-01T00:00:00Z' does not match"),
        ("validate_topic_quality", {"range": "offsets", "offsets": {"t": {"0": [0, 2**70]}}},
         f"Invalid input for param offsets: 1180591620717411303424 is greater than the maximum of {MAX_OFFSET}"),
        ("validate_topic_quality", {"range": "last_records", "last_records": 10**7},
         "Invalid input for param last_records: 10000000 is greater than the maximum of 1000000"),
        ("validate_topic_quality", {"range": "time_range", "start_time": "0001-01-01T00:00:00Z"},
         "Invalid input for param start_time: '0001-01-01T00:00:00Z' does not match"),
        ("reprocess", {"start": "0001-01-01T00:00:00Z"}, "Invalid input for param start: '0001-01-01T00:00:00Z' does not match"),
        ("reprocess", {"end": "9999-12-31T00:00:00Z"}, "Invalid input for param end: '9999-12-31T00:00:00Z' does not match"),
        ("recover_replay_dead_letters", {"start": "99999999999999 days"},
         "Invalid input for param start: '99999999999999 days' does not match"),
        ("recover_replay_dead_letters", {"end": "0001-01-01T00:00:00Z"},
         "Invalid input for param end: '0001-01-01T00:00:00Z' does not match"),
    ]
    for dag_id, conf, reason in cases:
        refused = form_refusal(dags, dag_id, **conf)
        assert refused is not None and refused.startswith(reason), (dag_id, conf, refused)
    for dag_id, conf in (("recover_reset_offsets", {"mode": "duration", "duration": "2 hours"}),
                         ("recover_reset_offsets", {"mode": "datetime", "to_datetime": "2026-11-22T03:00:00+01:00"}),
                         ("recover_reset_offsets", {"mode": "shift", "shift": -500}),
                         ("reprocess", {"start": "6 hours", "end": "now"}),
                         ("recover_replay_dead_letters", {"start": "2026-11-22T03:00:00Z", "end": "2026-11-22T04:00:00.5Z"})):
        assert form_refusal(dags, dag_id, **conf) is None, (dag_id, conf)


def test_the_forms_size_patterns_hold_exactly_the_sizes_the_code_accepts():
    """The schema bounds a memory size by pattern; it must agree with the code's bounds."""
    import re

    sizes = [f"{n}m" for n in (*range(1, 2100), *range(2100, 300_000, 97), 32767, 32768, 32769, 65535, 65536, 65537,
                               262143, 262144, 262145, 999999)]
    sizes += [f"{n}g" for n in range(1, 1000)] + ["0m", "01g", "2G", "2gb", "2g ", "-1g", "2.5g"]
    for entry in (e for e in ALLOWED_SPARK_CONF.values() if e.kind == "size"):
        pattern = re.compile(entry.size_pattern())
        for size in sizes:
            in_form = bool(pattern.search(size)) and len(size) <= 7  # as jsonschema checks pattern and maxLength
            assert in_form == (entry.normalised(size) is not None), (entry.key, size)
        # Python's `$` also matches before a final line break, so an API trigger's "2g\n" passes the
        # schema on the server (not the UI's JavaScript check); the code refuses it.
        assert pattern.search("2g\n") and entry.normalised("2g\n") is None


def test_names_are_matched_whole_and_notes_are_plain_text():
    from streamops.catalog import VERSION_PATTERN
    from streamops.dag_tasks import is_dry_run
    from streamops.recovery.skip import note_problem, parse_specs

    problems: list[str] = []
    assert parse_specs(["oplog.operations:3:1207\n"], problems) == []
    assert problems == ["record 'oplog.operations:3:1207\\n' is not 'topic:partition:offset' or 'topic:partition:first-last' "
                        "(e.g. 'oplog.operations:3:1200' or 'oplog.operations:3:1200-1210')"]
    for note in ("ok\u2028FAKE LINE", "ticket\u202e1-SPO", "a\x85b"):
        assert note_problem(note) == (
            "note contains a line break, control or formatting character: keep it to one line of plain text")
    assert note_problem("OPS-7: too big for contacts (ü)") is None
    import re

    for version in ("1.0.0-..", "1.0.0-a..b", "1.0.0+", "1.0.0\n"):
        assert not re.fullmatch(VERSION_PATTERN, version), version
        with pytest.raises(LaunchOverrideRefused):
            from streamops.launch_overrides import checked_version

            checked_version(version)
    assert [is_dry_run(p) for p in ({}, {"dry_run": True}, {"dry_run": 0}, {"dry_run": "false"}, {"dry_run": None},
                                    {"dry_run": False})] == [True, True, True, True, True, False]
