"""Micro-batches in a query's offset log: the input offsets a batch covers, and the batch a
failed query stopped on.

Spark writes `offsets/<N>` (the end offsets of batch N) before running the batch and
`commits/<N>` after it succeeded. A batch with an offset entry and no commit is the one the
query failed on; a restart runs it again with exactly the same offsets, so a record in it that
fails the query fails every restart. The driver records that batch in driver.json
(`failed_batches`); status and recover_restart_app read it, recover_skip_records skips a record
of it. Imported by the Spark apps: no Airflow, no Kafka client here.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any


def _batch_ids(folder: Path) -> list[int]:
    return sorted(int(p.name) for p in folder.glob("[0-9]*") if p.name.isdigit()) if folder.exists() else []


def batch_offsets(query_dir: Path, batch: int) -> dict[str, dict[int, int]] | None:
    """topic -> partition -> end offset (the next one to read) of `batch` in the offset log
    (None: the log has no such batch). Line 0 is the log version, line 1 the batch metadata,
    then one line per source."""
    path = query_dir / "offsets" / str(batch)
    if not path.exists():
        return None
    merged: dict[str, dict[int, int]] = {}
    for line in path.read_text().splitlines()[2:]:
        if line.startswith("{"):
            for topic, partitions in json.loads(line).items():
                merged.setdefault(topic, {}).update({int(p): int(o) for p, o in partitions.items()})
    return merged


def _initial_offsets(query_dir: Path) -> dict[str, dict[int, int]]:
    """Where the query started on its first batch: sources/<n>/0 for each of its sources (a NUL
    byte, a version line, the JSON of offsets)."""
    merged: dict[str, dict[int, int]] = {}
    for written in sorted((query_dir / "sources").glob("*/0")) if (query_dir / "sources").exists() else []:
        _version, _, payload = written.read_bytes().lstrip(b"\x00").decode().partition("\n")
        try:
            for topic, parts in json.loads(payload).items():
                merged.setdefault(topic, {}).update({int(p): int(o) for p, o in parts.items()})
        except (ValueError, AttributeError):
            continue
    return merged


def uncommitted_batch(query_dir: Path) -> dict[str, Any] | None:
    """The batch the query planned but did not commit, with the input it covers:
    {"batch": N, "ranges": [{"topic", "partition", "first", "last"}, ...]} (last inclusive,
    only partitions with records in it). None: every planned batch was committed."""
    planned, committed = _batch_ids(query_dir / "offsets"), _batch_ids(query_dir / "commits")
    if not planned or (committed and planned[-1] <= committed[-1]):
        return None
    batch = planned[-1]
    ends = batch_offsets(query_dir, batch) or {}
    starts = (batch_offsets(query_dir, committed[-1]) if committed else None) or _initial_offsets(query_dir)
    ranges = [
        {"topic": topic, "partition": partition, "first": starts.get(topic, {}).get(partition, 0), "last": end - 1}
        for topic, partitions in sorted(ends.items()) for partition, end in sorted(partitions.items())
        if end > starts.get(topic, {}).get(partition, 0)
    ]
    return {"batch": batch, "ranges": ranges}


# A Java exception class, e.g. "org.apache.kafka.common.errors.RecordTooLargeException".
_JAVA_EXCEPTION = re.compile(r"(?:[a-z_$][\w$]*\.)+[A-Z][\w$]*(?:Exception|Error)\b")


def error_gist(text: str, limit: int = 400) -> str:
    """The part of a query's error that says what went wrong: Spark wraps the cause in several
    layers on one line ("Query ... terminated with exception: Job aborted ...: <cause>"); keep
    the first line from its last Java exception class on, at most `limit` characters."""
    text = str(text)
    if "Return Message: Traceback" in text:
        # The sink's Python function failed (foreachBatch): the cause is the exception line that
        # ends the traceback (its frames are indented); the sink puts the Java error's gist in it.
        body = text.split("Return Message: ", 1)[1].splitlines()[1:]
        text = next((line for line in body if line.strip() and not line.startswith((" ", "\t"))), text)
    first = next((line.strip() for line in text.splitlines() if line.strip()), "")
    classes = list(_JAVA_EXCEPTION.finditer(first))
    if classes:
        first = first[classes[-1].start():]
    return first if len(first) <= limit else first[: limit - 3] + "..."


def describe_ranges(ranges: list[dict[str, Any]]) -> str:
    """'<topic> partition 3 offsets 1200-1344, ...' (a single offset as 'offset 1200')."""
    parts = []
    for r in ranges:
        span = f"offset {r['first']}" if r["first"] == r["last"] else f"offsets {r['first']}-{r['last']}"
        parts.append(f"{r['topic']} partition {r['partition']} {span}")
    return ", ".join(parts) or "no input records"


def describe_failed_batches(failed: list[dict[str, Any]]) -> str:
    """One line per failed query: which batch, and which input it covers."""
    return "; ".join(
        f"query {f['query']} failed on batch {f['batch']} ({describe_ranges(f.get('ranges') or [])})"
        if f.get("batch") is not None else f"query {f['query']} failed (no uncommitted batch in its checkpoint)"
        for f in failed
    )
