"""The router's routing, reconciled per record: what its input says must be routed, what its
outputs hold, and a wait until every expected route is there.

`kafka` is a client config (`broker.client_config`, a cluster's admin config)."""

from __future__ import annotations

from collections import Counter
from typing import NamedTuple

from spark_apps.oplog_router import routes
from streamops.kafka_records import read_all
from streamops.waiting import poll_until

Route = tuple[str, str]  # (event_id, category)


def expected_routes(kafka, router) -> set[Route]:
    """(event_id, category) for every routable record now in the router's input."""
    table = routes(router)
    return {(f"{r.topic}/{r.partition}/{r.offset}", category)
            for r in read_all(kafka, router.inputs["operations"]) for category, _ in table.get(r.json()["op_type"], [])}


def routed(kafka, router) -> list[Route]:
    """(event_id, category) of every record in the router's outputs, duplicates included."""
    return [(r.json()["event_id"], r.json()["category"]) for topic in router.outputs.values() for r in read_all(kafka, topic)]


class AllRouted(NamedTuple):
    expected: set[Route]
    got: list[Route]

    @property
    def duplicates(self) -> int:
        """Output records beyond the first of each route (at-least-once's price)."""
        return sum(n - 1 for n in Counter(self.got).values())


def wait_until_all_routed(kafka, router, timeout: float = 180,
                          what: str = "every input record in the router's output") -> AllRouted:
    """Poll until every expected route is in the outputs. Fails if an output record is not
    explained by the input."""
    expected = expected_routes(kafka, router)
    got: list[Route] = []

    def complete() -> bool:
        got[:] = routed(kafka, router)
        return expected <= set(got)

    poll_until(complete, timeout=timeout, what=what, max_interval=2)
    assert set(got) - expected == set(), "output records that no input explains"
    return AllRouted(expected, list(got))


def routed_except(kafka, router, skipped: set[str], timeout: float = 240) -> tuple[set[Route], Counter]:
    """Poll until every routable input record but `skipped` is in the outputs; (expected, got)."""
    expected = {pair for pair in expected_routes(kafka, router) if pair[0] not in skipped}
    got: Counter = Counter()

    def complete() -> bool:
        got.clear()
        got.update(routed(kafka, router))
        return expected <= set(got)

    poll_until(complete, timeout=timeout, what="every record but the skipped one in the router's output", max_interval=2)
    return expected, got
