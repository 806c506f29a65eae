"""The JSON files of an app's runtime folder (lease, driver record, standby handshake): written
whole under a temporary name and renamed into place, so a reader on any host never sees half a
file; read as None when missing or unreadable. Imported by the Spark apps, so no Airflow here."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any


def write_json_atomic(path: Path, payload: Any, indent: int | None = None) -> None:
    # pid and thread in the temporary name: a driver's threads and other processes never share one.
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.write_text(json.dumps(payload, indent=indent, sort_keys=True))
    os.replace(tmp, path)


def read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return None


def read_json_object(path: Path) -> dict[str, Any] | None:
    value = read_json(path)
    return value if isinstance(value, dict) else None
