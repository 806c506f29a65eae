"""What a recovery test looks at: a checkpoint's bytes, a run's audit steps; and stopping a driver
the way an operator does."""

from __future__ import annotations

from pathlib import Path

from streamops.app_runtime import AppRuntime
from streamops.audit import read_audit
from streamops.waiting import poll_until


def checkpoint_state(checkpoint: Path) -> dict[str, bytes]:
    """Every file of the checkpoint (runtime folder excluded) with its bytes."""
    return {str(p.relative_to(checkpoint)): p.read_bytes() for p in sorted(checkpoint.rglob("*"))
            if p.is_file() and "_runtime" not in p.parts}


def steps_of(run_id: str) -> list[tuple[str, str]]:
    return [(e["step"], e["outcome"]) for e in read_audit(run_id=run_id)]


def stop_driver(runtime: AppRuntime) -> None:
    runtime.request_stop(by="test")
    poll_until(lambda: not runtime.is_running(), timeout=120, what="the driver to stop")


def commit_offsets(admin, group: str, offsets: dict[tuple[str, int], int]) -> None:
    """Commit `offsets` for `group` as a team's consumer would (a downstream reader of a topic)."""
    from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition

    request = [ConsumerGroupTopicPartitions(group, [TopicPartition(t, p, o) for (t, p), o in sorted(offsets.items())])]
    admin.alter_consumer_group_offsets(request)[group].result(30)
