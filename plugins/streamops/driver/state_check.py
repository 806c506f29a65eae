"""Can this version restart from the running version's checkpoint? Spark's own checks decide,
on a copy: before a roll (in the new version's warm standby) and before a reconcile rolls a
stateful app (`--check-state`), nothing stopped.

Per query of this version with a committed batch in the checkpoint (stateful or not: a stateless
query that gains an operator is refused by Spark too): its folder of the live checkpoint is copied
(streamops.checkpoints.link_query: whole as of its last commit, the app not paused; hard links,
since Spark never changes a checkpoint file in place), the batch after the last commit is made an
empty one (add_empty_batch), and the query is started on the copy, writing nowhere (Spark's noop
sink), for that one batch. Planning it runs Spark's checks of the state against the new plan: the
operators recorded in the checkpoint's state metadata (what the `state-metadata` source reads)
against the new plan's, and each store's key and value schema against the new ones. A refusal
is Spark's error, in the operator's words with Spark's error class; any other failure of the
check says it could not judge (both stop a roll). The copy is removed either way.

What Spark cannot see, the program declares (`state_settings`): the settings that shape what its
state holds (a window's length: the key schema of a 10-minute window and an 11-minute one is the
same). A change of one against the running driver's recorded settings is refused too.
"""

from __future__ import annotations

import logging
import re
import shutil
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyspark.errors import PySparkException
from pyspark.sql import SparkSession

from streamops.app_runtime import AppRuntime
from streamops.catalog import AppSpec
from streamops.checkpoints import add_empty_batch, committed_batches, files_lock, link_query, query_dir, query_dirs
from streamops.driver.progress import STATE_CHECK_SUFFIX
from streamops.kafka_offsets import DURATION_PATTERN, duration_ms
from streamops.program_contract import OutputQuery, StreamingProgram
from streamops.standby import StateCheckRecord

log = logging.getLogger("streamops.app")

CHECK_TIMEOUT_S = 120  # one empty batch per query: seconds, even on a busy host
STALE_S = 3600  # a scratch copy this old was left by a check that was killed: removed by the next
SCRATCH = "state-check"  # under the app's _runtime folder, beside the checkpoint it copies

# Spark's error classes that say the state cannot carry over (anything else: the check could not judge).
_STATE_REFUSALS = ("STATE_STORE_", "STREAMING_STATEFUL_OPERATOR_", "CANNOT_LOAD_STATE_STORE", "STATE_SCHEMA_",
                   "STDS_", "INCOMPATIBLE_")
# Spark's error, as its message starts: "[ERROR_CLASS] text".
_ERROR_CLASS = re.compile(r"\[([A-Z][A-Z0-9_.]+)\]\s*(.*)")
# Lines of Spark's message after which only advice and the query's plan follow.
_MESSAGE_ENDS = ("If you want to force", "=== Streaming Query ===", "SQLSTATE")


@dataclass
class StateCheck:
    """What the check found: the queries Spark checked, and each problem in the operator's words;
    or why it was not run here (`deferred`: a standby with no executor leaves it to the rollout's
    --check-state driver, which runs Spark on its own host)."""

    checked: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    deferred: str | None = None

    def to_json(self) -> StateCheckRecord:
        record: StateCheckRecord = {"checked": list(self.checked), "problems": list(self.problems)}
        if self.deferred:
            record["deferred"] = self.deferred
        return record


def check_state(spark: SparkSession, spec: AppSpec, program: StreamingProgram, outputs: list[OutputQuery],
                checkpoint: str) -> StateCheck:
    """Spark's verdict on restarting `outputs` (this version's queries) from `checkpoint`, and the
    declared state settings against the running driver's."""
    result = StateCheck()
    names = {output.name for output in outputs}
    for folder in sorted(_stateful_query_dirs(checkpoint)):
        if folder not in names:
            result.problems.append(f"query {folder!r} keeps state in the checkpoint but is gone from the new version "
                                   "(its state would be orphaned)")
    scratch_root = AppRuntime(checkpoint).dir / SCRATCH
    _remove_stale(scratch_root)
    scratch = scratch_root / uuid.uuid4().hex[:12]
    try:
        for output in outputs:
            live = query_dir(checkpoint, output.name)
            if not committed_batches(live):
                continue  # a new query (or one that never committed): it starts on its own
            problem = _spark_verdict(spark, spec, output, live, scratch / output.name)
            result.checked.append(output.name)
            if problem:
                result.problems.append(f"query {output.name!r}: {problem}")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    result.problems += setting_changes(program.state_settings, _running_settings(checkpoint), _settings_of(spec, program))
    log.info("state check of %s against %s: %s", spec.name, checkpoint,
             "; ".join(result.problems) or f"Spark restarts {', '.join(result.checked) or 'no stateful query'} from it")
    return result


def _stateful_query_dirs(checkpoint: str) -> list[str]:
    return [d.name for d in query_dirs(checkpoint) if (d / "state").is_dir()]


def _spark_verdict(spark: SparkSession, spec: AppSpec, output: OutputQuery, live: Path, copy: Path) -> str | None:
    """Spark's refusal of restarting `output` on a copy of `live` for one empty batch (None: it ran)."""
    with files_lock(str(live.parent)):  # not while a restore or reset replaces the queries
        vanished = link_query(live, copy)
    if vanished:
        log.info("state check copy of %s: %d file(s) removed by the app's maintenance meanwhile left out", live,
                 len(vanished))
    batch = add_empty_batch(copy)
    try:
        query = (output.frame.writeStream.format("noop").outputMode(output.output_mode)
                 .option("checkpointLocation", str(copy)).queryName(f"{spec.name}.{output.name}{STATE_CHECK_SUFFIX}")
                 .trigger(once=True).start())
    except Exception as exc:  # noqa: BLE001 - e.g. a plan Spark refuses to start at all: its words
        return spark_words(str(exc))
    try:
        finished = query.awaitTermination(CHECK_TIMEOUT_S)
    except PySparkException:
        finished = True  # it failed: its exception says why
    if not finished:
        query.stop()
        return (f"Spark's check could not judge: its empty batch {batch} on a copy of the checkpoint did not finish "
                f"within {CHECK_TIMEOUT_S} s")
    error = query.exception()
    return spark_words(str(error)) if error else None


def _remove_stale(scratch_root: Path) -> None:
    """Scratch copies a killed check left (an hour old: no check runs that long)."""
    for left in scratch_root.iterdir() if scratch_root.is_dir() else []:
        try:
            if time.time() - left.stat().st_mtime > STALE_S:
                shutil.rmtree(left, ignore_errors=True)
        except FileNotFoundError:
            continue


def spark_words(message: str) -> str:
    """Spark's refusal in a few lines: what it says, and its error class."""
    lines = [line.strip() for line in message.strip().splitlines() if line.strip()]
    kept: list[str] = []
    for line in lines:
        if line.startswith(_MESSAGE_ENDS):
            break
        kept.append(line)
    text = " ".join(kept) or message.strip()[:300]
    match = _ERROR_CLASS.search(text)
    if match:
        error_class, said = match.groups()
        if error_class.startswith(_STATE_REFUSALS):
            return f"Spark refuses to restart it from the running version's checkpoint: {said.strip()[:1200]} ({error_class})"
        return f"Spark's check could not judge (its empty batch on a copy of the checkpoint failed): {said.strip()[:800]} " \
               f"({error_class})"
    return f"Spark's check could not judge (its empty batch on a copy of the checkpoint failed): {text[:800]}"


def setting_changes(declared: Mapping[str, tuple[str, ...]], running: Mapping[str, Any] | None,
                    new: Mapping[str, Any]) -> list[str]:
    """The declared state-shaping settings whose value differs from the running driver's (none
    when the running driver's settings are not recorded: Spark's checks alone decide then)."""
    if running is None:
        return []
    problems = []
    for query, names in sorted(declared.items()):
        for name in names:
            if name in running and _normal(running[name]) != _normal(new.get(name)):
                problems.append(f"query {query!r}: setting {name} changes from {running[name]} to {new.get(name)}, and "
                                f"the state holds what {running[name]} made (the program declares it shapes the state; "
                                "Spark checks the state's schema, not this)")
    return problems


def _running_settings(checkpoint: str) -> dict[str, Any] | None:
    driver = AppRuntime(checkpoint).driver()
    spec = driver.launch.spec if driver else None
    settings = (spec or {}).get("settings")
    return settings if isinstance(settings, dict) else None


def _normal(value: Any) -> Any:
    """A duration as milliseconds ("5 seconds" and "5 second" alike), anything else as text."""
    text = str(value)
    return duration_ms(text) if isinstance(value, str) and _DURATION.match(text) else text


_DURATION = re.compile(DURATION_PATTERN)


def _settings_of(spec: AppSpec, program: StreamingProgram) -> dict[str, Any]:
    """The app's settings with the program's defaults, as the running driver recorded its own."""
    try:
        return dict(program.bind(spec).settings.model_dump(mode="json"))
    except Exception:  # noqa: BLE001 - settings the program refuses fail the start anyway: compare as written
        settings = spec.settings
        return dict(settings.model_dump(mode="json") if hasattr(settings, "model_dump") else settings or {})
