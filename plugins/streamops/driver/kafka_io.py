"""Kafka source and sink options, written once."""

from __future__ import annotations

from pyspark.sql import DataFrame, SparkSession

from streamops.catalog import ProducerSettings
from streamops.kafka_client import KafkaClientConfig

# A read of a bounded offset range (a batch read, a micro-batch) ends with one fetch past the last
# record it needs, which the broker holds for fetch.max.wait.ms (Kafka's default: 500 ms) when no
# newer record exists yet: measured here, every task of such a read took about 0.6 s for a few hundred
# records, and a 6-partition read on 2 cores about 2 s instead of 0.5 s. A fetch that finds records
# returns at once whatever this says, so only the wait at the end gets shorter. Real-time mode reads
# without an end and keeps Kafka's long poll (it would otherwise ask the broker again every few ms).
#
# max.poll.records: Spark's consumer asks for records 500 at a time (Kafka's default) and pays a
# poll per 500; 5,000 read a 200,000-record backlog in 0.6 s instead of 1.0 s here (the fetch
# size limits, max.partition.fetch.bytes, still bound the memory a poll holds).
BOUNDED_READ_OPTIONS = {"kafka.fetch.max.wait.ms": "20", "kafka.max.poll.records": "5000"}


def read_topics(
    spark: SparkSession,
    kafka: KafkaClientConfig,
    topics: list[str],
    starting_offsets: str = "earliest",
    max_offsets_per_trigger: int | None = None,
    group_id_prefix: str | None = None,
    real_time: bool = False,
) -> DataFrame:
    """A streaming DataFrame of raw Kafka records (key, value, topic, partition, offset, timestamp).

    `starting_offsets` applies only to a new checkpoint: an existing one resumes where it was.
    """
    reader = (
        spark.readStream.format("kafka")
        .options(**kafka.spark_options())
        .options(**({} if real_time else BOUNDED_READ_OPTIONS))
        .option("subscribe", ",".join(topics))
        .option("startingOffsets", starting_offsets)
        # Records deleted by retention before we read them are a loss: fail, do not skip.
        .option("failOnDataLoss", "true")
    )
    if max_offsets_per_trigger:
        reader = reader.option("maxOffsetsPerTrigger", str(max_offsets_per_trigger))
    if group_id_prefix:
        # Spark's consumer groups under the app's own prefix, which its ACLs allow (terraform/).
        reader = reader.option("groupIdPrefix", group_id_prefix)
    return reader.load()


def kafka_sink_options(kafka: KafkaClientConfig, producer: ProducerSettings) -> dict[str, str]:
    """Writer options of every sink: the connection, then the app's producer settings from the
    catalog (acks from all in-sync replicas and idempotent retries always)."""
    return {**kafka.spark_options(), **{f"kafka.{k}": v for k, v in producer.kafka_settings().items()}}
