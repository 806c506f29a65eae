"""An approval given while its task's parked process is still exiting is applied, not failed.

Airflow 3.3's scheduler fails a resumed approval when the late exit report of its parked process
arrives while the resumed attempt runs (apache/airflow#72716; streamops.airflow_executor says how
and why). On this machine the parked process's end comes up to 5 s late now and then, and an
operator who approved within that time lost the run (CI saw it once in the browser test).

Here the test decides the order of events, on a real scheduler, API server and DAG processor with
its own DAG folder (tests/airflow_dags): once with streamops' LocalExecutor, the one every stack
runs, and once with Airflow's own, which shows that the race is real.
"""

from __future__ import annotations

import re

from streamops.local_stack.airflow_api import AirflowApi
from streamops.local_stack.airflow_stack import LOCAL_EXECUTOR, LocalAirflow
from streamops.waiting import poll_until
from tests.support import PROJECT_ROOT
from tests.support.ports import free_port

DAG_ID = "approval_race"
GATES = ("parked-may-exit", "resumed-may-finish")


def approved_while_the_parked_process_exits(tmp_path, executor: str) -> tuple[str, dict[str, str], str, str]:
    """Trigger, approve at once, let the parked process end only while the resumed attempt runs:
    (run state, task states, the run's report, the scheduler's log)."""
    gates = tmp_path / "gates"
    gates.mkdir()
    stack = LocalAirflow(home=tmp_path / "airflow", port=free_port(), extra_env={
        "AIRFLOW__CORE__DAGS_FOLDER": str(PROJECT_ROOT / "tests" / "airflow_dags"),
        "AIRFLOW__CORE__EXECUTOR": executor,
        # A parked process whose output stays open is waited for this long (default 60 s): the
        # test, not a timeout, says when it ends, however slow the machine is.
        "AIRFLOW__WORKERS__SOCKET_CLEANUP_TIMEOUT": "900",
        "APPROVAL_RACE_GATES": str(gates),
    })
    stack.init()
    stack.start()
    try:
        api = AirflowApi(stack.url, "admin", stack.admin_password())
        scheduler_log = stack.processes["scheduler"].log_file
        api.wait_for_dag(DAG_ID, timeout=300)
        run_id = api.trigger(DAG_ID, {})
        poll_until(lambda: api.task_states(DAG_ID, run_id).get("approve") == "awaiting_input", timeout=600,
                   what="the approval to wait for input")
        # Approved at once, as a quick operator or a script does: the parked process has not ended.
        answer = api.client.patch(f"/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances/approve/-1/hitlDetails",
                                  json={"chosen_options": ["Approve"], "params_input": {}})
        assert answer.status_code == 200, answer.text
        poll_until(lambda: (gates / "resumed").exists(), timeout=600, what="the approval to resume")
        assert api.task_states(DAG_ID, run_id)["approve"] == "running"

        # The parked process ends; the scheduler reads its late report while the resumed attempt runs.
        (gates / "parked-may-exit").touch()
        late_report = re.compile(rf"TaskInstance Finished: dag_id={DAG_ID}, task_id=approve, .*, state=running, ")
        poll_until(lambda: late_report.search(scheduler_log.read_text(errors="replace")), timeout=600,
                   what="the scheduler to read the parked process's late report")
        (gates / "resumed-may-finish").touch()
        state = api.wait_for_run(DAG_ID, run_id, timeout=600)
        return state, api.task_states(DAG_ID, run_id), api.run_report(DAG_ID, run_id), scheduler_log.read_text(errors="replace")
    finally:
        for name in GATES:  # never leave a waiting task process behind
            (gates / name).touch()
        stack.stop()


def test_an_approval_given_while_the_parked_process_exits_is_applied(tmp_path):
    state, tasks, report, _ = approved_while_the_parked_process_exits(tmp_path, LOCAL_EXECUTOR)
    assert (state, tasks) == ("success", {"approve": "success", "apply": "success"}), report


def test_airflows_own_local_executor_still_fails_that_approval(tmp_path):
    """When this fails, Airflow has fixed the race: streamops.airflow_executor (and this test) can go."""
    state, tasks, report, scheduler_log = approved_while_the_parked_process_exits(tmp_path, "LocalExecutor")
    assert (state, tasks) == ("failed", {"approve": "failed", "apply": "upstream_failed"}), report
    assert re.search(rf"{DAG_ID}\.approve .*finished with state success, but the task instance's state attribute is running",
                     scheduler_log)
