"""The supervisor's event source: a trigger that fires when a streaming app's driver is known to
have ended while the app should run (docs/operating.md "Supervision").

An asset watcher (airflow.sdk.AssetWatcher) runs it in the triggerer; each event it yields
becomes an asset event of DRIVER_EXITS_ASSET, which schedules the app_status DAG at once. The
restart itself stays where it was: app_status's audited task, with the app's backoff and
crash-loop guard (streamops.supervision.act). The trigger only reads local runtime files
(supervision.driver_exits), every `poll_interval_s` seconds, off the triggerer's event loop.

It fires on a change, never on a standing condition: a driver that ended fires once, with the
driver it was (pid, start) and how it ended; the next event for that app needs another driver to
end. When the trigger (re)starts, every app that is down and should run fires once: the
supervisor's run then decides, as it would on its schedule (a crash loop stays down, and says so).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseEventTrigger, TriggerEvent

from streamops import settings
from streamops.catalog import catalog_path, load_catalog
from streamops.supervision import driver_exits

log = logging.getLogger("streamops.triggers")

# The asset the watcher updates and app_status is scheduled on.
DRIVER_EXITS_ASSET = "streamops.driver_exits"
# How often the runtime files are read: a crash starts the supervisor's run within this and the
# scheduler's next loop.
POLL_INTERVAL_S = 2.0


def _marker(exit_: dict[str, Any]) -> tuple:
    # The lease epoch: every driver start takes a new one.
    return exit_.get("lease_epoch"), exit_.get("pid"), exit_.get("host"), exit_.get("started_at")


class DriverExitTrigger(BaseEventTrigger):
    """Yields {"app", "state", "pid", "host", "lease_epoch", "started_at", "stopped_at", "reason"} once per driver
    that ended while its app should run (the catalog and checkpoint root of the triggerer's
    environment: $STREAMOPS_CATALOG, $STREAMOPS_CHECKPOINT_ROOT)."""

    def __init__(self, poll_interval_s: float = POLL_INTERVAL_S):
        super().__init__()
        self.poll_interval_s = float(poll_interval_s)

    def serialize(self) -> tuple[str, dict[str, Any]]:
        # Stable kwargs: the triggerer knows a watcher by the hash of these at every DAG parse.
        return f"{type(self).__module__}.{type(self).__qualname__}", {"poll_interval_s": self.poll_interval_s}

    async def run(self) -> AsyncIterator[TriggerEvent]:
        fired: dict[str, tuple] = {}
        while True:
            try:
                exits = await asyncio.to_thread(_driver_exits)
            except Exception as exc:  # noqa: BLE001 - a catalog being edited: the next poll reads it again
                log.warning("driver exits could not be read (the scheduled supervisor still runs): %s", exc)
                exits = {}
            for app, exit_ in sorted(exits.items()):
                if fired.get(app) != _marker(exit_):
                    fired[app] = _marker(exit_)
                    log.info("%s: driver pid %s on %s %s: the supervisor runs now", app, exit_.get("pid"),
                             exit_.get("host") or "?", exit_.get("state"))
                    yield TriggerEvent(exit_)
            await asyncio.sleep(self.poll_interval_s)


_loaded: dict[tuple, Any] = {}


def _driver_exits() -> dict[str, dict[str, Any]]:
    # The catalog is read again only when its file changed (not every poll).
    path = catalog_path()
    key = (str(path), path.stat().st_mtime_ns, settings.ENVIRONMENT.get(), settings.CHECKPOINT_ROOT.get())
    if key not in _loaded:
        _loaded.clear()
        _loaded[key] = load_catalog(path, check_programs=False)
    return driver_exits(_loaded[key])
