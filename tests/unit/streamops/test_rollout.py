"""The rollout's pure decisions: the order apps roll in, and what makes a new plan incompatible
with a running query's checkpoint. Rolls on real drivers: tests/test_rolling_restart.py."""

from __future__ import annotations

import yaml

from streamops.catalog import load_catalog
from streamops.rollout import dependency_order, incompatibilities


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


def test_incompatibilities_name_the_changed_operator():
    assert incompatibilities({"q": ["Aggregate [a]"]}, {"q": ["Aggregate [a]"], "new": ["x"]}) == []
    assert incompatibilities({"q": ["Aggregate [a]"]}, {"q": ["Aggregate [b]"]}) == [
        "query 'q' changes its stateful operators:\n    - Aggregate [a]\n    + Aggregate [b]"
    ]
    assert incompatibilities({"gone": ["x"]}, {}) == [
        "query 'gone' is gone from the new version (its checkpoint would be orphaned)"
    ]
