"""Checks that the Python, Spark, connector and broker versions fit together.

`python -m streamops.toolchain check` is the last step of bin/setup;
`python -m streamops.toolchain prune-connector-jars` drops connector dependencies Spark ships.
"""

from __future__ import annotations

import re
import sys
from importlib.metadata import version
from pathlib import Path

from streamops.paths import CONTRACT_JAR, KAFKA_BROKER_JARS, SPARK_KAFKA_JARS

_JAR = re.compile(r"^(?P<artifact>.+)-(?P<version>\d+\.\d+[\w.\-]*)\.jar$")


def spark_jars_dir() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent / "jars"


def _artifacts(directory: Path) -> dict[str, str]:
    found = {}
    for jar in directory.glob("*.jar"):
        match = _JAR.match(jar.name)
        if match:
            found[match["artifact"]] = match["version"]
    return found


def driver_jars() -> list[Path]:
    """The jars to hand Spark (spark.jars) beside its own: the Kafka source and sink, and the input
    contract's JVM side (streamops.records' fast path)."""
    jars = sorted(SPARK_KAFKA_JARS.glob("*.jar"))
    if not any(j.name.startswith("spark-sql-kafka-0-10_") for j in jars):
        raise FileNotFoundError(f"the Spark Kafka connector is missing from {SPARK_KAFKA_JARS}: run bin/setup")
    if not CONTRACT_JAR.is_file():
        raise FileNotFoundError(f"the input contract's jar is missing ({CONTRACT_JAR}): run bin/setup")
    return [*jars, CONTRACT_JAR]


def prune_connector_jars() -> list[str]:
    shipped = _artifacts(spark_jars_dir())
    removed = []
    for jar in SPARK_KAFKA_JARS.glob("*.jar"):
        match = _JAR.match(jar.name)
        if match and match["artifact"] in shipped:
            jar.unlink()
            removed.append(jar.name)
    return sorted(removed)


def check() -> list[str]:
    """Every problem with the installed mix; empty when it is sound."""
    import pyspark

    problems = []
    spark_jars = _artifacts(spark_jars_dir())
    core = spark_jars.get("spark-core_2.13")
    if pyspark.__version__ != core:
        problems.append(
            f"pyspark.__version__ is {pyspark.__version__} but its jars are spark-core {core}: "
            "pyspark-client probably overwrote the pyspark package; rerun bin/setup"
        )
    for dist in ("pyspark", "pyspark-client"):
        if version(dist) != pyspark.__version__:
            problems.append(f"{dist} distribution is {version(dist)}, pyspark.__version__ is {pyspark.__version__}")
    connector = _artifacts(SPARK_KAFKA_JARS)
    for artifact in ("spark-sql-kafka-0-10_2.13", "spark-token-provider-kafka-0-10_2.13"):
        if connector.get(artifact) != pyspark.__version__:
            problems.append(
                f"{artifact} is {connector.get(artifact, 'missing')} in {SPARK_KAFKA_JARS}, "
                f"Spark is {pyspark.__version__}"
            )
    if not any(KAFKA_BROKER_JARS.glob("kafka_2.13-*.jar")):
        problems.append(f"the Kafka broker jars are missing from {KAFKA_BROKER_JARS}")
    return problems


def main(argv: list[str]) -> int:
    command = argv[1] if len(argv) > 1 else "check"
    if command == "prune-connector-jars":
        removed = prune_connector_jars()
        if removed:
            print(f"[setup] dropped {len(removed)} connector dependencies Spark already ships: {', '.join(removed)}")
        return 0
    if command == "check":
        import pyspark

        problems = check()
        if problems:
            print("[setup] the installed versions do not fit together:", file=sys.stderr)
            for problem in problems:
                print(f"  - {problem}", file=sys.stderr)
            return 1
        broker = next(KAFKA_BROKER_JARS.glob("kafka_2.13-*.jar")).name.removeprefix("kafka_2.13-").removesuffix(".jar")
        print(
            f"[setup] versions fit: pyspark {pyspark.__version__} = Spark jars = Kafka connector; "
            f"Kafka broker {broker}; apache-airflow {version('apache-airflow')}; "
            f"great-expectations {version('great-expectations')}; confluent-kafka {version('confluent-kafka')}"
        )
        return 0
    print(f"unknown command {command!r}: use check or prune-connector-jars", file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
