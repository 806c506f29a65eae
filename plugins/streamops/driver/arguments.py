"""The driver's command line, as one typed value (`DriverArgs`): parsed from argv by the driver,
turned back into argv (`to_argv`) by whoever builds a launch, so both sides share one list.

    spark-submit --jars <connector jars> [--py-files <artifact.zip>] \\
        plugins/streamops/entrypoints/driver.py --app oplog-router --program spark_apps.oplog_router \\
        [--artifact <artifact.zip> --artifact-digest sha256:...] \\
        [--catalog FILE] [--kafka-config FILE | --bootstrap-servers HOST:PORT] [--checkpoint DIR] \\
        [--trigger "2 seconds" | --trigger available-now | --trigger real-time] \\
        [--starting-offsets earliest|latest|JSON] [--ending-offsets JSON] [--skip-records-of CHECKPOINT] \\
        [--no-consumer-group] [--version X.Y.Z] [--max-offsets-per-trigger N] \\
        [--standby TOKEN [--standby-timeout SECONDS] | --plan-fingerprint]
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, fields

from streamops import settings
from streamops.catalog import REAL_TIME
from streamops.driver.options import AVAILABLE_NOW

DEFAULT_BOOTSTRAP = "127.0.0.1:9092"
DEFAULT_STANDBY_TIMEOUT_S = 900.0
STATE_CHECK_FLAG = "--check-state"
STATE_CHECK_LINE = "STATE-CHECK "  # the line the driver prints its verdict on, then JSON


@dataclass(frozen=True)
class DriverArgs:
    app: str  # the app's name in the catalog
    program: str  # its program reference, as the catalog names it (checked against the catalog)
    artifact: str | None = None  # the artifact zip its code comes from (digest checked by the entrypoint)
    artifact_digest: str | None = None
    catalog: str | None = None  # default: $STREAMOPS_CATALOG or catalog/pipelines.yaml
    kafka_config: str | None = None  # a private file of librdkafka settings (KafkaClientConfig.write_private)
    bootstrap_servers: str | None = None  # a PLAINTEXT Kafka without credentials (when no kafka_config)
    checkpoint: str | None = None  # default: the catalog's
    trigger: str | None = None  # default: the catalog's
    starting_offsets: str = "earliest"  # new checkpoints only
    ending_offsets: dict[str, dict[str, int]] | None = None  # a bounded backfill's first offsets NOT read
    skip_records_of: str | None = None  # a backfill skips what the operator skipped in this checkpoint's app
    consumer_group: bool = True  # commit progress to streamops.<app> (a backfill does not: it is the live app's)
    version: str | None = None  # the version that runs (written into dead letters)
    max_offsets_per_trigger: int | None = None
    standby: str | None = None  # a warm standby's token (driver.warm_standby)
    standby_timeout_s: float = DEFAULT_STANDBY_TIMEOUT_S
    check_state: bool = False  # judge a restart from the checkpoint (STATE-CHECK <json>) and exit: nothing started

    def __post_init__(self) -> None:
        if self.kafka_config and self.bootstrap_servers:
            raise ValueError("a driver connects through --kafka-config or --bootstrap-servers, not both")

    def to_argv(self) -> list[str]:
        """The command line that parses back into this value (a standby's timeout only with a standby)."""
        argv = ["--app", self.app, "--program", self.program]
        optional = {
            "--artifact": self.artifact, "--artifact-digest": self.artifact_digest, "--catalog": self.catalog,
            "--kafka-config": self.kafka_config, "--bootstrap-servers": self.bootstrap_servers,
            "--checkpoint": self.checkpoint, "--trigger": self.trigger,
            "--starting-offsets": None if self.starting_offsets == "earliest" else self.starting_offsets,
            "--ending-offsets": json.dumps(self.ending_offsets, sort_keys=True) if self.ending_offsets is not None else None,
            "--skip-records-of": self.skip_records_of, "--version": self.version,
            "--max-offsets-per-trigger": None if self.max_offsets_per_trigger is None else str(self.max_offsets_per_trigger),
            "--standby": self.standby,
            # Meaningful for a standby only; repr keeps every digit of a float.
            "--standby-timeout": (
                repr(float(self.standby_timeout_s))
                if self.standby and self.standby_timeout_s != DEFAULT_STANDBY_TIMEOUT_S
                else None
            ),
        }
        for flag, value in optional.items():
            if value is not None:
                argv += [flag, value]
        if not self.consumer_group:
            argv.append("--no-consumer-group")
        if self.check_state:
            argv.append(STATE_CHECK_FLAG)
        return argv


def _offsets_json(text: str) -> dict[str, dict[str, int]]:
    """--ending-offsets: {"topic": {"partition": offset}}, refused by name otherwise."""
    try:
        value = json.loads(text)
        if not isinstance(value, dict) or not all(isinstance(p, dict) for p in value.values()):
            raise ValueError("not an object of topics, each an object of partitions")
        return {str(t): {str(p): int(o) for p, o in parts.items()} for t, parts in value.items()}
    except (ValueError, TypeError) as exc:
        raise argparse.ArgumentTypeError(f"{text[:200]!r} is not a JSON of offsets per topic and partition: {exc}") from None


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="streamops-driver", description="Run one streaming app of the catalog.")
    p.add_argument("--app", required=True, help="app name in the catalog")
    p.add_argument("--program", required=True, help="the app's program reference, as the catalog names it")
    p.add_argument("--artifact", default=None, help="the artifact zip the program's code comes from (checked by the launcher)")
    p.add_argument("--artifact-digest", default=None, help="its sha256 digest")
    p.add_argument("--catalog", default=None, help="catalog file (default: $STREAMOPS_CATALOG or catalog/pipelines.yaml)")
    connection = p.add_mutually_exclusive_group()
    connection.add_argument(
        "--kafka-config", default=None,
        help="file of the Kafka connection's librdkafka settings, secrets included, readable by this user "
             "only (launchers write it: streamops.kafka_client.KafkaClientConfig.write_private)",
    )
    connection.add_argument(
        "--bootstrap-servers", default=None,
        help=f"a PLAINTEXT Kafka without credentials (default: $STREAMOPS_KAFKA_BOOTSTRAP or {DEFAULT_BOOTSTRAP})",
    )
    p.add_argument("--checkpoint", default=None, help="checkpoint root (default: from the catalog)")
    p.add_argument("--trigger", default=None,
                   help=f"micro-batch interval such as '2 seconds', {AVAILABLE_NOW}, or {REAL_TIME} (stateless apps)")
    p.add_argument("--starting-offsets", default="earliest",
                   help="earliest, latest, or a JSON of offsets per topic and partition (new checkpoints only)")
    p.add_argument("--ending-offsets", default=None, type=_offsets_json,
                   help="a JSON of offsets per topic and partition: records at or past them are not read (bounded backfills)")
    p.add_argument("--skip-records-of", default=None,
                   help="skip the records an operator skipped in the app on this checkpoint (a backfill of a live app)")
    p.add_argument("--no-consumer-group", action="store_true",
                   help="do not commit progress to the consumer group streamops.<app> (a backfill: the group is the live app's)")
    p.add_argument("--version", default=None, help="the version that runs (written into dead letters)")
    p.add_argument("--max-offsets-per-trigger", type=int, default=None)
    p.add_argument("--standby", default=None, metavar="TOKEN",
                   help="a warm standby for a rolling restart: build the session and the plans, report ready, and wait "
                        "for the rollout's word before taking the lease (streamops.standby)")
    p.add_argument("--standby-timeout", type=float, default=DEFAULT_STANDBY_TIMEOUT_S,
                   help="seconds a standby waits for the rollout's word before it exits by itself")
    p.add_argument(STATE_CHECK_FLAG, dest="check_state", action="store_true",
                   help="let Spark judge whether this version restarts from the checkpoint (its queries for one empty "
                        "batch on a copy), print the verdict as JSON and exit (no lease, nothing started): what a "
                        "reconcile asks before it rolls a stateful app (driver.state_check)")
    return p


def parse_args(argv: list[str]) -> DriverArgs:
    """argv -> DriverArgs; a bad command line exits with argparse's message (ExitCode.USAGE)."""
    parsed = vars(parser().parse_args(argv))
    parsed["consumer_group"] = not parsed.pop("no_consumer_group")
    parsed["standby_timeout_s"] = parsed.pop("standby_timeout")
    if parsed["kafka_config"] is None and parsed["bootstrap_servers"] is None:
        parsed["bootstrap_servers"] = settings.KAFKA_BOOTSTRAP.get() or DEFAULT_BOOTSTRAP
    known = {f.name for f in fields(DriverArgs)}
    if set(parsed) != known:  # a flag added to one and not the other
        raise RuntimeError(f"DriverArgs and the parser disagree: {sorted(set(parsed) ^ known)}")
    return DriverArgs(**parsed)
