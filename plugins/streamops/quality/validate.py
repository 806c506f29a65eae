"""Validate bounded ranges of output topics with their Great Expectations suites.

Per topic: read the range as a Spark batch and decode it (batches.py), run the suite's record
expectations on it, build the reconciliation batch when the suite has cross-record checks
(reconcile.py) and run those on it; both runs go through a GX Checkpoint that updates the
Data Docs site. Failures come back with sample offending records and their offsets; every
topic's outcome is appended to the results store (results.py).

GX keeps its project (suites, validation results, Data Docs) under <quality root>/gx.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from confluent_kafka.admin import AdminClient
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from streamops.app_runtime import AppRuntime, DriverRecord
from streamops.catalog import Catalog
from streamops.kafka_client import KafkaClientConfig
from streamops.quality import reconcile, results
from streamops.quality.batches import read_decoded
from streamops.quality.docs import airflow_base_url, ui_link
from streamops.quality.ranges import TopicRange
from streamops.quality.suites import TopicSuite, load_suite
from streamops.timestamps import iso_seconds_utc, utc_now

log = logging.getLogger(__name__)

SAMPLES = 5  # offending records shown per failed expectation
_VALUE_PREVIEW = 300
_DATA_SOURCE = "kafka-ranges"


class QualityCheckFailed(RuntimeError):
    """At least one critical expectation failed; the message lists them all."""


@dataclass
class FailedExpectation:
    part: str  # "records" or "reconciliation"
    expectation: str  # e.g. expect_column_values_to_be_in_set(op_type)
    description: str
    severity: str
    unexpected: int | None
    checked: int | None
    samples: list[str] = field(default_factory=list)

    def headline(self) -> str:
        counted = ""
        if self.unexpected is not None:
            counted = f": {self.unexpected} of {self.checked} rows" if self.checked is not None else f": {self.unexpected} rows"
        return f"{self.expectation} [{self.part}] ({self.description}){counted}"


@dataclass
class TopicResult:
    topic: str
    suite: str
    suite_file: str
    range: TopicRange
    records: int  # records actually read (a compacted range may hold fewer than its offsets)
    failures: list[FailedExpectation]
    warnings: list[FailedExpectation]
    reconciliation: dict | None
    docs_urls: list[str]
    written_by: str | None = None  # the code that wrote the topic (writer_code)

    @property
    def success(self) -> bool:
        return not self.failures

    def report(self) -> str:
        """The log block an operator reads."""
        status = "PASSED" if self.success else "FAILED"
        lines = [
            f"{status} {self.topic}: {self.records} record(s), {self.range.description} ({self.range.spans()}), "
            f"suite {self.suite} ({self.suite_file})" + (f", written by {self.written_by}" if self.written_by else "")
        ]
        if self.records == 0:
            lines.append("  the range holds no records: nothing was checked")
        if self.reconciliation:
            lines.append(f"  reconciliation: {self.reconciliation['note']}")
        for failure in self.failures:
            lines.append(f"  failed: {failure.headline()}")
            lines += [f"      {sample}" for sample in failure.samples]
        for warning in self.warnings:
            lines.append(f"  warning: {warning.headline()}")
            lines += [f"      {sample}" for sample in warning.samples]
        for url, link in zip(self.docs_urls, self.docs_links(), strict=True):
            lines.append(f"  Data Docs: {link}  (file on the worker: {url})" if link else f"  Data Docs: {url}")
        return "\n".join(lines)

    def docs_links(self) -> list[str | None]:
        """The Data Docs pages as Airflow UI addresses (None where not served)."""
        base = airflow_base_url()
        return [ui_link(url, base) for url in self.docs_urls]

    def to_json(self) -> dict:
        return {
            "topic": self.topic,
            "suite": self.suite,
            "success": self.success,
            "records": self.records,
            "range": self.range.to_json(),
            "failed_expectations": [f.headline() for f in self.failures],
            "warnings": [w.headline() for w in self.warnings],
            "reconciliation": self.reconciliation,
            "written_by": self.written_by,
            "data_docs": self.docs_urls,
            "data_docs_ui": [link for link in self.docs_links() if link],
        }


def gx_context(root: Path):
    """The GX file project under <root>/gx (created on first use), without progress bars."""
    import great_expectations as gx
    from great_expectations.data_context.types.base import ProgressBarsConfig

    context = gx.get_context(mode="file", project_root_dir=str(root))
    context.variables.progress_bars = ProgressBarsConfig(globally=False)
    return context


def validate_topics(
    spark: SparkSession | None,  # None: every range is empty (nothing is read)
    kafka: KafkaClientConfig,
    admin: AdminClient,
    catalog: Catalog,
    ranges: list[TopicRange],
    run_name: str,
    root: Path | None = None,
    written_by: dict[str, str] | None = None,
) -> list[TopicResult]:
    """Validate every range; record and return one result per topic (never raises for a
    failed expectation: see `raise_on_failures`). Each result, and its Data Docs run name, names
    the code that wrote the topic: `written_by` (app -> "version (digest)", e.g. a backfill's),
    else what the writing app's driver runs."""
    root = root or results.quality_root()
    context = gx_context(root)
    sources = reconcile.Sources(spark, kafka, admin, catalog)
    outcomes = []
    for topic_range in ranges:
        suite = load_suite(catalog, topic_range.topic)
        writer = writer_code(catalog, topic_range.topic, written_by)
        outcome = _validate_topic(context, sources, suite, topic_range, f"{run_name} [{writer}]" if writer else run_name)
        outcome.written_by = writer
        log.info("%s", outcome.report())
        results.record(
            {
                "run_name": run_name,
                "validated_at": iso_seconds_utc(utc_now()),
                "topic": outcome.topic,
                "suite": outcome.suite,
                "suite_file": outcome.suite_file,
                "range_description": topic_range.description,
                "range_offsets": topic_range.to_json()["partitions"],
                "records": outcome.records,
                "success": outcome.success,
                "failed_expectations": [f.headline() for f in outcome.failures],
                "warnings": [w.headline() for w in outcome.warnings],
                "reconciliation": outcome.reconciliation,
                "written_by": writer,
                "docs_url": outcome.docs_urls[0] if outcome.docs_urls else None,
            },
            root,
        )
        outcomes.append(outcome)
    return outcomes


def writer_code(catalog: Catalog, topic: str, written_by: dict[str, str] | None = None) -> str | None:
    """'oplog-router 1.2.0 sha256 1a2b3c4d5e6f' (an artifact) or '... installed': the code of the
    app that writes the topic (as given, else its driver's record); None: no app writes it."""
    writer = catalog.writer(topic)
    if writer is None:
        return None
    app = writer[0]
    if written_by and app.name in written_by:
        return f"{app.name} {written_by[app.name]}"
    record = AppRuntime(app.checkpoint_location()).driver() or DriverRecord()
    code = record.code
    # No ':' or '/': the run name becomes part of a Data Docs path.
    if code is None:
        said = "not run yet"
    elif code.artifact:
        said = f"sha256 {(code.digest or '').removeprefix('sha256:')[:12]}"
    else:
        said = "installed"
    return f"{app.name} {record.version or app.version} {said}"


def raise_on_failures(outcomes: list[TopicResult]) -> None:
    failed = [o for o in outcomes if not o.success]
    if failed:
        lines = [f"{len(failed)} of {len(outcomes)} topic(s) failed validation:"]
        for outcome in failed:
            lines += [f"  {outcome.topic}: {f.headline()}" for f in outcome.failures]
            lines += [f"    Data Docs: {url}" for url in outcome.docs_urls]
        raise QualityCheckFailed("\n".join(lines))


def _validate_topic(
    context, sources: reconcile.Sources, suite: TopicSuite, topic_range: TopicRange, run_name: str
) -> TopicResult:
    if topic_range.records == 0:
        # Nothing to read: no Spark job, no GX run; reported (and recorded) as an empty range.
        return TopicResult(topic_range.topic, suite.name, str(suite.path), topic_range, 0, [], [], None, [])
    spec = sources.catalog.topic(topic_range.topic)
    batch = read_decoded(sources.session(), sources.kafka, topic_range, spec).persist()
    try:
        records = batch.count()
        failures, warnings, urls = _run_part(context, suite, "records", batch, run_name, ["partition", "offset"])
        summary = None
        if suite.reconciliation and records:
            built = reconcile.build(suite.reconciliation, sources, topic_range.topic, topic_range, batch)
            summary = {"kind": suite.reconciliation, "note": built.note, **built.summary}
            if built.frame is not None:
                more_failures, more_warnings, more_urls = _run_part(
                    context, suite, "reconciliation", built.frame, run_name, None
                )
                failures += more_failures
                warnings += more_warnings
                urls += more_urls
                built.frame.unpersist()
        return TopicResult(
            topic=topic_range.topic,
            suite=suite.name,
            suite_file=str(suite.path),
            range=topic_range,
            records=records,
            failures=failures,
            warnings=warnings,
            reconciliation=summary,
            docs_urls=urls,
        )
    finally:
        batch.unpersist()


def _run_part(context, suite: TopicSuite, part: str, frame: DataFrame, run_name: str, index_columns: list[str] | None):
    """Validate `frame` with one part of the suite through a checkpoint that updates Data Docs."""
    import great_expectations as gx
    from great_expectations.core.expectation_suite import ExpectationSuite
    from great_expectations.core.run_identifier import RunIdentifier

    expectations = suite.record_expectations if part == "records" else suite.reconciliation_expectations
    name = suite.topic if part == "records" else f"{suite.topic} reconciliation"
    suite_name = suite.name if part == "records" else f"{suite.name}.reconciliation"
    gx_suite = context.suites.add_or_update(ExpectationSuite(name=suite_name, expectations=expectations, meta=suite.meta))
    data_source = context.data_sources.add_or_update_spark(_DATA_SOURCE)
    asset = next((a for a in data_source.assets if a.name == name), None) or data_source.add_dataframe_asset(name)
    batch_definition = next((b for b in asset.batch_definitions if b.name == "range"), None) or (
        asset.add_batch_definition_whole_dataframe("range")
    )
    definition = context.validation_definitions.add_or_update(
        gx.ValidationDefinition(name=name, data=batch_definition, suite=gx_suite)
    )
    result_format = {"result_format": "SUMMARY", "partial_unexpected_count": SAMPLES}
    if index_columns:
        result_format["unexpected_index_column_names"] = index_columns
    checkpoint = context.checkpoints.add_or_update(
        gx.Checkpoint(
            name=name,
            validation_definitions=[definition],
            actions=[gx.checkpoint.UpdateDataDocsAction(name="update data docs")],
            result_format=result_format,
        )
    )
    run = checkpoint.run(
        batch_parameters={"dataframe": frame},
        expectation_parameters=suite.parameters,
        run_id=RunIdentifier(run_name=run_name, run_time=datetime.now(UTC)),
    )
    failures: list[FailedExpectation] = []
    warnings: list[FailedExpectation] = []
    urls: list[str] = []
    for identifier, validation in run.run_results.items():
        urls += [site["site_url"] for site in context.get_docs_sites_urls(resource_identifier=identifier)]
        for result in validation.results:
            if result.success:
                continue
            failed = _describe(part, result, frame, index_columns)
            (failures if failed.severity == "critical" else warnings).append(failed)
    return failures, warnings, urls


def _describe(part: str, result, frame: DataFrame, index_columns: list[str] | None) -> FailedExpectation:
    config = result.expectation_config
    kwargs = config.kwargs
    columns = [kwargs[k] for k in ("column", "column_A", "column_B") if kwargs.get(k)]
    label = f"{config.type}({', '.join(columns)})" if columns else config.type
    severity = getattr(config.severity, "value", str(config.severity))
    outcome = result.result or {}
    samples: list[str] = []
    error = _raised(result.exception_info)
    if error:
        samples.append(f"the expectation could not be evaluated: {error}")
        return FailedExpectation(part, label, config.description or "", "critical", None, None, samples)
    if config.type == "unexpected_rows_expectation":
        # GX returns the rows only with result_format COMPLETE (every row, in memory): run the
        # query again for a few of them instead.
        view = f"streamops_failed_{abs(hash((part, label, kwargs['unexpected_rows_query']))):x}"
        frame.createOrReplaceTempView(view)
        rows = frame.sparkSession.sql(kwargs["unexpected_rows_query"].format(batch=view)).limit(SAMPLES).collect()
        samples = [_row_text(row.asDict()) for row in rows]
        return FailedExpectation(part, label, config.description or "", severity, outcome.get("observed_value"), None, samples)
    indexed = outcome.get("partial_unexpected_index_list") or []
    if index_columns and indexed:
        samples = _records_at(frame, indexed[:SAMPLES], columns)
    else:
        samples = [f"value {value!r}" for value in (outcome.get("partial_unexpected_list") or [])[:SAMPLES]]
    return FailedExpectation(
        part, label, config.description or "", severity, outcome.get("unexpected_count"), outcome.get("element_count"), samples
    )


def _raised(info) -> str | None:
    """The error message if GX could not evaluate the expectation. GX reports it either at the top
    of exception_info or per metric, nested one level down."""
    if not isinstance(info, dict):
        return None
    candidates = [info, *[v for v in info.values() if isinstance(v, dict)]]
    for candidate in candidates:
        if candidate.get("raised_exception"):
            return str(candidate.get("exception_message") or "unknown error")
    return None


def _records_at(frame: DataFrame, positions: list[dict], columns: list[str]) -> list[str]:
    """'partition 2 offset 14: key 'u-3', op_type 'SEND_MESSAGE', value {...}' per position."""
    wanted = F.lit(False)
    for position in positions:
        wanted = wanted | ((F.col("partition") == position["partition"]) & (F.col("offset") == position["offset"]))
    shown = ["partition", "offset", "key", *[c for c in columns if c != "key"], "value"]
    rows = {(r["partition"], r["offset"]): r for r in frame.where(wanted).select(*shown).collect()}
    out = []
    for position in positions:
        row = rows.get((position["partition"], position["offset"]))
        if row is None:
            out.append(f"partition {position['partition']} offset {position['offset']}")
            continue
        fields = ", ".join(f"{c} {row[c]!r}" for c in shown[2:-1])
        value = (
            row["value"] if row["value"] is None or len(row["value"]) <= _VALUE_PREVIEW
            else row["value"][:_VALUE_PREVIEW] + "..."
        )
        out.append(f"partition {row['partition']} offset {row['offset']}: {fields}, value {value}")
    return out


def _row_text(row: dict) -> str:
    return ", ".join(f"{key} {json.dumps(value, default=str)}" for key, value in row.items())
