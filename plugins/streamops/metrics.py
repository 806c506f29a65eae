"""Every app's figures in Prometheus' text format, served by the Airflow API server at
/streamops/metrics (plugins/streamops_ui.py), behind a scrape token or the UI's login.

Computed on each scrape from what the supervisor reads (checkpoints, the driver's progress
files, the broker's end offsets), so a scrape is as fresh as the app's last batch. Rendered with
prometheus_client (the reference client): names, types and escaping follow its conventions.

    streamops_app_state{app}                                  health as a number (STATE_NUMBERS)
    streamops_app_needs_attention{app}                        1 when its health needs someone (supervision.NEEDS_SOMEONE)
    streamops_app_scrape_error{app}                           1 when its figures could not be read in this scrape
    streamops_app_health_info{app,state,version}              1, the state in words
    streamops_app_offset_lag{app,query,topic,partition}       records waiting
    streamops_app_time_lag_seconds{app,query,topic,partition} age of the oldest waiting record (absent: not readable)
    streamops_app_retention_runway_seconds{app,topic,partition} until retention may delete the oldest unread input
                                                              record (absent: nothing waits, or no time retention)
    streamops_app_input_lost_records{app,topic,partition}     input records retention deleted before the app read them
    streamops_app_input_rows_per_second{app,query}            of the last batch
    streamops_app_processed_rows_per_second{app,query}
    streamops_app_batch_duration_seconds{app,query}
    streamops_app_state_rows{app,query}                       rows in the query's state store
    streamops_app_dead_letters_last_batch{app,query}
    streamops_app_window_input_rows{app,query}                input records in the health window (supervision.health_window)
    streamops_app_window_dead_letters{app,query}              dead letters in the health window
    streamops_app_window_dropped_late_rows{app,query}         rows dropped as late (numRowsDroppedByWatermark) in the window
    streamops_app_window_state_rows_updated{app,query}        state rows updated (a windowed count's updates) in the window
    streamops_app_watermark_ahead_seconds{app,query}          the query's watermark minus now (a hijacked one is far ahead)
    streamops_app_dead_letters_total{app,topic}               records ever written to its dead-letter topic (end offsets)
    streamops_app_last_batch_age_seconds{app}
    streamops_app_restarts_total{app}                         the supervisor's restarts
    streamops_app_up{app}                                     1 while a driver holds the lease
"""

# No `from __future__ import annotations` here: FastAPI reads the endpoint's parameter types at
# runtime, and those are imported inside metrics_app().
import hmac
import logging
import time
from pathlib import Path

from streamops import settings
from streamops.access import METRICS
from streamops.catalog import Catalog, load_catalog
from streamops.kafka_client import KafkaClientConfig, airflow_connection, app_principal
from streamops.supervision import NEEDS_SOMEONE, STATE_NUMBERS, observe, unreadable
from streamops.timestamps import parse_recorded_time
from streamops.ui_auth import LoginRequired, bearer_token, forbidden, logged_in_user, may_read

log = logging.getLogger(__name__)
URL_PREFIX = "/streamops"


def render(catalog: Catalog, kafka: KafkaClientConfig) -> bytes:
    """The exposition text for every catalog app."""
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    def gauge(name: str, doc: str, labels: list[str]) -> GaugeMetricFamily:
        return GaugeMetricFamily(name, doc, labels=labels)

    state = gauge("streamops_app_state", "Health as a number: " + ", ".join(f"{n}={s}" for s, n in STATE_NUMBERS.items()),
                  ["app"])
    attention = gauge("streamops_app_needs_attention", "1 when the app is " + ", ".join(NEEDS_SOMEONE), ["app"])
    info = gauge("streamops_app_health_info", "Health state in words (value 1)", ["app", "state", "version"])
    up = gauge("streamops_app_up", "1 while a driver holds the app's lease", ["app"])
    lag = gauge("streamops_app_offset_lag", "Records after the query's last committed batch",
                ["app", "query", "topic", "partition"])
    time_lag = gauge("streamops_app_time_lag_seconds", "Age of the oldest record the query has not processed (0: none waits)",
                     ["app", "query", "topic", "partition"])
    runway = gauge("streamops_app_retention_runway_seconds",
                   "Seconds until retention may delete the oldest input record the app has not read (streamops.retention)",
                   ["app", "topic", "partition"])
    lost = gauge("streamops_app_input_lost_records", "Input records retention deleted before the app read them",
                 ["app", "topic", "partition"])
    input_rate = gauge("streamops_app_input_rows_per_second", "Input rate of the query's last batch", ["app", "query"])
    processed_rate = gauge("streamops_app_processed_rows_per_second", "Processing rate of the query's last batch",
                           ["app", "query"])
    duration = gauge("streamops_app_batch_duration_seconds", "Duration of the query's last batch", ["app", "query"])
    state_rows = gauge("streamops_app_state_rows", "Rows in the query's state store after its last batch", ["app", "query"])
    letters = gauge("streamops_app_dead_letters_last_batch", "Dead letters of the query's last batch", ["app", "query"])
    window_input = gauge("streamops_app_window_input_rows", "Input records of the query in the health window", ["app", "query"])
    window_letters = gauge("streamops_app_window_dead_letters", "Dead letters of the query in the health window",
                           ["app", "query"])
    window_late = gauge("streamops_app_window_dropped_late_rows", "Rows the query dropped as late in the health window",
                        ["app", "query"])
    window_updated = gauge("streamops_app_window_state_rows_updated", "State rows the query updated in the health window",
                           ["app", "query"])
    ahead = gauge("streamops_app_watermark_ahead_seconds", "The query's watermark minus now (negative: behind, as it should be)",
                  ["app", "query"])
    # End offsets, not records kept: retention deleting old dead letters is not a counter reset.
    letters_total = CounterMetricFamily("streamops_app_dead_letters", "Records ever written to the app's dead-letter topic",
                                        labels=["app", "topic"])
    batch_age = gauge("streamops_app_last_batch_age_seconds", "Seconds since the app's last completed batch", ["app"])
    restarts = CounterMetricFamily("streamops_app_restarts", "Restarts by the supervisor", labels=["app"])
    drifted = gauge("streamops_app_drift_fields", "Fields in which what runs differs from the catalog (0: in sync; absent: "
                    "not running, or launched before launches recorded their spec)", ["app"])
    failures = gauge("streamops_app_scrape_error", "1 when the app's figures could not be read in this scrape", ["app"])

    for name in catalog.app_names():
        spec = catalog.app(name)
        try:
            seen = observe(spec, kafka, catalog, app_principal(name))
            current, health = seen.status, seen.health
        except Exception as exc:  # noqa: BLE001 - one app's unreadable figures must not hide the others'
            log.warning("metrics: %s could not be read: %s", name, exc)
            health = unreadable(name, exc)
            failures.add_metric([name], 1)
            state.add_metric([name], health.state_number)
            attention.add_metric([name], 1)
            continue
        failures.add_metric([name], 0)
        state.add_metric([name], health.state_number)
        attention.add_metric([name], 1 if health.needs_someone else 0)
        info.add_metric([name, health.state, current.version or ""], 1)
        up.add_metric([name], 1 if current.state == "running" else 0)
        for partition in current.lags:
            labels = [name, partition.query, partition.topic, str(partition.partition)]
            lag.add_metric(labels, partition.lag)
            if partition.lag == 0 or partition.time_lag_s is not None:  # nothing waits: 0; waiting, unread: absent
                time_lag.add_metric(labels, partition.time_lag_s or 0.0)
        for partition_runway in current.runways:
            labels = [name, partition_runway.topic, str(partition_runway.partition)]
            lost.add_metric(labels, partition_runway.lost)
            if partition_runway.runway_s is not None:
                runway.add_metric(labels, partition_runway.runway_s)
        for query, figures in sorted(current.queries.items()):
            input_rate.add_metric([name, query], figures["input_rows_per_second"])
            processed_rate.add_metric([name, query], figures["processed_rows_per_second"])
            duration.add_metric([name, query], figures["batch_duration_ms"] / 1000)
            state_rows.add_metric([name, query], figures["state_rows"])
            letters.add_metric([name, query], figures["dead_letters"])
        now_s = time.time()
        for query, window in sorted(current.recent.items()):
            labels = [name, query]
            window_input.add_metric(labels, window.input_rows)
            window_letters.add_metric(labels, window.dead_letters)
            window_late.add_metric(labels, window.dropped_by_watermark)
            window_updated.add_metric(labels, window.state_rows_updated)
            watermark = parse_recorded_time(window.watermark)
            if watermark is not None:
                ahead.add_metric(labels, watermark.timestamp() - now_s)
        letters_total.add_metric([name, spec.dead_letter_topic], seen.dead_letters_total)
        if current.progress_age_s is not None:
            batch_age.add_metric([name], current.progress_age_s)
        restarts.add_metric([name], health.restarts_total)
        if seen.drift is not None and seen.drift.state in ("in sync", "drifted"):
            drifted.add_metric([name], len(seen.drift.fields))

    families = [state, attention, info, up, lag, time_lag, runway, lost, input_rate, processed_rate, duration, state_rows,
                letters,
                window_input, window_letters, window_late, window_updated, ahead, letters_total, batch_age, restarts,
                drifted, failures]

    class Snapshot:
        def collect(self):
            return families

    registry = CollectorRegistry(auto_describe=False)
    registry.register(Snapshot())
    return generate_latest(registry)


def scrape_token() -> str | None:
    """The bearer token Prometheus sends (its `authorization.credentials_file`), read from the
    file $STREAMOPS_METRICS_TOKEN_FILE names (None: only the UI's login is accepted)."""
    path = settings.METRICS_TOKEN_FILE.get()
    if not path:
        return None
    try:
        token = Path(path).read_text().strip()
    except OSError as exc:
        log.warning("metrics: the scrape token file %s cannot be read (%s): only the UI's login is accepted", path, exc)
        return None
    return token or None


def metrics_app():
    """The FastAPI app the plugin mounts at URL_PREFIX: GET /metrics."""
    from fastapi import Depends, FastAPI, HTTPException, Request
    from fastapi.responses import Response

    app = FastAPI(title="streamops metrics", docs_url=None, redoc_url=None, openapi_url=None)

    async def authorised(request: Request) -> str:
        """The scrape token as a bearer token, or the Airflow UI's own login (its JWT as a bearer
        token or its cookie). Airflow does not authenticate a plugin's app itself."""
        bearer = bearer_token(request)
        token = scrape_token()
        if bearer and token and hmac.compare_digest(bearer.encode(), token.encode()):
            return "scrape token"
        try:
            user = await logged_in_user(request)
        except LoginRequired:
            raise HTTPException(status_code=401, detail="Not authenticated: send the scrape token or an Airflow login token "
                                                        "as 'Authorization: Bearer <token>'",
                                headers={"WWW-Authenticate": "Bearer"}) from None
        if not may_read(user, METRICS):
            raise forbidden(user, "the metrics", METRICS)
        return f"user {user.get_name()}"

    @app.get("/metrics")
    def metrics(_who: str = Depends(authorised)) -> Response:
        from prometheus_client import CONTENT_TYPE_LATEST

        body = render(load_catalog(check_programs=False), airflow_connection())
        return Response(content=body, media_type=CONTENT_TYPE_LATEST)

    return app
