"""What an operator may change about an app's launch when triggering a DAG: a version label and a
short allow-list of Spark tuning keys with typed, bounded values.

Everything else about a launch (programs, paths, classes, URLs, JVM options, jars, the Python
that runs) comes only from the reviewed catalog: a Spark conf such as
`spark.driver.extraJavaOptions=-XX:OnOutOfMemoryError=...` or `spark.pyspark.python` runs any
program its author names, so whoever may trigger a DAG must not be able to set it.

One declaration (`ALLOWED_SPARK_CONF`) gives both the trigger form's JSON schema
(`spark_conf_schema`) and the check in code (`checked_spark_conf`), which also re-checks the conf
read back from a launch record on disk before a restart or rollback uses it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from streamops.name_patterns import VERSION_PATTERN
from streamops.refusals import OneLineRefused

# Versions as the catalog writes them (streamops.catalog.VERSION_PATTERN), bounded in length.
VERSION_MAX_LENGTH = 64

# A memory size as Spark reads it, in whole MiB or GiB only ("512m", "4g").
_SIZE = re.compile(r"([1-9][0-9]{0,5})([mg])")
_WHOLE_NUMBER = re.compile(r"[0-9]{1,9}")


def whole_number_pattern(low: int, high: int) -> str:
    """A regular expression (no anchors) matching exactly the decimal numbers low..high (low >= 1),
    so a form's text field is bounded like a number: split the range into blocks that share a
    prefix and vary one digit, e.g. 384..1000 -> 38[4-9]|39[0-9]|[4-9][0-9]{2}|1000."""
    blocks = []
    while low <= high:
        power = 1  # the largest 10**k block that starts at `low` and fits
        while low % (power * 10) == 0 and low + power * 10 - 1 <= high:
            power *= 10
        digit = (low // power) % 10
        width = 1  # how many values of that digit fit
        while digit + width < 10 and low + (width + 1) * power - 1 <= high:
            width += 1
        prefix = str(low // (power * 10)) if low >= power * 10 else ""
        digits = str(digit) if width == 1 else f"[{digit}-{digit + width - 1}]"
        zeros = len(str(power)) - 1
        blocks.append(prefix + digits + ("[0-9]" if zeros == 1 else f"[0-9]{{{zeros}}}" if zeros else ""))
        low += width * power
    return "|".join(blocks)


@dataclass(frozen=True)
class ConfKey:
    """One Spark conf key a trigger may set: its value's kind and bounds (sizes in MiB)."""

    key: str
    kind: Literal["size", "count", "flag"]
    help: str
    minimum: int = 0
    maximum: int = 0

    def bounds(self) -> str:
        if self.kind == "size":
            return f"a size from {_mib_text(self.minimum)} to {_mib_text(self.maximum)}, such as '2g' or '512m'"
        if self.kind == "count":
            return f"a whole number from {self.minimum} to {self.maximum}"
        return "true or false"

    def schema(self) -> dict:
        described = f"{self.help} ({self.bounds()})."
        if self.kind == "size":
            return {"type": "string", "pattern": self.size_pattern(), "maxLength": 7, "description": described}
        if self.kind == "count":
            return {"type": "integer", "minimum": self.minimum, "maximum": self.maximum, "description": described}
        return {"type": "boolean", "description": described}

    def size_pattern(self) -> str:
        """The bounds of a size as a pattern: MiB from minimum to maximum, or the whole GiB between."""
        alternatives = [f"({whole_number_pattern(self.minimum, self.maximum)})m"]
        if -(-self.minimum // 1024) <= self.maximum // 1024:
            alternatives.append(f"({whole_number_pattern(-(-self.minimum // 1024), self.maximum // 1024)})g")
        return "^(" + "|".join(alternatives) + ")$"

    def normalised(self, value: object) -> str | None:
        """The value as spark-submit gets it, or None if it is not of this key's kind and bounds.
        Strings of the right shape are accepted too: launch records store the normalised text."""
        if self.kind == "size":
            match = _SIZE.fullmatch(value) if isinstance(value, str) else None
            if not isinstance(value, str) or not match:
                return None
            mib = int(match[1]) * (1024 if match[2] == "g" else 1)
            return value if self.minimum <= mib <= self.maximum else None
        if self.kind == "count":
            if isinstance(value, str) and _WHOLE_NUMBER.fullmatch(value):
                value = int(value)
            if isinstance(value, bool) or not isinstance(value, int) or not self.minimum <= value <= self.maximum:
                return None
            return str(value)
        if isinstance(value, bool):
            return "true" if value else "false"
        return value if value in ("true", "false") else None


def _mib_text(mib: int) -> str:
    return f"{mib // 1024}g" if mib % 1024 == 0 else f"{mib}m"


# Tuning only: memory, cores, parallelism. Nothing that names a program, path, class, URL or JVM option.
ALLOWED_SPARK_CONF: dict[str, ConfKey] = {
    entry.key: entry
    for entry in (
        ConfKey("spark.driver.memory", "size", "Driver heap", 512, 64 * 1024),
        ConfKey("spark.executor.memory", "size", "Executor heap", 512, 256 * 1024),
        ConfKey("spark.driver.memoryOverhead", "size", "Driver off-heap overhead", 384, 32 * 1024),
        ConfKey("spark.executor.memoryOverhead", "size", "Executor off-heap overhead", 384, 64 * 1024),
        ConfKey("spark.driver.cores", "count", "Driver cores", 1, 64),
        ConfKey("spark.executor.cores", "count", "Cores per executor", 1, 64),
        ConfKey("spark.executor.instances", "count", "Executors (YARN, Kubernetes)", 1, 500),
        ConfKey("spark.cores.max", "count", "Cores in all (standalone cluster)", 1, 4096),
        ConfKey("spark.sql.shuffle.partitions", "count",
                "Shuffle partitions (a stateful query keeps its checkpoint's number)", 1, 10000),
        ConfKey("spark.default.parallelism", "count", "Default RDD parallelism", 1, 10000),
        ConfKey("spark.sql.streaming.minBatchesToRetain", "count", "Checkpoint batches kept for recovery", 10, 10000),
        ConfKey("spark.sql.streaming.noDataMicroBatches.enabled", "flag",
                "Run a batch without new data to advance watermarks"),
    )
}


class LaunchOverrideRefused(OneLineRefused):
    """A trigger-time override (or a launch record read back) that is not allowed; names every
    problem on one line, and what is allowed."""


def allowed_keys_text() -> str:
    return ", ".join(ALLOWED_SPARK_CONF)


def spark_conf_schema() -> dict:
    """The JSON schema of a trigger form's `spark_conf` object (keyword arguments of a Param)."""
    return {
        # Optional: null (empty in the form) is "no overrides"; an object gives them.
        "type": ["null", "object"],
        "properties": {key: entry.schema() for key, entry in ALLOWED_SPARK_CONF.items()},
        "additionalProperties": False,
        "title": "Spark conf",
        "description": (
            "Optional. Tuning overrides for spark-submit, e.g. {\"spark.driver.memory\": \"2g\"}. Only these keys: "
            f"{allowed_keys_text()}. Everything else (programs, paths, jars, JVM options) comes from the catalog."
        ),
    }


def checked_spark_conf(spark_conf: object, where: str = "spark_conf") -> dict[str, str]:
    """`spark_conf` with every value normalised to the text spark-submit gets, or
    LaunchOverrideRefused naming each key that is not allowed or whose value is out of bounds."""
    if spark_conf is None:
        return {}
    if not isinstance(spark_conf, Mapping):
        raise LaunchOverrideRefused([f"{where} must be an object of Spark conf keys to values, got {type(spark_conf).__name__}"])
    problems: list[str] = []
    refused_keys: list[str] = []
    checked: dict[str, str] = {}
    for key, value in spark_conf.items():
        entry = ALLOWED_SPARK_CONF.get(key) if isinstance(key, str) else None
        if entry is None:
            refused_keys.append(repr(key))
            continue
        normalised = entry.normalised(value)
        if normalised is None:
            problems.append(f"{where}: {key} = {value!r} must be {entry.bounds()}")
        else:
            checked[key] = normalised
    if refused_keys:
        problems.insert(0, f"{where}: {'key' if len(refused_keys) == 1 else 'keys'} {', '.join(refused_keys)} may not be "
                           f"set at trigger time (allowed: {allowed_keys_text()}; everything else comes from the catalog)")
    if problems:
        raise LaunchOverrideRefused(problems)
    return checked


def checked_version(version: object, where: str = "version") -> str | None:
    """The version label (None: the catalog's), or LaunchOverrideRefused: it reaches argv and paths."""
    if version is None or version == "":
        return None
    if not isinstance(version, str) or len(version) > VERSION_MAX_LENGTH or not re.fullmatch(VERSION_PATTERN, version):
        raise LaunchOverrideRefused([f"{where} {version!r} must be a semantic version such as 1.2.0 or 1.2.0-rc.1 "
                                     f"(digits, dots, letters and '-+' only, at most {VERSION_MAX_LENGTH} characters)"])
    return version


def required_version(version: str, where: str = "version") -> str:
    """A version label that must be there (one the suite made itself, say), checked like a trigger's."""
    checked = checked_version(version, where)
    if checked is None:
        raise LaunchOverrideRefused([f"{where} is empty: a version label is needed here"])
    return checked
