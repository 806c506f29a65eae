"""What one run of an app is asked to do: `RunOptions`, built by `driver.run` from the driver's
arguments and the catalog entry, read by every module that starts or shapes the queries.

Triggers: a Spark interval ("5 seconds"), `AVAILABLE_NOW` (process what is there, stop), or
`streamops.catalog.REAL_TIME` (Spark's real-time mode, stateless programs only).
"""

from __future__ import annotations

from dataclasses import dataclass

from streamops.kafka_client import KafkaClientConfig
from streamops.runtime_records import SkipEntry

AVAILABLE_NOW = "available-now"


@dataclass(frozen=True)
class RunOptions:
    kafka: KafkaClientConfig  # where and as whom the app connects (secrets masked in its repr)
    checkpoint: str  # this app's checkpoint root; each query has a folder under it
    # A Spark interval, "available-now" (process what is there, stop), or "real-time" (Spark's
    # real-time mode: records emitted as they come, progress committed every checkpoint_interval).
    trigger: str = "5 seconds"
    checkpoint_interval: str = "10 seconds"  # real-time only
    # Only for a new checkpoint: earliest, latest, or Spark's JSON of offsets per topic and partition.
    starting_offsets: str = "earliest"
    # Bounded runs (reprocessing): topic -> partition -> first offset NOT processed. Records at or
    # past it are dropped at the source, so an available-now run covers exactly the planned range.
    ending_offsets: dict[str, dict[str, int]] | None = None
    version: str | None = None  # overrides the catalog's version label
    max_offsets_per_trigger: int | None = None
    # Records an operator skipped (recover_skip_records); None: the list beside the checkpoint.
    # A backfill runs on a checkpoint of its own and passes the live app's list here.
    skip_records: list[SkipEntry] | None = None
