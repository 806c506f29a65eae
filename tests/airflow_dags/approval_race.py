"""The DAG of tests/test_approval_race.py (this folder is the DAG folder of that test's own
Airflow): an approval approved while its parked process is still exiting.

The test holds each step open with gate files in $APPROVAL_RACE_GATES, so the order of events is
the test's, not the machine's speed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from airflow.providers.standard.operators.hitl import ApprovalOperator
from airflow.sdk import dag, task

from streamops.waiting import poll_until

# A child that waits for a file, holding the output it inherits from the task's process.
WAIT_FOR_FILE = ("import pathlib, sys, time\n"
                 "deadline = time.monotonic() + 600\n"
                 "while not pathlib.Path(sys.argv[1]).exists() and time.monotonic() < deadline:\n"
                 "    time.sleep(0.2)\n")


def gate(name: str) -> Path:
    return Path(os.environ["APPROVAL_RACE_GATES"]) / name


class LingeringApproval(ApprovalOperator):
    """Parks like any approval, but its process's output stays open until the test releases it:
    the worker reports the parked process's end only then (what a slow exit does by chance). The
    resumed attempt says it runs, then waits for the test."""

    def execute(self, context):
        subprocess.Popen([sys.executable, "-c", WAIT_FOR_FILE, str(gate("parked-may-exit"))])
        return super().execute(context)

    def execute_complete(self, context, event):
        gate("resumed").touch()
        poll_until(gate("resumed-may-finish").exists, timeout=600, what="the test to let the resumed attempt finish")
        return super().execute_complete(context, event)


@dag(dag_id="approval_race", schedule=None)
def approval_race():
    @task
    def apply() -> str:
        return "applied"

    LingeringApproval(task_id="approve", subject="Apply?", body="the plan", defaults="Reject", retries=0) >> apply()


approval_race()
