"""A failed query in words, for the operator: the gist of Spark's error, and the input records
of the batch it failed on.

A query that fails leaves its batch planned and not committed in its checkpoint
(streamops.checkpoints.uncommitted_batch); a restart runs it again with exactly the same offsets,
so a record in it that fails the query fails every restart. The driver records that batch and the
error's gist in driver.json (`failed_batches`); status, recover_restart_app and
recover_skip_records say it with these. Imported by the Spark apps: no Airflow, no Kafka client here.
"""

from __future__ import annotations

import re

from streamops.runtime_records import FailedBatch, InputRange

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


def describe_ranges(ranges: list[InputRange]) -> str:
    """'<topic> partition 3 offsets 1200-1344, ...' (a single offset as 'offset 1200')."""
    parts = []
    for r in ranges:
        span = f"offset {r['first']}" if r["first"] == r["last"] else f"offsets {r['first']}-{r['last']}"
        parts.append(f"{r['topic']} partition {r['partition']} {span}")
    return ", ".join(parts) or "no input records"


def describe_failed_batches(failed: list[FailedBatch]) -> str:
    """One line per failed query: which batch, and which input it covers."""
    return "; ".join(
        f"query {f['query']} failed on batch {f['batch']} ({describe_ranges(f.get('ranges') or [])})"
        if f.get("batch") is not None else f"query {f['query']} failed (no uncommitted batch in its checkpoint)"
        for f in failed
    )
