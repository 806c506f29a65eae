"""Create or update the suite's Airflow connections in the local metadata database.

Run by `streamops airflow init` / `streamops up` inside the stack's Airflow environment:
    python -m streamops.local_stack.connections <kafka bootstrap servers>
    python -m streamops.local_stack.connections --settings kafka_default=<file> --settings kafka_app_<app>=<file> ...
The second form (the secured cluster) reads each connection's settings from a file only this user
can read, so no secret is ever on a command line. This is set-up code, not task code, so it may use
the metadata database directly.
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Mapping
from pathlib import Path

from streamops.kafka_client import DEFAULT_CONN_ID, KafkaClientConfig
from streamops.notifications import NOTIFY_CONN_ID

# Per-app connections this code wrote carry this description, so switching the stack back to the
# single broker removes them (an app must not keep connecting to the cluster) and nothing else.
APP_CONNECTION_MARK = "Kafka principal of one app, written by streamops up"


def connection_specs(kafka_default: KafkaClientConfig, apps: Mapping[str, KafkaClientConfig] | None = None,
                     spark_master: str | None = None, notify_webhook: str | None = None) -> list[dict]:
    """kafka_default (the suite's own tasks), one kafka_app_<app> per given app, spark_default
    (local mode, or the standalone master `spark://host:port` in client mode), and on-call's
    webhook (streamops.notifications) when one is given."""
    local = not kafka_default.secured
    default_extra = {**kafka_default.settings, "socket.timeout.ms": 10000} if local else dict(kafka_default.settings)
    specs = [
        {
            "conn_id": DEFAULT_CONN_ID,
            "conn_type": "kafka",
            "description": "Kafka cluster of the streaming pipelines (local single broker)." if local else
            f"Kafka cluster of the streaming pipelines, as {_who(kafka_default)} (the suite's own tasks).",
            "extra": json.dumps(default_extra),
        },
        {
            "conn_id": "spark_default",
            "conn_type": "spark",
            "description": "Where spark-submit runs the streaming apps: Spark local mode on this host." if not spark_master
            else "Where spark-submit runs the streaming apps: the Spark standalone cluster (drivers in client mode on "
                 "the Airflow worker that launches them, executors on the cluster's workers).",
            "host": spark_master or "local[*]",
            "extra": json.dumps({"deploy-mode": "client", "spark-binary": "spark-submit"}),
        },
    ]
    if notify_webhook:
        specs.append({"conn_id": NOTIFY_CONN_ID, "conn_type": "http", "host": notify_webhook,
                      "description": "On-call's webhook (Slack, chat, pager): plans waiting for approval, apps that "
                                     "need someone, reconcile and reprocess results."})
    for conn_id, config in (apps or {}).items():
        specs.append({"conn_id": conn_id, "conn_type": "kafka", "description": f"{APP_CONNECTION_MARK} (as {_who(config)}).",
                      "extra": json.dumps(dict(config.settings))})
    return specs


def _who(config: KafkaClientConfig) -> str:
    return config.principal or "its client certificate"


def upsert(specs: list[dict]) -> list[str]:
    """Create or update each connection; remove per-app connections written earlier and not given now."""
    # The ORM model, not the Task SDK's Connection: the local stack seeds the metadata database
    # itself, before any task runs (ruff's AIR311 suggests the SDK class, which has no table).
    from airflow.models import Connection
    from airflow.utils.session import create_session

    done = []
    wanted = {spec["conn_id"] for spec in specs}
    with create_session() as session:
        for spec in specs:
            existing = session.query(Connection).filter(Connection.conn_id == spec["conn_id"]).one_or_none()
            if existing is None:
                session.add(Connection(**spec))
                done.append(f"created {spec['conn_id']}")
            else:
                for key, value in spec.items():
                    if key == "extra":
                        existing.set_extra(value)
                    else:
                        setattr(existing, key, value)
                done.append(f"updated {spec['conn_id']}")
        for stale in session.query(Connection).filter(Connection.conn_id.like("kafka_app_%")).all():
            if stale.conn_id not in wanted and (stale.description or "").startswith(APP_CONNECTION_MARK):
                session.delete(stale)
                done.append(f"removed {stale.conn_id}")
    return done


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bootstrap", nargs="?", help="the local broker's bootstrap servers (plaintext)")
    parser.add_argument("--settings", action="append", default=[], metavar="CONN_ID=FILE",
                        help="a Kafka connection's settings from a file (mode 600): kafka_default and kafka_app_<app>")
    parser.add_argument("--spark-master", default=None, metavar="spark://HOST:PORT",
                        help="spark_default on a Spark standalone master instead of local mode")
    parser.add_argument("--notify-webhook-file", default=None, metavar="FILE",
                        help="on-call's webhook URL from a file (mode 600): the connection streamops_notify")
    args = parser.parse_args(argv)
    if args.spark_master is not None and not re.fullmatch(r"spark://[A-Za-z0-9.-]+:\d{1,5}", args.spark_master):
        parser.error(f"--spark-master {args.spark_master!r}: expected spark://<host>:<port>")
    files: dict[str, str] = {}
    for item in args.settings:
        conn_id, sep, path = item.partition("=")
        if not sep or not path or not (conn_id == DEFAULT_CONN_ID or conn_id.startswith("kafka_app_")):
            parser.error(f"--settings {item!r}: expected kafka_default=<file> or kafka_app_<app>=<file>")
        files[conn_id] = path
    if bool(args.bootstrap) == (DEFAULT_CONN_ID in files):
        parser.error("give either the local broker's bootstrap servers or --settings kafka_default=<file>, not both")
    if args.bootstrap:
        if files:
            parser.error("per-app connections (--settings kafka_app_...) belong to the secured cluster, not the local broker")
        default = KafkaClientConfig.plaintext(args.bootstrap)
    else:
        default = KafkaClientConfig.read_file(files.pop(DEFAULT_CONN_ID), private=True)
    apps = {conn_id: KafkaClientConfig.read_file(path, private=True) for conn_id, path in files.items()}
    webhook = None
    if args.notify_webhook_file:
        webhook = Path(args.notify_webhook_file).read_text().strip()
        if not re.fullmatch(r"https?://\S+", webhook):
            parser.error(f"--notify-webhook-file {args.notify_webhook_file}: expected one http(s):// URL in the file")
    print("[setup] Airflow connections: " + ", ".join(upsert(connection_specs(default, apps, args.spark_master, webhook))))


if __name__ == "__main__":
    main()
