"""The message browser's pages without a broker: what a selection turns into (the recovery DAGs'
conf), what is refused, and that nothing a record holds becomes markup or script."""

from __future__ import annotations

import json
import re

import pytest

from streamops.catalog import load_catalog
from streamops.message_browser import BrowseError, BrowseQuery, BrowseResult, Shown, ShownDeadLetter, ShownRecord, show_bytes
from streamops.messages_page import (
    REPLAY_DAG,
    SKIP_DAG,
    plan_conf,
    record_specs,
    render_browser,
    render_plan_form,
    script_json,
)

CATALOG = load_catalog(check_programs=False)
HOSTILE = "</script><script>alert(1)</script><img src=x onerror=alert(2)>"


def test_a_selection_becomes_runs_of_offsets():
    assert record_specs("oplog.operations", 3, [9, 1, 2, 3, 5, 2]) == [
        "oplog.operations:3:1-3", "oplog.operations:3:5", "oplog.operations:3:9"]


def test_the_skip_and_replay_forms_are_filled_in_and_wait_for_approval():
    selection = {"app": "oplog-router", "records": "oplog.operations:3:1207,oplog.operations:3:9-12"}
    assert plan_conf(CATALOG, SKIP_DAG, selection) == {
        "app": "oplog-router", "records": ["oplog.operations:3:1207", "oplog.operations:3:9-12"], "note": None,
        "dry_run": False, "approve_in_ui": True}
    assert plan_conf(CATALOG, REPLAY_DAG, {"app": "oplog-router", "reason": "value is not JSON"}) == {
        "app": "oplog-router", "reason_contains": "value is not JSON", "start": "earliest", "end": "now",
        "dry_run": False, "approve_in_ui": True}


@pytest.mark.parametrize("dag_id, form, error", [
    ("recover_reset_offsets", {"app": "oplog-router"}, "dag: the browser fills the forms of recover_skip_records, "
                                                       "recover_replay_dead_letters, not 'recover_reset_offsets'"),
    (SKIP_DAG, {"app": "nope", "records": "a:0:1"}, "app: 'nope' is not a catalog app"),
    (SKIP_DAG, {"app": "oplog-router", "records": "a:0:1,a;rm -rf:0:1"}, "(not: a;rm -rf:0:1)"),
    (SKIP_DAG, {"app": "oplog-router"}, "records: 0 given"),
])
def test_a_plan_form_refuses_what_the_dag_would_refuse(dag_id, form, error):
    with pytest.raises(BrowseError) as refused:
        plan_conf(CATALOG, dag_id, form)
    assert error in str(refused.value)


def test_values_are_shown_pretty_masked_or_cut_and_never_as_markup():
    assert show_bytes(b'{"user_id":"u1","event":{"user_id":"u1","n":1}}', ["user_id", "event.user_id"]) == Shown(
        "json", '{\n  "user_id": "•••",\n  "event": {\n    "user_id": "•••",\n    "n": 1\n  }\n}', 47,
        masked=["user_id", "event.user_id"])
    assert show_bytes(b'"u1"', ["user_id"]).kind == "masked"  # JSON, but no object to mask a field of
    assert show_bytes(b"\xff" * 10, max_chars=9).text == "ff ff ff… (cut: 10 bytes in all)"
    result = BrowseResult(
        topic="oplog.router.dead-letters", partition=0, partitions=6, low=0, high=1, start=0, next_offset=1, scanned=1,
        records=[ShownRecord(0, 0, "t", show_bytes(HOSTILE.encode()), [("h", show_bytes(HOSTILE.encode()))],
                             show_bytes(HOSTILE.encode()),
                             ShownDeadLetter(HOSTILE, "oplog-router", "1", "t", "s/0/1", "s", 0, 1, "t",
                                             show_bytes(b"k"), show_bytes(HOSTILE.encode()), "inline"))],
        notes=[HOSTILE], sensitive_masked=False, dead_letter_of="oplog-router", readers=[])
    page = render_browser(CATALOG, {"topic": HOSTILE}, result, HOSTILE)
    assert "<script>alert" not in page and "<img" not in page and "&lt;/script&gt;" in page


def test_a_sensitive_field_is_masked_in_every_array_item_and_inside_json_carried_as_text():
    batch = {"users": [{"user_id": "u1"}, {"name": "n"}, [{"user_id": "u2"}], '{"user_id": "u5"}', "u6"],
             "payload": '{"user_id": "u3", "seq": 7, "user_id": "u7"}', "note": "user_id u4 in prose", "other": "kept"}
    shown = show_bytes(json.dumps(batch).encode(), ["users.user_id", "payload.user_id", "note.user_id", "absent.user_id"])
    assert shown.kind == "json" and shown.masked == ["users.user_id", "payload.user_id", "note.user_id"]
    # Through arrays and JSON in strings (a duplicate key's dropped copy is not shown either); a value
    # the path reaches but cannot go through (prose, an array's bare item) is masked whole.
    assert json.loads(shown.text) == {
        "users": [{"user_id": "•••"}, {"name": "n"}, [{"user_id": "•••"}], '{"user_id": "•••"}', "•••"],
        "payload": '{"user_id": "•••", "seq": 7}', "note": "•••", "other": "kept"}
    assert not re.search(r"u[1-7]\b", shown.text)
    # A top-level array of records, each masked; an array with a bare value in it is masked whole.
    assert json.loads(show_bytes(b'[{"user_id":"u1"},{"user_id":"u2"}]', ["user_id"]).text) == [
        {"user_id": "•••"}, {"user_id": "•••"}]
    assert show_bytes(b'[{"user_id":"u1"},"u2"]', ["user_id"]).kind == "masked"
    assert show_bytes(b'{"payload": "{not json"}', ["payload.user_id"]).text == '{\n  "payload": "•••"\n}'
    assert show_bytes(b'{"n": 1}', ["payload.user_id"]).masked == []  # the field is not there: nothing to mask


def test_a_plan_form_embeds_its_conf_as_data_and_only_for_a_role_that_may_trigger():
    conf = plan_conf(CATALOG, REPLAY_DAG, {"app": "oplog-router", "reason": HOSTILE})
    page = render_plan_form(REPLAY_DAG, conf, True, "operator")
    script = re.search(r"<script>(.*)</script>", page, re.S).group(1)
    assert "</script>" not in script and "<" not in script.split("var conf=", 1)[1].split(";", 1)[0]
    assert json.loads(script_json(conf)) == conf
    assert "fetch('/api/v2/dags/recover_replay_dead_letters/dagRuns'" in script
    refused = render_plan_form(REPLAY_DAG, conf, False, "viewer")
    assert "<script>" not in refused and "Your role (viewer) may not trigger recover_replay_dead_letters" in refused


def test_a_query_string_is_read_with_empty_fields_absent():
    assert BrowseQuery.from_form({"topic": "t", "offset": "", "partition": "2"}).model_dump(exclude_defaults=True) == {
        "topic": "t", "partition": 2}
    with pytest.raises(BrowseError, match=r"^partition: Input should be a valid integer"):
        BrowseQuery.from_form({"topic": "t", "partition": "x"})


def test_every_route_of_the_operator_pages_asks_for_a_login():
    """A route whose login dependency FastAPI cannot resolve (a postponed annotation naming a local
    import) would serve its page to anyone, reading `user` as a query parameter instead."""
    from fastapi.routing import APIRoute

    from streamops.apps_page import add_apps_page
    from streamops.messages_page import add_messages_page
    from streamops.metrics import metrics_app
    from streamops.state_page import add_state_page

    app = metrics_app()
    add_apps_page(app)
    add_messages_page(app)
    add_state_page(app)
    routes = [r for r in app.routes if isinstance(r, APIRoute)]
    assert {r.path for r in routes} >= {"/apps", "/messages", "/messages.json", "/messages/plan/{dag_id}",
                                        "/apps/{name}/state", "/apps/{name}/state.json"}
    for route in routes:
        assert route.dependant.dependencies, f"{route.path} has no login dependency"
        assert not {"user", "request", "_user"} & {q.name for q in route.dependant.query_params}, route.path


def test_a_reason_shown_to_a_masked_reader_keeps_field_names_and_rules_and_no_value():
    from streamops.message_browser import MASK, mask_reason

    assert mask_reason("field 'op_type': 'NO_SUCH_OP' is not one of the allowed values", {"op_type"}) == (
        f"field 'op_type': {MASK} is not one of the allowed values")
    assert mask_reason("key 'u3' does not equal field 'user_id' 'u4' (input contract key: the catalog keys this input by "
                       "field 'user_id')", {"user_id"}) == (
        f"key {MASK} does not equal field 'user_id' {MASK} (input contract key: the catalog keys this input by field "
        "'user_id')")
    # A value with a quote in it, or a number: the sentence goes, the rule stays.
    for reason in ("field 'user_id': 'o'neil' is too long (input contract pattern)", "field 'age' is 16, below 18"):
        assert mask_reason(reason, {"user_id", "age"}).startswith(f"{MASK} (the reason quotes the record)")
    assert mask_reason("value is not valid JSON (input contract json: RFC 8259)", set()) == (
        "value is not valid JSON (input contract json: RFC 8259)")
