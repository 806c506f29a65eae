"""The router's routing, reconciled per record: what its input says must be routed, what its
outputs hold, and a wait until every expected route is there (shared by the cluster tests)."""

from __future__ import annotations

from spark_apps.oplog_router import routes
from streamops.kafka_records import read_all
from streamops.waiting import poll_until


def expected_routes(kafka, router) -> set[tuple[str, str]]:
    """(event_id, category) for every routable record now in the router's input."""
    table = routes(router)
    return {(f"{r.topic}/{r.partition}/{r.offset}", category)
            for r in read_all(kafka, router.inputs["operations"]) for category, _ in table.get(r.json()["op_type"], [])}


def routed(kafka, router) -> list[tuple[str, str]]:
    """(event_id, category) of every record in the router's outputs, duplicates included."""
    return [(r.json()["event_id"], r.json()["category"]) for topic in router.outputs.values() for r in read_all(kafka, topic)]


def wait_until_all_routed(kafka, router, timeout: float, what: str) -> tuple[set[tuple[str, str]], list[tuple[str, str]]]:
    """Poll until every expected route is in the outputs; (expected, routed). Fails if an output
    record is not explained by the input."""
    expected = expected_routes(kafka, router)
    got: list[tuple[str, str]] = []

    def complete() -> bool:
        got[:] = routed(kafka, router)
        return expected <= set(got)

    poll_until(complete, timeout=timeout, what=what)
    assert set(got) == expected, "a routed record that no input explains"
    return expected, got
