"""A class-data-sharing archive for the drivers the tests launch (JDK AppCDS).

Every driver is a fresh JVM that loads Spark's, Kafka's and RocksDB's classes from jars: on this
2-core host that is most of the 10-15 s a driver takes from spark-submit to its first batch, and
most integration tests launch several drivers. The JVM can dump the classes one run loaded into an
archive (-XX:ArchiveClassesAtExit) and map it at the next start (-XX:SharedArchiveFile); measured
here, a local Spark session plus its first job went from about 16 s to about 10 s.

The archive is built from a real run of the router (spark-submit with the Kafka connector, a few
records routed, stopped gracefully so its JVM exits and writes the archive), once per machine: it
is kept in .cache/class-archives/ under a name derived from the JVM, Spark's jars, the connector
and the drivers' JVM options, so a change to any of them builds a new one. The JVM checks an
archive against its own build and class path anyway and ignores one that does not fit (silently
here: -Xlog:cds=off), so a missing or stale archive only costs the time it would save.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
import uuid
from pathlib import Path

from streamops.class_archive import SILENT, jvm_still_writing
from streamops.class_archive import archive_path as product_archive_path
from streamops.waiting import DeadlineExceeded, poll_until

ARCHIVE_SILENT = SILENT


def archive_path(cache_dir: Path, base_opts: str) -> Path:
    """Where the archive for this JVM, Spark, connector and JVM options is kept (the drivers' own
    naming, streamops.class_archive, in the tests' folder)."""
    return product_archive_path(base_opts, cache_dir)


def build_driver_class_archive(archive: Path, work_dir: Path, kafka, admin, base_opts: str) -> str:
    """Run the router once with the archive dump on, into `archive` (older archives beside it are
    removed); return what happened, for the session log. `base_opts`: the drivers' own JVM options
    (kept, so the archive is made as it will be used)."""
    from streamops.app_ops import launch
    from streamops.app_runtime import AppRuntime
    from streamops.catalog import load_catalog
    from streamops.dag_tasks.connections import spark_target
    from streamops.loadgen import LoadSpec
    from streamops.loadgen import run as run_load
    from streamops.provisioning import ensure_topics
    from streamops.spark_submit import submit_spec
    from tests.support import LOCAL_SPARK_CONNECTION
    from tests.support.routes import wait_until_all_routed

    began = time.monotonic()
    catalog = load_catalog().with_topic_prefix(f"cds{uuid.uuid4().hex[:8]}")
    ensure_topics(admin, catalog.topics)
    work_dir.mkdir(parents=True, exist_ok=True)
    catalog_file = work_dir / "catalog.yaml"
    catalog_file.write_text(catalog.to_yaml())
    router = catalog.app("oplog-router")
    checkpoint = work_dir / "checkpoint"
    spec = submit_spec(router, kafka=kafka, catalog=catalog_file, checkpoint=str(checkpoint))
    saved = {key: os.environ.get(key) for key in ("AIRFLOW_CONN_SPARK_DEFAULT", "SPARK_SUBMIT_OPTS")}
    os.environ["AIRFLOW_CONN_SPARK_DEFAULT"] = LOCAL_SPARK_CONNECTION
    dump = archive.with_name(f"{archive.name}.partial-{os.getpid()}")  # only a whole archive gets the name
    archive.parent.mkdir(parents=True, exist_ok=True)
    os.environ["SPARK_SUBMIT_OPTS"] = f"{base_opts} -XX:ArchiveClassesAtExit={dump}".strip()
    try:
        launch(router, spec.argv(spark_target()), checkpoint=str(checkpoint), launched_by="tests (class archive)",
               version=router.version)
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    runtime = AppRuntime(checkpoint)
    try:
        run_load(router, LoadSpec(count=60, keys=6, seed=7), kafka)
        wait_until_all_routed(kafka, router, timeout=240, what="the class-archive run to route its records")
    finally:
        runtime.request_stop(by="tests (class archive built)")
    try:
        poll_until(lambda: not runtime.is_running() and not jvm_still_writing(dump), timeout=240,
                   what="the class-archive driver's JVM to exit")
    except DeadlineExceeded as exc:
        record = runtime.driver()
        if record is not None and record.process_group:  # started here, so stopped here
            with contextlib.suppress(ProcessLookupError):
                os.killpg(record.process_group, signal.SIGKILL)
        dump.unlink(missing_ok=True)  # perhaps half written
        return f"driver class archive: not built ({exc}); drivers start without one"
    if not dump.exists():
        return f"driver class archive: the JVM wrote none (see {work_dir}); drivers start without one"
    for older in archive.parent.glob("driver-*.jsa"):
        older.unlink(missing_ok=True)
    dump.rename(archive)
    return (f"driver class archive: built {archive} ({archive.stat().st_size // 2**20} MB) in "
            f"{time.monotonic() - began:.0f} s; drivers start with it")
