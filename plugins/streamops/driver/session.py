"""The SparkSession every app runs in."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from pyspark.sql import SparkSession

from streamops.catalog import AppSpec
from streamops.toolchain import driver_jars

LOG4J2_CONFIG = Path(__file__).with_name("log4j2.properties")

# Spark SQL settings every app gets; the catalog's spark_conf is applied on top.
BASE_CONF = {
    # Kafka Streams keeps state in RocksDB; so do we (bounded memory, incremental checkpoints).
    "spark.sql.streaming.stateStore.providerClass": (
        "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
    ),
    # Commit state changes as a changelog per batch instead of full snapshots.
    "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.shuffle.partitions": "4",
    # base64() (dead letters' original bytes) must not break lines every 76 characters:
    # strict decoders such as Java's Base64.getDecoder() reject the line breaks.
    "spark.sql.chunkBase64String.enabled": "false",
}
# Kafka credentials travel as source/sink options (kafka.sasl.jaas.config, PEM keys): plans, the
# UI and logs print those options masked. Spark's defaults match neither name. Applied last: no
# app conf may turn the masking off.
REDACTION_CONF = {
    "spark.sql.redaction.options.regex": "(?i)url|jaas|password|secret|keystore[.]key|token",
    "spark.redaction.regex": "(?i)secret|password|token|access[.]?key|jaas",
}


def build_session(app_name: str, master: str | None = None, extra_conf: dict[str, str] | None = None, *,
                  launcher_names: bool = False) -> SparkSession:
    """Get or create the session. Under spark-submit the master and jars come from the
    launcher; run directly (tests, local runs) it uses local mode and the connector jars
    that bin/setup resolved."""
    # Executors must run the same Python (with pandas/pyarrow) as the driver.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    # No console progress bars: driver output is read as a log.
    builder = SparkSession.builder.config("spark.ui.showConsoleProgress", "false")
    if not (launcher_names and "PYSPARK_GATEWAY_PORT" in os.environ):
        # With `launcher_names`, under spark-submit its --name names the app (a backfill's apart
        # from the live driver's: the History Server lists them by it); an appName would override it.
        builder = builder.appName(app_name)
    if master:
        builder = builder.master(master)
    # Under spark-submit the JVM already runs (PYSPARK_GATEWAY_PORT is set) and the launcher
    # passed the connector with --jars; started from plain Python, hand Spark the jars here.
    conf = {**BASE_CONF, **(extra_conf or {}), **REDACTION_CONF}
    if "PYSPARK_GATEWAY_PORT" not in os.environ:
        builder = builder.config("spark.jars", ",".join(str(jar) for jar in driver_jars()))
        # This process starts the JVM: its log lines go to stdout (see log4j2.properties).
        java_options = f"-Dlog4j2.configurationFile={LOG4J2_CONFIG.as_uri()} {conf.get('spark.driver.extraJavaOptions', '')}"
        conf["spark.driver.extraJavaOptions"] = java_options.strip()
    for key, value in conf.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


def apply_app_conf(spark: SparkSession, spec: AppSpec) -> None:
    """Set the app's SQL conf on the session before its queries start (they capture it)."""
    for key, value in {**BASE_CONF, **spec.spark_conf, **REDACTION_CONF}.items():
        if key.startswith("spark.sql."):
            spark.conf.set(key, str(value).lower() if isinstance(value, bool) else str(value))
