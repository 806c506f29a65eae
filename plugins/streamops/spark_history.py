"""Every driver's history: Spark event logs and the History Server that reads them.

Every driver and backfill the suite launches writes its event log (spark_submit.submit_spec:
rolling files, so a driver that runs for weeks keeps bounded files), into one folder beside the
checkpoints (`$STREAMOPS_SPARK_EVENT_LOG_DIR`, default `<checkpoint root>/_spark-events`). The
History Server (`streamops up` starts one on the local stack and the cluster profile; compose
runs one) serves them, crashed drivers included: a driver killed mid-batch leaves its log
in progress, which the server lists as incomplete with every job and stage up to the kill. It
also keeps the folder bounded (its cleaner: logs older than HISTORY_MAX_AGE go).

The apps page lists each app's past drivers from the server's REST API (`/api/v1/applications`,
its own names: `streamops-<app>`) and links each one.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from streamops import settings
from streamops.catalog import checkpoint_root

DEFAULT_HISTORY_PORT = 18180
# Spark's smallest rolling size is 10 MiB; older files are compacted by the server.
EVENT_LOG_FILE_SIZE = "16m"
HISTORY_MAX_AGE = "7d"
HISTORY_FILES_KEPT = 4  # per driver, once rolled (the server compacts the older ones)
APPS_LISTED = 200  # the newest drivers the apps page reads from the server
PAST_DRIVERS_SHOWN = 5


def event_log_dir() -> Path:
    return Path(settings.SPARK_EVENT_LOG_DIR.get() or checkpoint_root() / "_spark-events")


def event_log_conf() -> dict[str, str]:
    """The Spark conf every launch gets (an app's catalog spark_conf may still change it)."""
    folder = event_log_dir()
    folder.mkdir(parents=True, exist_ok=True)
    return {
        "spark.eventLog.enabled": "true",
        "spark.eventLog.dir": folder.resolve().as_uri(),
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
    answer; the page says so). One request for every app."""
    url = base or history_url()
    try:
        answer = httpx.get(f"{url}/api/v1/applications", params={"limit": APPS_LISTED}, timeout=timeout_s)
        answer.raise_for_status()
        listed = answer.json()
    except (httpx.HTTPError, ValueError):
        return {}
    drivers: dict[str, list[PastDriver]] = {}
    for application in listed if isinstance(listed, list) else []:
        name, attempts = str(application.get("name") or ""), application.get("attempts") or [{}]
        if not name.startswith("streamops-"):
            continue
        last = attempts[0]
        completed = bool(last.get("completed"))
        drivers.setdefault(name.removeprefix("streamops-"), []).append(PastDriver(
            str(application.get("id")), last.get("startTime"), last.get("endTime") if completed else None, completed,
            f"{url}/history/{application.get('id')}/jobs/"))
    for listed_drivers in drivers.values():
        listed_drivers.sort(key=lambda d: d.started or "", reverse=True)
    return drivers


def driver_link(application_id: str | None) -> str | None:
    """The driver's jobs on the History Server, when its event log is there (None: a driver from
    before event logs, or one whose log the cleaner removed)."""
    if not application_id:
        return None
    folder = event_log_dir()
    logged = folder.is_dir() and any(p.name.removeprefix("eventlog_v2_").startswith(application_id) for p in folder.iterdir())
    return f"{history_url()}/history/{application_id}/jobs/" if logged else None
