"""Every driver's history: Spark event logs and the History Server that reads them.

Every driver and backfill the suite launches writes its event log (spark_submit.submit_spec:
rolling files, so a driver that runs for weeks keeps bounded files), into one folder beside the
checkpoints (`$STREAMOPS_SPARK_EVENT_LOG_DIR`, default `<checkpoint root>/_spark-events`). The
History Server (`streamops up` starts one on the local stack and the cluster profile; compose
runs one) serves them, crashed drivers included: a driver whose JVM is killed leaves its log in
progress, which the server lists as incomplete with every job and stage up to the kill. It
also keeps the folder bounded (its cleaner: logs older than HISTORY_MAX_AGE go).

The apps page lists each app's past drivers from the server's REST API (`/api/v1/applications`,
its own names: `streamops-<app>`) and links each one.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from streamops import settings
from streamops.catalog import checkpoint_root

log = logging.getLogger(__name__)

DEFAULT_HISTORY_PORT = 18180
# Spark's smallest rolling size is 10 MiB; older files are compacted by the server.
EVENT_LOG_FILE_SIZE = "16m"
HISTORY_MAX_AGE = "7d"
HISTORY_FILES_KEPT = 4  # per driver, once rolled (the server compacts the older ones)
APPS_LISTED = 200  # the newest drivers the apps page reads from the server
PAST_DRIVERS_SHOWN = 5


def event_log_location() -> str:
    """Where drivers write event logs: the setting as given (a URI such as hdfs://... stays one),
    else `<checkpoint root>/_spark-events` as an absolute local path."""
    given = settings.SPARK_EVENT_LOG_DIR.get()
    if given and "://" in given:
        return given
    return str(Path(given).absolute() if given else checkpoint_root().absolute() / "_spark-events")


def event_log_dir() -> Path | None:
    """The event log folder on this host (None: the logs are on a remote file system, a URI)."""
    location = event_log_location()
    return None if "://" in location else Path(location)


def event_log_uri() -> str:
    location = event_log_location()
    return location if "://" in location else Path(location).as_uri()


def event_log_conf() -> dict[str, str]:
    """The Spark conf every launch gets (an app's catalog spark_conf may still change it). A local
    folder that cannot be made leaves event logs off with a warning: no history is better than no
    launch."""
    location = event_log_location()
    if "://" not in location:
        try:
            Path(location).mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            log.warning("Spark event logs are off for this launch: %s cannot be made (%s); set "
                        "STREAMOPS_SPARK_EVENT_LOG_DIR to a folder every driver host can write", location, exc)
            return {}
    return {
        "spark.eventLog.enabled": "true",
        "spark.eventLog.dir": event_log_uri(),
        "spark.eventLog.rolling.enabled": "true",
        "spark.eventLog.rolling.maxFileSize": EVENT_LOG_FILE_SIZE,
    }


def history_port() -> int:
    text = settings.SPARK_HISTORY_PORT.get()
    return int(text) if text and text.isdigit() else DEFAULT_HISTORY_PORT


def history_url() -> str:
    return (settings.SPARK_HISTORY_URL.get() or f"http://127.0.0.1:{history_port()}").rstrip("/")


@dataclass(frozen=True)
class PastDriver:
    """One driver (an application) as the History Server has it."""

    application_id: str
    started: str | None
    ended: str | None  # None: its log never ended (running, or crashed without a word)
    completed: bool
    link: str  # its jobs page on the server

    def to_json(self) -> dict[str, Any]:
        return {"application_id": self.application_id, "started": self.started, "ended": self.ended,
                "completed": self.completed, "link": self.link}


def past_drivers(base: str | None = None, timeout_s: float = 3.0) -> dict[str, list[PastDriver]]:
    """App name -> its drivers the History Server knows, newest first ({}: the server did not
    answer; the page says so). Two requests for every app: the unfinished logs (running drivers,
    crashed ones), then the newest APPS_LISTED finished ones (the server sorts by end time, so one
    capped list would leave the unfinished out). An entry that is not what the REST API documents
    is skipped."""
    url = base or history_url()
    listed: list[Any] = []
    try:
        lists: tuple[dict[str, str | int], ...] = ({"status": "running"}, {"status": "completed", "limit": APPS_LISTED})
        for params in lists:
            answer = httpx.get(f"{url}/api/v1/applications", params=params, timeout=timeout_s)
            answer.raise_for_status()
            page = answer.json()
            listed += page if isinstance(page, list) else []
    except (httpx.HTTPError, ValueError):
        return {}
    drivers: dict[str, dict[str, PastDriver]] = {}
    for application in listed:
        driver = _past_driver(url, application)
        if driver is not None:
            drivers.setdefault(driver[0], {})[driver[1].application_id] = driver[1]
    return {app: sorted(found.values(), key=lambda d: d.started or "", reverse=True) for app, found in drivers.items()}


def _past_driver(url: str, application: Any) -> tuple[str, PastDriver] | None:
    if not isinstance(application, dict):
        return None
    name, app_id, attempts = application.get("name"), application.get("id"), application.get("attempts")
    if not (isinstance(name, str) and name.startswith("streamops-") and isinstance(app_id, str)
            and re.fullmatch(r"[A-Za-z0-9_.\-]+", app_id) and isinstance(attempts, list) and attempts
            and isinstance(attempts[0], dict)):
        return None
    last = attempts[0]
    started, ended = last.get("startTime"), last.get("endTime")
    completed = last.get("completed") is True
    return name.removeprefix("streamops-"), PastDriver(
        app_id, started if isinstance(started, str) else None, ended if completed and isinstance(ended, str) else None,
        completed, f"{url}/history/{app_id}/jobs/")


_APPLICATION_ID = re.compile(r"[A-Za-z0-9_.\-]+")


def failed_batch_job(application_id: str | None, query_name: str, batch: int, base: str | None = None,
                     timeout_s: float = 3.0) -> str | None:
    """The History Server's page of the job `query_name`'s batch `batch` failed in (None: the
    server has no such failed job yet, or did not answer). Spark describes each streaming job as
    "<query name>\\nid = ...\\nrunId = ...\\nbatch = <N>"; a retried batch's last job is the one."""
    if not application_id or not _APPLICATION_ID.fullmatch(application_id):
        return None
    url = base or history_url()
    try:
        answer = httpx.get(f"{url}/api/v1/applications/{application_id}/jobs", params={"status": "failed"},
                           timeout=timeout_s)
        answer.raise_for_status()
        jobs = answer.json()
    except (httpx.HTTPError, ValueError):
        return None
    found = [job["jobId"] for job in (jobs if isinstance(jobs, list) else [])
             if isinstance(job, dict) and isinstance(job.get("jobId"), int)
             and _describes(job.get("description"), query_name, batch)]
    return f"{url}/history/{application_id}/jobs/job/?id={max(found)}" if found else None


def _describes(description: object, query_name: str, batch: int) -> bool:
    if not isinstance(description, str):
        return False
    lines = [line.strip() for line in description.strip().splitlines()]
    return bool(lines) and lines[0] == query_name and f"batch = {batch}" in lines


def driver_link(application_id: str | None) -> str | None:
    """The driver's jobs on the History Server, when its event log is there (None: a driver from
    before event logs, or one whose log the cleaner removed). Logs on a remote file system are
    taken to be there."""
    if not application_id:
        return None
    folder = event_log_dir()
    logged = folder is None or (folder.is_dir() and any(
        p.name.removeprefix("eventlog_v2_").startswith(application_id) for p in folder.iterdir()))
    return f"{history_url()}/history/{application_id}/jobs/" if logged else None
