"""Spark settings that would run a command or load code of the author's choosing if they ever
reached spark-submit, each with the one-line refusal the code gives."""

from __future__ import annotations

from pathlib import Path

from streamops.launch_overrides import allowed_keys_text

KEY_REFUSED = ("spark_conf: key {key!r} may not be set at trigger time (allowed: " + allowed_keys_text()
               + "; everything else comes from the catalog)")


def hostile_confs(canary: Path, evil_python: Path) -> list[tuple[dict, str]]:
    """(spark_conf, the one-line refusal the code gives). Each would run `touch canary` or load
    code of the author's choosing if it reached spark-submit."""
    by_key = {
        # Metaspace this small fails the JVM at start-up, which runs the OnOutOfMemoryError command.
        "spark.driver.extraJavaOptions": f"-XX:MaxMetaspaceSize=16m -XX:OnOutOfMemoryError='touch {canary}'",
        "spark.executor.extraJavaOptions": f"-XX:MaxMetaspaceSize=16m -XX:OnOutOfMemoryError='touch {canary}'",
        "spark.pyspark.python": str(evil_python),
        "spark.pyspark.driver.python": str(evil_python),
        "spark.driver.extraClassPath": str(canary.parent),
        "spark.jars": f"file://{canary.parent}/evil.jar",
        "spark.driver.extraLibraryPath": str(canary.parent),
        # A key with a line break, hoping to smuggle a second setting.
        "spark.driver.memory\nspark.pyspark.python": str(evil_python),
    }
    cases = [({key: value}, KEY_REFUSED.format(key=key)) for key, value in by_key.items()]
    size = "a size from 512m to 64g, such as '2g' or '512m'"
    cases += [
        ({"spark.driver.memory": f"2g; touch {canary}"},
         f"spark_conf: spark.driver.memory = '2g; touch {canary}' must be {size}"),
        ({"spark.driver.memory": f"$(touch {canary})"},
         f"spark_conf: spark.driver.memory = '$(touch {canary})' must be {size}"),
        ({"spark.sql.shuffle.partitions": 100_000},
         "spark_conf: spark.sql.shuffle.partitions = 100000 must be a whole number from 1 to 10000"),
        ({"spark.driver.memory": "100g"}, f"spark_conf: spark.driver.memory = '100g' must be {size}"),
    ]
    return cases
