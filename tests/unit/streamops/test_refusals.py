"""streamops.refusals: one type for every refusal, each keeping the words its operators know."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from pathlib import Path

import pytest

import streamops
from streamops.app_runtime import AlreadyRunningError, OperationInProgress
from streamops.catalog import CatalogError
from streamops.launch_overrides import LaunchOverrideRefused
from streamops.plans import PlanMismatch
from streamops.programs import ProgramError
from streamops.quality.ranges import RangeError
from streamops.recovery.common import RecoveryRefused
from streamops.refusals import OneLineRefused, Refused, says_refused
from streamops.reprocess import ReprocessRefused
from streamops.rollout import RolloutRefused


def test_each_refusal_reads_as_before_and_says_refused_to_the_operator():
    texts = {
        RecoveryRefused(["app 'x' is not in the catalog", "shift 0 must be non-zero"]):
            ("refused before anything was changed:\n  - app 'x' is not in the catalog\n  - shift 0 must be non-zero", None),
        ReprocessRefused(["end before start"]):
            ("the reprocessing request was refused before anything was changed:\n  - end before start", None),
        RangeError(["last_records 0 must be at least 1"]):
            ("the validation range was refused before reading anything:\n  - last_records 0 must be at least 1", None),
        CatalogError(Path("/c.yaml"), ["a", "b"]): ("catalog /c.yaml is invalid (2 problems):\n  - a\n  - b",
                                                    "refused: catalog /c.yaml is invalid (2 problems):\n  - a\n  - b"),
        LaunchOverrideRefused(["key a is not allowed", "key b is not allowed"]):
            ("key a is not allowed; key b is not allowed", "refused: key a is not allowed; key b is not allowed"),
        RolloutRefused("oplog-router is stateful"):
            ("oplog-router is stateful", "rolling restart refused: oplog-router is stateful"),
        ProgramError("no artifact acme 1.0.0"): ("no artifact acme 1.0.0", "refused: no artifact acme 1.0.0"),
        AlreadyRunningError("x is already running"): ("x is already running", "refused: x is already running"),
        OperationInProgress("x is being changed by another run"):
            ("x is being changed by another run", "refused: x is being changed by another run"),
        PlanMismatch(["RestartPlan without lag"]):
            ("the plan this task received is not one the plan task makes: RestartPlan without lag",
             "refused: the plan this task received is not one the plan task makes: RestartPlan without lag"),
    }
    for refusal, (text, operator_text) in texts.items():
        assert isinstance(refusal, Refused) and isinstance(refusal, ValueError)
        assert str(refusal) == text
        assert refusal.operator_text() == (operator_text or text)
        assert refusal.problems and all(p in text for p in refusal.problems)
    # The ones other code caught as RuntimeError still are.
    assert all(issubclass(kind, RuntimeError) for kind in (RolloutRefused, AlreadyRunningError, OperationInProgress))


def test_a_refusal_keeps_every_problem_and_a_single_text_is_one_problem():
    assert RecoveryRefused(["a", "b"]).problems == ["a", "b"]
    assert OneLineRefused("only this").problems == ["only this"]
    assert Refused(("a", 2)).problems == ["a", "2"]


def test_only_a_message_that_opens_by_saying_so_is_a_refusal():
    assert says_refused("refused: x") and says_refused("rolling restart refused: x")
    assert says_refused("refused before anything was changed:\n  - x")
    assert not says_refused("[Errno 111] Connection refused")
    assert not says_refused("rolling restart failed: the new version crashed")


def test_every_refusal_class_of_the_package_is_a_refused():
    """The class, not the examples: anything named like a refusal, anywhere in the package."""
    import spark_apps

    named_like_refusals = []
    modules = [*pkgutil.walk_packages(streamops.__path__, "streamops."),
               *pkgutil.walk_packages(spark_apps.__path__, "spark_apps.")]
    for module in modules:
        if module.name.endswith("entrypoints.driver"):
            continue  # a script: importing it would start a driver
        loaded = importlib.import_module(module.name)
        for name, value in vars(loaded).items():
            if inspect.isclass(value) and issubclass(value, BaseException) and value.__module__ == module.name \
                    and ("Refused" in name or name in ("CatalogError", "RangeError", "ProgramError", "PlanMismatch")):
                named_like_refusals.append(value)
    assert len(named_like_refusals) >= 8
    assert [kind.__name__ for kind in named_like_refusals if not issubclass(kind, Refused)] == []


@pytest.mark.parametrize("kind", [RecoveryRefused, ReprocessRefused, RangeError, LaunchOverrideRefused])
def test_problems_are_plain_strings_whatever_was_passed(kind):
    assert kind([Path("/x"), 3]).problems == ["/x", "3"]
