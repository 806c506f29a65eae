"""A small client for the Airflow 3 REST API (/api/v2), as an operator's script would use it."""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import UTC, datetime

import httpx

from streamops.timestamps import file_stamp, iso_seconds_utc
from streamops.waiting import DeadlineExceeded, poll_until

_FINISHED = {"success", "failed"}


class AirflowApiError(RuntimeError):
    pass


@dataclass
class AirflowApi:
    url: str
    username: str
    password: str

    def __post_init__(self) -> None:
        response = httpx.post(
            f"{self.url}/auth/token", json={"username": self.username, "password": self.password}, timeout=30
        )
        if response.status_code >= 400:
            raise AirflowApiError(f"login to {self.url} as {self.username!r} failed: {response.status_code} {response.text}")
        token = response.json()["access_token"]
        self.client = httpx.Client(base_url=f"{self.url}/api/v2", headers={"Authorization": f"Bearer {token}"}, timeout=30)

    def answer_approval(self, dag_id: str, run_id: str, option: str = "Approve", task_id: str = "approve") -> httpx.Response:
        """Answer a run's approval (Airflow's human-in-the-loop request) as this user."""
        return self.client.patch(f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/-1/hitlDetails",
                                 json={"chosen_options": [option], "params_input": {}})

    def _get(self, path: str, **params) -> httpx.Response:
        return self.client.get(path, params=params)

    def import_errors(self) -> list[dict]:
        return self._get("/importErrors").json().get("import_errors", [])

    def wait_for_dag(self, dag_id: str, timeout: float = 120) -> dict:
        """Wait until the DAG processor has parsed `dag_id`; fail early on its import error."""

        def parsed():
            errors = [e for e in self.import_errors() if dag_id in e.get("filename", "")]
            if errors:
                raise AirflowApiError(f"DAG file for {dag_id} failed to import:\n{errors[0].get('stack_trace')}")
            response = self._get(f"/dags/{dag_id}")
            return response.json() if response.status_code == 200 else None

        try:
            return poll_until(parsed, timeout=timeout, what=f"the DAG processor to parse {dag_id}", max_interval=1)
        except DeadlineExceeded as exc:
            raise AirflowApiError(f"{exc}; see the dag-processor log") from None

    def trigger(self, dag_id: str, conf: dict, attempts: int = 5) -> str:
        """Create a DAG run. The embedded SQLite database answers 500 "database is locked" while
        the scheduler writes: retry with the same run id, so a retry never makes a second run."""
        now = datetime.now(UTC)
        run_id = f"streamops__{file_stamp(now)}"
        # run_after in whole seconds: on SQLite the scheduler compares it with CURRENT_TIMESTAMP,
        # which has none, and would leave a run made at 12:00:00.7 waiting until 12:00:01.
        body = {"dag_run_id": run_id, "conf": conf, "logical_date": None, "run_after": iso_seconds_utc(now),
                "note": "triggered by streamops up"}
        for attempt in range(1, attempts + 1):
            response = self.client.post(f"/dags/{dag_id}/dagRuns", json=body)
            if response.status_code < 400 or response.status_code == 409:  # 409: an earlier try got in
                return run_id
            if response.status_code < 500 or attempt == attempts:
                raise AirflowApiError(f"triggering {dag_id} failed: {response.status_code} {response.text}")
            time.sleep(attempt)  # back off before retrying a server error
        raise AssertionError("unreachable")

    def run_state(self, dag_id: str, run_id: str) -> str | None:
        return self._get(f"/dags/{dag_id}/dagRuns/{run_id}").json().get("state")

    def wait_for_run(self, dag_id: str, run_id: str, timeout: float = 600) -> str:
        def finished():
            state = self.run_state(dag_id, run_id)
            return state if state in _FINISHED else None

        return poll_until(finished, timeout=timeout, what=f"{dag_id} run {run_id} to finish", max_interval=1)

    def runs(self, dag_id: str, run_type: str | None = None) -> list[dict]:
        """The DAG's runs (of one type: manual, scheduled, asset_triggered...), oldest first."""
        body = self._get(f"/dags/{dag_id}/dagRuns", order_by="run_after", limit=100).json()
        return [run for run in body.get("dag_runs", []) if run_type is None or run.get("run_type") == run_type]

    def task_states(self, dag_id: str, run_id: str) -> dict[str, str]:
        body = self._get(f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances").json()
        return {ti["task_id"]: ti["state"] for ti in body.get("task_instances", [])}

    def xcom(self, dag_id: str, run_id: str, task_id: str, key: str = "return_value"):
        response = self._get(f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/xcomEntries/{key}")
        if response.status_code != 200:
            return None
        return response.json().get("value")

    def task_instances(self, dag_id: str, run_id: str) -> list[dict]:
        """Every task instance of a run (mapped ones one per index): state, hostname, map_index..."""
        return self._get(f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances").json().get("task_instances", [])

    def task_log(self, dag_id: str, run_id: str, task_id: str, map_index: int = -1, try_number: int = 1) -> str:
        """A task's log as text (the events of Airflow 3's structured log, one per line)."""
        response = self._get(f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/logs/{try_number}",
                             map_index=map_index, full_content=True)
        if response.status_code != 200:
            raise AirflowApiError(
                f"reading the log of {dag_id}.{task_id} ({run_id}) failed: {response.status_code} {response.text}"
            )
        lines = []
        for item in response.json().get("content") or []:
            if not isinstance(item, dict):
                lines.append(str(item))
                continue
            lines.append(str(item.get("event", "")))
            # A failure's exception travels beside the event, not in it.
            lines += [f"{e.get('exc_type')}: {e.get('exc_value')}" for e in item.get("error_detail") or [] if isinstance(e, dict)]
        return "\n".join(lines)

    def run_report(self, dag_id: str, run_id: str, tail_lines: int = 25) -> str:
        """A run's task states, then the last lines of each failed task's log: why a run did not
        succeed, for a message that must say so without a trip to the UI."""
        instances = self.task_instances(dag_id, run_id)
        report = [f"{dag_id} run {run_id}, tasks: " + ", ".join(f"{ti['task_id']} {ti['state']}" for ti in instances)]
        for ti in instances:
            if ti["state"] != "failed":
                continue
            try:
                lines = self.task_log(dag_id, run_id, ti["task_id"], ti.get("map_index", -1),
                                      ti.get("try_number") or 1).splitlines()
            except AirflowApiError as exc:
                lines = [str(exc)]
            report.append(f"last lines of {ti['task_id']}'s log:\n" + "\n".join(lines[-tail_lines:]))
        return "\n".join(report)

    def unpause(self, dag_id: str) -> None:
        self.client.patch(f"/dags/{dag_id}", json={"is_paused": False})


