"""The suite's JVM-side functions called from Python programs (build/maven/streamops-contract, one
jar on every driver's spark.jars; bin/setup compiles it).

A program hands a frame to a static Java method that builds on it (a per-key state function, say)
and gets a frame back: the rows never leave the JVM. Each such class states the version of its
rules (`logicVersion()`), and the program names the version it was written against, so an app never
runs against a jar whose rules differ from those its code expects (the jar ships with the
platform, not with the app's artifact).

This is Spark's private py4j bridge (`DataFrame._jdf`, `SparkSession._jvm`): PySpark has no public
API to call a JVM method on a DataFrame. It needs a classic session (not Spark Connect), which every
driver of the suite is.
"""

from __future__ import annotations

from typing import Any

from py4j.java_gateway import JavaClass
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.classic.dataframe import DataFrame as ClassicDataFrame


class JvmFunctionUnavailable(RuntimeError):
    """The class is not on this session's classpath, or its rules are not the version expected."""


def _java_class(session: SparkSession, class_name: str) -> Any:
    jvm = getattr(session, "_jvm", None)
    if jvm is None:
        raise JvmFunctionUnavailable(
            f"{class_name} runs in the driver's JVM, and this Spark session has none here (Spark Connect?): "
            "run the app with `streamops app run` or the suite's DAGs, which start a classic driver")
    found: Any = jvm
    for part in class_name.split("."):
        found = getattr(found, part)
    if not isinstance(found, JavaClass):
        jars = session.conf.get("spark.jars", "") or "none"
        raise JvmFunctionUnavailable(
            f"{class_name} is not on this driver's classpath (spark.jars: {jars}): the suite's jar "
            "(streamops-contract.jar) is older than this code; rebuild it (bin/setup here, the images' build in docker/)")
    return found


def require_version(session: SparkSession, class_name: str, expected: str) -> None:
    """Refuse to build on `class_name` unless its rules are version `expected`."""
    found = str(_java_class(session, class_name).logicVersion())
    if found != expected:
        raise JvmFunctionUnavailable(
            f"{class_name} on this driver's classpath follows rules version {found}, and this app's code was "
            f"written for version {expected}: the jar and the app's code come from different releases of the suite; "
            "run bin/setup on this host (or deploy the app version made for this platform)")


def call(frame: DataFrame, class_name: str, method: str, *args: Any) -> DataFrame:
    """`class_name.method(frame, *args)`, a static Java method from Dataset<Row> to Dataset<Row>."""
    java_class = _java_class(frame.sparkSession, class_name)
    built = getattr(java_class, method)(frame._jdf, *args)  # noqa: SLF001 - py4j bridge, see the module doc
    return ClassicDataFrame(built, frame.sparkSession)
