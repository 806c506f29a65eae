"""Every environment variable streamops reads, in one place: its name, its default and what it is for.

Modules read a variable through its `Setting` here (`settings.CHECKPOINT_ROOT.get()`), never through
`os.environ` directly, so this list is complete (a unit test checks that) and `streamops settings`
can print each with the value in effect. An empty value counts as unset everywhere.

Three kinds: what an operator sets (where things live, which catalog and environment, how the
supervisor and the lease behave), what the suite sets for a driver it starts (an operator never
needs these), and the ports and folders of the local dev stack.

Not pydantic-settings: each value is read when it is used (a test or a CLI command may set it just
before), and each user checks its own value with its own message, so one bad variable refuses only
what uses it instead of every import of the package.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

OPERATOR = "operator"
DRIVER = "set for a driver"
LOCAL_STACK = "local stack"


@dataclass(frozen=True)
class Setting:
    name: str
    default: str  # as an operator reads it; the module that uses the value computes it
    doc: str
    kind: str = OPERATOR

    def get(self) -> str | None:
        """The value in the environment, or None when unset or empty."""
        return os.environ.get(self.name) or None


# --- what an operator sets -------------------------------------------------------------------------
HOME = Setting("STREAMOPS_HOME", "the checkout", "the project's root (images relocate it)")
RUN_DIR = Setting("STREAMOPS_RUN_DIR", "<home>/.run", "runtime state of the local stack: pid files, logs, data")
CATALOG = Setting("STREAMOPS_CATALOG", "<home>/catalog/pipelines.yaml", "the catalog file, the one source of truth")
ENVIRONMENT = Setting("STREAMOPS_ENVIRONMENT", "local", "the catalog environment to work in (its cluster, overrides)")
CHECKPOINT_ROOT = Setting("STREAMOPS_CHECKPOINT_ROOT", "<home>/.run/checkpoints",
                          "where relative app checkpoints live (and their runtime folders: a shared mount across hosts)")
AUDIT_LOG = Setting("STREAMOPS_AUDIT_LOG", "<checkpoint root>/_audit/audit.jsonl", "the audit log of every mutating DAG run")
ARTIFACT_STORE = Setting("STREAMOPS_ARTIFACT_STORE", "<run dir>/artifacts",
                         "the store of immutable app artifacts (a shared folder on a cluster)")
QUALITY_ROOT = Setting("STREAMOPS_QUALITY_ROOT", "<run dir>/quality", "validation results and the Data Docs site")
REPROCESS_ROOT = Setting("STREAMOPS_REPROCESS_ROOT", "<run dir>/reprocess", "the work folders of reprocessing runs")
SERVE_DATA_DOCS = Setting("STREAMOPS_SERVE_DATA_DOCS", "true",
                          "false: the Airflow plugin does not serve the Data Docs (publish the site your own way)")
METRICS_TOKEN_FILE = Setting("STREAMOPS_METRICS_TOKEN_FILE", "unset (UI login only)",
                             "a file holding the bearer token Prometheus scrapes /streamops/metrics with")
SUPERVISOR = Setting("STREAMOPS_SUPERVISOR", "scheduled",
                     "scheduled: app_status every 2 minutes and at once when a driver ends; events: only when a driver "
                     "ends; manual: no schedule (another supervisor watches)")
SNAPSHOTS = Setting("STREAMOPS_SNAPSHOTS", "scheduled",
                    "scheduled: snapshot_checkpoints every 10 minutes takes the snapshots the catalog's policies make due "
                    "and prunes the rest; manual: only when triggered")
LEASE_TTL_S = Setting("STREAMOPS_LEASE_TTL_S", "30", "seconds a driver's lease outlives its last heartbeat (2-3600)")
HOST_ADDRESS = Setting("STREAMOPS_HOST_ADDRESS", "this host's FQDN",
                       "the address this host is known by (Airflow's task hostname, a lease holder's address)")
STOP_DEADLINE = Setting("STREAMOPS_STOP_DEADLINE", "60", "seconds a graceful stop waits for the running batch")
CLASS_ARCHIVE = Setting("STREAMOPS_CLASS_ARCHIVE", "on",
                        "off: drivers start without this host's shared JVM class archive (streamops.class_archive)")
CONTRACT_JVM = Setting("STREAMOPS_CONTRACT_JVM", "on",
                       "off: records.parse checks every record with Spark's SQL checks alone, not first with the input "
                       "contract's JVM pass (streamops.contract; the same outcome, slower)")
SPARK_EVENT_LOG_DIR = Setting("STREAMOPS_SPARK_EVENT_LOG_DIR", "<checkpoint root>/_spark-events",
                              "where every driver and backfill writes its Spark event log (rolling); the History "
                              "Server reads it: a folder every driver host reaches, as the checkpoints")
SPARK_HISTORY_URL = Setting("STREAMOPS_SPARK_HISTORY_URL", "http://127.0.0.1:<history port>",
                            "the Spark History Server the apps page links each past driver to")
KAFKA_CONFIG = Setting("STREAMOPS_KAFKA_CONFIG", "unset", "`streamops app run`: a Kafka client settings file (librdkafka keys)")
KAFKA_BOOTSTRAP = Setting("STREAMOPS_KAFKA_BOOTSTRAP", "127.0.0.1:9092",
                          "a driver started by hand without --kafka-config: a PLAINTEXT Kafka without credentials")

# --- what the suite sets for a driver it starts ----------------------------------------------------
LAUNCHED_BY = Setting("STREAMOPS_LAUNCHED_BY", "command line", "who started the driver (a DAG run id), for its record", DRIVER)
DRIVER_LOG = Setting("STREAMOPS_DRIVER_LOG", "unset", "the driver's log file, for its record", DRIVER)
LAUNCH = Setting("STREAMOPS_LAUNCH", "{}", "the launch record (version, Spark settings, launch id), for a restart", DRIVER)

# --- the local dev stack ---------------------------------------------------------------------------
KAFKA_PORT = Setting("STREAMOPS_KAFKA_PORT", "9092", "the local broker's client port", LOCAL_STACK)
KAFKA_DATA_DIR = Setting("STREAMOPS_KAFKA_DATA_DIR", "<run dir>/kafka/data", "the local broker's data", LOCAL_STACK)
KAFKA_JVM_OPTIONS = Setting("STREAMOPS_KAFKA_JVM_OPTIONS", "unset",
                            "extra JVM options of the local Kafka broker and the secured cluster's nodes, e.g. "
                            "-XX:TieredStopAtLevel=1 where they live minutes (the tests), not days", LOCAL_STACK)
AIRFLOW_PORT = Setting("STREAMOPS_AIRFLOW_PORT", "8080", "the local Airflow's API server port", LOCAL_STACK)
CLUSTER_DIR = Setting("STREAMOPS_CLUSTER_DIR", "<run dir>/kafka-secure", "the secured three-node cluster's state", LOCAL_STACK)
CLUSTER_PORTS = Setting("STREAMOPS_CLUSTER_PORTS", "19092,19093,19094", "its client,controller,internal ports", LOCAL_STACK)
SPARK_DIR = Setting("STREAMOPS_SPARK_DIR", "<run dir>/spark-standalone", "the Spark standalone cluster's state", LOCAL_STACK)
SPARK_PORTS = Setting("STREAMOPS_SPARK_PORTS", "17077,18080,17078,18081", "its master,master-ui,worker,worker-ui ports",
                      LOCAL_STACK)
SPARK_HISTORY_PORT = Setting("STREAMOPS_SPARK_HISTORY_PORT", "18180", "the local Spark History Server's port",
                             LOCAL_STACK)
METADATA_DIR = Setting("STREAMOPS_METADATA_DIR", "<run dir>/cluster-metadata", "PostgreSQL and Redis of the cluster profile",
                       LOCAL_STACK)
METADATA_PORTS = Setting("STREAMOPS_METADATA_PORTS", "15432,16379", "their postgres,redis ports", LOCAL_STACK)
CELERY_LOG_PORTS = Setting("STREAMOPS_CELERY_LOG_PORTS", "18793,18794", "the Celery workers' log server ports", LOCAL_STACK)
NOTIFY_WEBHOOK_FILE = Setting("STREAMOPS_NOTIFY_WEBHOOK_FILE", "unset (no on-call messages)",
                              "a file holding on-call's webhook URL (Slack, chat, pager): `streamops up` makes it the "
                              "Airflow connection streamops_notify (streamops.notifications)", LOCAL_STACK)
POSTGRES_BIN = Setting("STREAMOPS_POSTGRES_BIN", "/usr/lib/postgresql/15/bin", "where PostgreSQL's programs are", LOCAL_STACK)

ALL: tuple[Setting, ...] = tuple(value for value in globals().values() if isinstance(value, Setting))


def table() -> list[dict[str, str]]:
    """Every setting with the value in effect (none of them is a secret: the token is in a file)."""
    return [{"variable": s.name, "kind": s.kind, "value": s.get() or f"(default: {s.default})", "what": s.doc} for s in ALL]
