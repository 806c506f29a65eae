"""Validation results, kept in a SQLite file so they can be queried after the run:

    sqlite3 .run/quality/results.sqlite \\
      "SELECT validated_at, topic, success, failed_expectations FROM validation_results ORDER BY id DESC LIMIT 5"

or `streamops quality results [--topic T] [--failed]`. One row per topic per run.
"""

from __future__ import annotations

import json
import sqlite3
from contextlib import closing
from pathlib import Path

from streamops import settings
from streamops.paths import RUN_DIR

_SCHEMA = """
CREATE TABLE IF NOT EXISTS validation_results (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    run_name TEXT NOT NULL,
    validated_at TEXT NOT NULL,
    topic TEXT NOT NULL,
    suite TEXT NOT NULL,
    suite_file TEXT NOT NULL,
    range_description TEXT NOT NULL,
    range_offsets TEXT NOT NULL,          -- JSON: partition -> [start, end)
    records INTEGER NOT NULL,
    success INTEGER NOT NULL,             -- 1: no critical expectation failed
    failed_expectations TEXT NOT NULL,    -- JSON list
    warnings TEXT NOT NULL,               -- JSON list (failed expectations of severity warning/info)
    reconciliation TEXT,                  -- JSON summary, or null
    docs_url TEXT,
    written_by TEXT                       -- the writing app's version and code (artifact digest)
);
CREATE INDEX IF NOT EXISTS validation_results_topic ON validation_results (topic, validated_at);
"""
# Columns added after the first release: ALTER TABLE adds them to an existing file.
_ADDED_COLUMNS = {"written_by": "TEXT"}
_JSON_COLUMNS = ("range_offsets", "failed_expectations", "warnings", "reconciliation")


def quality_root() -> Path:
    """Where Data Docs, the GX project and the results file live."""
    return Path(settings.QUALITY_ROOT.get() or RUN_DIR / "quality")


def results_path(root: Path | None = None) -> Path:
    return (root or quality_root()) / "results.sqlite"


def _connect(path: Path) -> sqlite3.Connection:
    path.parent.mkdir(parents=True, exist_ok=True)
    connection = sqlite3.connect(path, timeout=30)
    connection.executescript(_SCHEMA)
    columns = {row[1] for row in connection.execute("PRAGMA table_info(validation_results)")}
    for column, kind in _ADDED_COLUMNS.items():
        if column not in columns:  # a results file from before the column existed
            connection.execute(f"ALTER TABLE validation_results ADD COLUMN {column} {kind}")
    return connection


def record(row: dict, root: Path | None = None) -> None:
    """Append one topic's result (the keys of the table, JSON columns as Python values)."""
    values = {key: json.dumps(row[key]) if key in _JSON_COLUMNS and row[key] is not None else row[key] for key in row}
    values["success"] = int(bool(values["success"]))
    columns = ", ".join(values)
    marks = ", ".join(f":{key}" for key in values)
    with closing(_connect(results_path(root))) as connection, connection:
        connection.execute(f"INSERT INTO validation_results ({columns}) VALUES ({marks})", values)  # noqa: S608 - our keys


def query(
    topic: str | None = None,
    failed_only: bool = False,
    run_name: str | None = None,
    limit: int = 20,
    root: Path | None = None,
) -> list[dict]:
    """Newest first."""
    path = results_path(root)
    if not path.exists():
        return []
    clauses, args = [], []
    if topic:
        clauses.append("topic = ?")
        args.append(topic)
    if failed_only:
        clauses.append("success = 0")
    if run_name:
        clauses.append("run_name = ?")
        args.append(run_name)
    where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
    with closing(_connect(path)) as connection:
        connection.row_factory = sqlite3.Row
        rows = connection.execute(
            f"SELECT * FROM validation_results {where} ORDER BY id DESC LIMIT ?", [*args, limit]  # noqa: S608
        ).fetchall()
    out = []
    for row in rows:
        item = dict(row)
        for key in _JSON_COLUMNS:
            if item[key] is not None:
                item[key] = json.loads(item[key])
        item["success"] = bool(item["success"])
        out.append(item)
    return out
