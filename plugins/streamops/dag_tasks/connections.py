"""Airflow connections -> the clients a task works with: the one place a task gets them.

    kafka_connection()   the suite's own Kafka settings (kafka_default), as a KafkaClientConfig
    admin_client()       a Kafka AdminClient on that connection
    spark_target()       where spark-submit sends an app: spark_default read as the Spark provider reads it
    spark_master()       its master (local[*] when it names no host)
    spark_session(name)  a Spark session on that master, for the tasks' own batch jobs

An app's driver connects as the app's own principal instead (kafka_app_<app>, resolved by
streamops.kafka_client.app_connection when its command is built). What a connection holds
becomes client settings in streamops.kafka_client only; secrets are never logged.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from streamops.kafka_client import DEFAULT_CONN_ID, KafkaClientConfig, airflow_connection
from streamops.spark_submit import SparkTarget

if TYPE_CHECKING:
    from confluent_kafka.admin import AdminClient
    from pyspark.sql import SparkSession

    from streamops.spark_submit import SparkTarget

SPARK_CONN_ID = "spark_default"


def kafka_connection(conn_id: str = DEFAULT_CONN_ID) -> KafkaClientConfig:
    """The suite's own Kafka connection (provisioning, status, quality, recovery reads)."""
    return airflow_connection(conn_id)


def admin_client(conn_id: str = DEFAULT_CONN_ID) -> AdminClient:
    """The AdminClient of the Airflow connection."""
    admin: AdminClient = airflow_connection(conn_id).admin()
    return admin


def spark_target(conn_id: str = SPARK_CONN_ID) -> SparkTarget:
    """The Spark connection as every launch uses it (SubmitSpec.argv): live apps and backfills alike."""
    from airflow.sdk import BaseHook

    connection = BaseHook.get_connection(conn_id)
    return SparkTarget.from_connection(connection.conn_type, connection.host, connection.port, connection.extra_dejson or {},
                                       conn_id=conn_id)


def spark_master(conn_id: str = SPARK_CONN_ID) -> str:
    """The master of the Spark connection (the tasks' batch jobs and the apps run there)."""
    return spark_target(conn_id).master


def spark_session(name: str, master: str | None = None) -> SparkSession:
    """A Spark session named `name` for a task's own batch job (validation, replay, reconciliation)
    on `master`, by default spark_default's."""
    from streamops.driver.session import build_session

    return build_session(name, master=master or spark_master())
