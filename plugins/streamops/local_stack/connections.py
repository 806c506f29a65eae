"""Create or update the suite's Airflow connections in the local metadata database.

Run by `streamops airflow init` (part of bin/setup) inside the stack's Airflow environment:
    python -m streamops.local_stack.connections <kafka bootstrap servers>
This is set-up code, not task code, so it may use the metadata database directly.
"""

from __future__ import annotations

import json
import sys


def connection_specs(kafka_bootstrap: str) -> list[dict]:
    return [
        {
            "conn_id": "kafka_default",
            "conn_type": "kafka",
            "description": "Kafka cluster of the streaming pipelines (local single broker).",
            "extra": json.dumps({"bootstrap.servers": kafka_bootstrap, "socket.timeout.ms": 10000}),
        },
        {
            "conn_id": "spark_default",
            "conn_type": "spark",
            "description": "Where spark-submit runs the streaming apps: Spark local mode on this host.",
            "host": "local[*]",
            "extra": json.dumps({"deploy-mode": "client", "spark-binary": "spark-submit"}),
        },
    ]


def upsert(kafka_bootstrap: str) -> list[str]:
    from airflow.models import Connection
    from airflow.utils.session import create_session

    done = []
    with create_session() as session:
        for spec in connection_specs(kafka_bootstrap):
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
    return done


if __name__ == "__main__":
    print("[setup] Airflow connections: " + ", ".join(upsert(sys.argv[1])))
