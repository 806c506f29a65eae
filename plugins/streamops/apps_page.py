"""The apps page: every catalog app on one screen of the Airflow UI (Browse -> Streaming apps),
served by the API server at /streamops/apps behind the UI's login (plugins/streamops_ui.py).

Per app: its health as the supervisor judges it (red when it needs someone, with the evidence),
version, drift (what the catalog declares against what runs, field by field), uptime, driver
host, last batch age, lag and time lag, retention runway (streamops.retention), input rate over
the last hour (a small chart drawn here from the driver's per-batch rates), dead letters,
restarts, and links to its recent DAG runs (from the audit log), Data Docs, driver log, Spark UI,
its topics in the message browser and its state (streamops.state_page). Also as JSON at /streamops/apps.json
for scripts.
"""

from __future__ import annotations

import html
import logging
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

from streamops.access import APPS_PAGE, DRIVER_LOGS
from streamops.app_runtime import AppRuntime
from streamops.app_status import is_spark_ui_address, minute_rates
from streamops.audit import read_audit
from streamops.catalog import Catalog, CatalogError, load_catalog
from streamops.checkpoints import has_state
from streamops.kafka_client import KafkaClientConfig, airflow_connection, app_principal
from streamops.messages_page import PAGE_PATH as MESSAGES_PATH
from streamops.metrics import URL_PREFIX
from streamops.quality.docs import URL_PREFIX as DATA_DOCS_PREFIX
from streamops.quality.docs import serving_enabled
from streamops.spark_history import PAST_DRIVERS_SHOWN, PastDriver, past_drivers
from streamops.supervision import observe, unreadable
from streamops.timestamps import page_time, parse_recorded_time
from streamops.ui_auth import may_read, page_login, page_user

log = logging.getLogger(__name__)

PAGE_PATH = "/apps"
CHART_MINUTES = 60
RECENT_RUNS = 5
DRIVER_LOG_TAIL_BYTES = 256 * 1024
# The DAGs an operator uses on an app, linked from every row.
APP_DAGS = ("deploy_apps", "roll_restart_apps", "stop_apps", "reprocess", "recover_replay_dead_letters",
            "recover_reset_offsets", "recover_restore_checkpoint", "recover_extend_retention")


@dataclass
class AppRow:
    app: str
    state: str
    needs_someone: bool
    evidence: str
    version: str | None = None
    started_at: str | None = None
    uptime_s: float | None = None
    driver_host: str | None = None
    spark_ui: str | None = None
    last_batch_age_s: float | None = None
    lag: int | None = None
    time_lag_s: float | None = None
    # The shortest retention runway of its input partitions (streamops.retention), and where.
    runway_s: float | None = None
    runway_where: str | None = None  # "topic partition N, by retention.ms"
    input_rate_per_minute: list[float] = field(default_factory=list)  # rows/s, oldest minute first
    dead_letters_total: int | None = None
    restarts_total: int = 0
    recent_runs: list[dict[str, Any]] = field(default_factory=list)
    has_driver_log: bool = False
    # Declared (catalog) against running (streamops.effective_spec.Drift.to_dict); None: not read.
    drift: dict[str, Any] | None = None
    # The code it runs: its artifact's digest, or "installed" (code: installed, development only).
    code: str | None = None
    # Its topics, linked to the message browser: inputs first, then the dead letters.
    topics: list[str] = field(default_factory=list)
    has_state: bool = False  # its checkpoint holds state: linked to the state page
    # Its past drivers on the Spark History Server, newest first (streamops.spark_history): each
    # with its link and whether it ended, still runs, or died without ending its log (crashed).
    past_drivers: list[dict[str, Any]] = field(default_factory=list)


def app_rows(catalog: Catalog, kafka: KafkaClientConfig, now: datetime | None = None) -> list[AppRow]:
    """One row per catalog app; an app whose figures cannot be read says so (the others still show)."""
    now = now or datetime.now(UTC)
    try:
        audit = read_audit()
    except (OSError, ValueError) as exc:  # a torn line must not blank the page: the rows still show
        log.warning("apps page: the audit log could not be read: %s", exc)
        audit = []
    history = past_drivers()
    rows = []
    for name in catalog.app_names():
        spec = catalog.app(name)
        runs = _recent_runs([e for e in audit if e.get("app") == name])
        topics = [*spec.inputs.values(), spec.dead_letter_topic]
        try:
            seen = observe(spec, kafka, catalog, app_principal(name))
            current, health = seen.status, seen.health
            rates = seen.runtime.rates()
            has_log = seen.runtime.driver_log() is not None
        except Exception as exc:  # noqa: BLE001 - one unreadable app must not blank the page
            log.warning("apps page: %s could not be read: %s", name, exc)
            health = unreadable(name, exc)
            rows.append(AppRow(name, health.state, True, health.evidence, recent_runs=runs, topics=topics))
            continue
        started = parse_recorded_time(current.started_at) if current.state == "running" else None
        time_lags = [p.time_lag_s for p in current.lags if p.time_lag_s is not None]
        shortest = min((r for r in current.runways if r.runway_s is not None), key=lambda r: r.runway_s or 0.0, default=None)
        rows.append(AppRow(
            app=name, state=health.state, needs_someone=health.needs_someone, evidence=health.evidence,
            version=current.version, started_at=current.started_at,
            uptime_s=(now - started).total_seconds() if started else None,
            driver_host=current.driver_host,
            # driver.json is the app's own record: only an http(s) host:port address becomes a link.
            spark_ui=current.spark_ui if current.state == "running" and is_spark_ui_address(current.spark_ui) else None,
            last_batch_age_s=current.progress_age_s,
            lag=sum(p.lag for p in current.lags) if current.lags else None,
            time_lag_s=max(time_lags) if time_lags else (0.0 if current.lags else None),
            runway_s=shortest.runway_s if shortest else None,
            runway_where=f"{shortest.topic} partition {shortest.partition}, by {shortest.limited_by}" if shortest else None,
            input_rate_per_minute=minute_rates(rates, now, CHART_MINUTES),
            dead_letters_total=seen.dead_letters_total, restarts_total=health.restarts_total,
            recent_runs=runs, has_driver_log=has_log, drift=seen.drift.to_dict() if seen.drift else None,
            code=current.code, topics=topics, has_state=has_state(spec.checkpoint_location()),
            past_drivers=_past_drivers(history.get(name, []), current.application_id if current.state == "running" else None,
                                       _endings(seen.runtime)),
        ))
    return rows


def _past_drivers(drivers: list[PastDriver], running_id: str | None, ended: dict[str, str]) -> list[dict[str, Any]]:
    """The newest few, each told apart: running now, how it ended as its own record says (stopped,
    failed), or crashed (it died without recording a stop: killed, its host lost)."""
    shown = []
    for driver in drivers[:PAST_DRIVERS_SHOWN]:
        how = "running" if driver.application_id == running_id else ended.get(driver.application_id, "crashed")
        shown.append({**driver.to_json(), "how": how})
    return shown


def _endings(runtime: AppRuntime) -> dict[str, str]:
    """Application id -> how its driver ended (outcome of its stop record), from the run history."""
    try:
        events = runtime.history()
    except (OSError, ValueError) as exc:  # a torn history must not blank the row
        log.warning("apps page: the run history of %s could not be read: %s", runtime.dir, exc)
        return {}
    return {str(e["application_id"]): "fenced" if e.get("event") == "fenced" else str(e.get("outcome") or "stopped")  # type: ignore[typeddict-item]
            for e in events if e.get("event") in ("stopped", "fenced") and e.get("application_id")}  # type: ignore[typeddict-item]


def code_note(code: str | None) -> str:
    """Under the version: the artifact's short digest, or a warning that it runs installed code."""
    if not code:
        return ""
    if code.startswith("sha256:"):
        return f'<div class="small code" title="{html.escape(code)}">artifact {html.escape(code[7:19])}</div>'
    return ('<div class="small code installed" title="code: installed in the catalog: the version is a label, not pinned '
            'code">installed code (development)</div>')


def drift_cell(drift: dict[str, Any] | None) -> str:
    """The drift column: 'in sync', or each drifted field with both values and the catalog edit."""
    e = html.escape
    if not drift:
        return "-"
    if not drift["fields"]:
        title = f"spec {drift.get('running_digest') or '?'}" if drift["state"] == "in sync" else drift.get("evidence") or ""
        return f'<span class="drift {e(drift["state"].replace(" ", "-"))}" title="{e(title)}">{e(drift["state"])}</span>'
    items = "".join(
        f"<li><b>{e(f['field'])}</b>: the catalog says <code>{e(_text(f['declared']))}</code>, it runs "
        f"<code>{e(_text(f['running']))}</code> <span class='small'>({e(f['note'])})</span></li>" for f in drift["fields"])
    edit = (f"<details><summary>catalog edit that makes the catalog agree</summary><pre>{e(drift['catalog_edit'])}</pre>"
            "</details>" if drift.get("catalog_edit") else "")
    return f'<span class="drift drifted">drifted</span><ul class="small drift-fields">{items}</ul>{edit}'


def _text(value: Any) -> str:
    import json

    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    return text if len(text) <= 200 else text[:197] + "..."


def _recent_runs(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The app's last DAG runs, newest first: one per run, with its last step's outcome."""
    by_run: dict[tuple[str, str], dict[str, Any]] = {}
    for entry in entries:
        by_run[(entry["dag_id"], entry["run_id"])] = entry
    latest = sorted(by_run.values(), key=lambda e: e.get("at") or "", reverse=True)[:RECENT_RUNS]
    return [{"dag_id": e["dag_id"], "run_id": e["run_id"], "at": e.get("at"), "user": e.get("user"),
             "step": e.get("step"), "outcome": e.get("outcome")} for e in latest]


# --- rendering ------------------------------------------------------------------------------------

def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = max(0, int(seconds))
    if seconds < 120:
        return f"{seconds} s"
    if seconds < 7200:
        return f"{seconds // 60} min"
    if seconds < 2 * 86400:
        return f"{seconds // 3600} h {seconds % 3600 // 60} min"
    return f"{seconds // 86400} d {seconds % 86400 // 3600} h"


def sparkline(values: list[float], width: int = 180, height: int = 36) -> str:
    """An inline SVG chart of `values` (no script, no external asset), labelled with its peak."""
    peak = max(values, default=0.0)
    if not values:
        return ""
    step = width / max(len(values) - 1, 1)
    points = " ".join(f"{i * step:.1f},{height - 2 - (v / peak * (height - 4) if peak else 0):.1f}"
                      for i, v in enumerate(values))
    label = f"input rate over the last {len(values)} minutes, peak {peak:.1f} records/s, now {values[-1]:.1f} records/s"
    return (f'<svg class="chart" width="{width}" height="{height}" role="img" aria-label="{html.escape(label)}">'
            f"<title>{html.escape(label)}</title>"
            f'<polyline fill="none" stroke="#1f77b4" stroke-width="1.5" points="{points}"/></svg>'
            f'<div class="small">peak {peak:.1f}/s, now {values[-1]:.1f}/s</div>')


STYLE = """
body{font-family:system-ui,sans-serif;margin:1em;color:#222}
table{border-collapse:collapse;width:100%}
th,td{border-bottom:1px solid #ddd;padding:.4em .5em;text-align:left;vertical-align:top;font-size:14px}
th{background:#f4f4f4}
tr.attention td{background:#fde2e1}
.state{font-weight:600;padding:.1em .5em;border-radius:.8em;white-space:nowrap}
.state.ok{background:#d7f5dd;color:#145a24}.state.quiet{background:#eee;color:#444}
.state.bad{background:#c62828;color:#fff}
.small{font-size:12px;color:#555}.evidence{max-width:28em}
a{color:#0b5cad}
.drift{font-weight:600;white-space:nowrap}.drift.in-sync{color:#145a24}.drift.drifted{color:#b35c00}
.drift-fields{padding-left:1em;margin:.2em 0;max-width:30em}
.code.installed{color:#b35c00;font-weight:600}
"""
QUIET_STATES = ("stopped", "not deployed", "in operation")


def render_page(rows: list[AppRow], now: datetime, data_docs_url: str | None, base: str, *,
                driver_history: bool = True) -> str:
    """The page; `driver_history`: link each past driver on the History Server (DRIVER_LOGS roles)."""
    needing = [r.app for r in rows if r.needs_someone]
    headline = (f"{len(needing)} of {len(rows)} apps need attention: {', '.join(needing)}" if needing
                else f"All {len(rows)} apps are as they should be")
    body = []
    for row in rows:
        kind = "bad" if row.needs_someone else ("quiet" if row.state in QUIET_STATES else "ok")
        e = html.escape
        links = []
        if row.spark_ui:
            links.append(f'<a href="{e(row.spark_ui)}" target="_blank" rel="noopener">Spark UI</a>')
        if row.has_driver_log:
            links.append(f'<a href="{base}{PAGE_PATH}/{quote(row.app)}/driver-log" target="_blank">driver log</a>')
        if data_docs_url:
            links.append(f'<a href="{e(data_docs_url)}" target="_top">Data Docs</a>')
        if row.past_drivers and driver_history:
            links.append("drivers: " + ", ".join(
                f'<a class="history" data-how="{e(d["how"])}" data-app-id="{e(d["application_id"])}" '
                f'href="{e(d["link"])}" target="_blank" rel="noopener">{e((d["started"] or "?")[11:16])} {e(d["how"])}</a>'
                for d in row.past_drivers))
        if row.has_state:
            links.append(f'<a class="state" href="{base}{PAGE_PATH}/{quote(row.app)}/state">state</a>')
        links += [f'<a class="messages" href="{base}{MESSAGES_PATH}?topic={quote(topic)}">'
                  f'{"dead letters" if i == len(row.topics) - 1 else "input " + e(topic)}</a>'
                  for i, topic in enumerate(row.topics)]
        runs = "".join(
            f'<li><a href="/dags/{quote(r["dag_id"])}/runs/{quote(r["run_id"], safe="")}" target="_top">'
            f'{e(r["dag_id"])}</a> {e(r["step"] or "")} {e(r["outcome"] or "")} '
            f'<span class="small">{e((r["at"] or "")[:19])} by {e(r["user"] or "?")}</span></li>'
            for r in row.recent_runs)
        body.append(
            f'<tr class="{"attention" if row.needs_someone else ""}" data-app="{e(row.app)}" data-state="{e(row.state)}" '
            f'data-restarts="{row.restarts_total}">'
            f'<td><b>{e(row.app)}</b><div class="small">{" · ".join(links)}</div></td>'
            f'<td><span class="state {kind}">{e(row.state)}</span><div class="small evidence">{e(row.evidence)}</div></td>'
            f"<td>{e(row.version or '-')}{code_note(row.code)}</td>"
            f"<td class='drift-cell'>{drift_cell(row.drift)}</td>"
            f"<td>{_duration(row.uptime_s)}</td>"
            f"<td>{e(row.driver_host or '-')}</td>"
            f"<td>{_duration(row.last_batch_age_s)}</td>"
            f"<td>{'-' if row.lag is None else f'{row.lag:,}'}</td>"
            f"<td>{_duration(row.time_lag_s)}</td>"
            f"<td class='runway'>{_runway_cell(row)}</td>"
            f"<td>{sparkline(row.input_rate_per_minute)}</td>"
            f"<td>{'-' if row.dead_letters_total is None else f'{row.dead_letters_total:,}'}</td>"
            f"<td>{row.restarts_total}</td>"
            f'<td><ul class="small" style="padding-left:1em;margin:0">{runs or "<li>none yet</li>"}</ul></td>'
            "</tr>")
    dag_links = " · ".join(f'<a href="/dags/{d}" target="_top">{d}</a>' for d in ("app_status", *APP_DAGS))
    return (
        "<!doctype html><html><head><meta charset='utf-8'><title>Streaming apps</title>"
        f"<meta http-equiv='refresh' content='30'><style>{STYLE}</style></head><body>"
        f"<h2 id='headline'>{html.escape(headline)}</h2>"
        f"<p class='small'>As of {page_time(now)} (refreshes every 30 s). "
        "The supervisor (<a href='/dags/app_status' target='_top'>app_status</a>) restarts crashed apps and pages "
        f"when one needs someone. Operate: {dag_links}</p>"
        "<table><thead><tr><th>app</th><th>state</th><th>version</th><th>declared vs running</th><th>uptime</th>"
        "<th>driver host</th>"
        "<th>last batch</th><th>lag (records)</th><th>time lag</th><th>retention runway</th><th>input rate, last hour</th>"
        "<th>dead letters</th><th>restarts</th><th>recent runs</th></tr></thead>"
        f"<tbody>{''.join(body)}</tbody></table></body></html>")


def _runway_cell(row: AppRow) -> str:
    """The time until retention may delete input it has not read: '-' when nothing waits or no limit."""
    if row.runway_s is None:
        return "-"
    return f"{_duration(row.runway_s)}<div class='small'>{html.escape(row.runway_where or '')}</div>"


def rows_as_json(rows: list[AppRow], *, driver_history: bool = True) -> list[dict[str, Any]]:
    return [{**asdict(row), "past_drivers": row.past_drivers if driver_history else []} for row in rows]


def add_apps_page(app: Any) -> None:
    """The page's routes on the operator pages' FastAPI app (mounted at metrics.URL_PREFIX)."""
    from fastapi import Depends, HTTPException
    from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse

    user_of = page_user("the apps page", APPS_PAGE)
    log_login = page_login("a driver's log", DRIVER_LOGS)

    @app.get(PAGE_PATH, response_class=HTMLResponse)
    def apps_page(user: Any = Depends(user_of)) -> HTMLResponse:  # noqa: B008
        now = datetime.now(UTC)
        rows = app_rows(load_catalog(check_programs=False), airflow_connection(), now)
        docs = f"{DATA_DOCS_PREFIX}/index.html" if serving_enabled() else None
        # The History Server has no login of its own and shows what a driver log shows: linked for
        # the roles that may read driver logs.
        return HTMLResponse(render_page(rows, now, docs, URL_PREFIX, driver_history=may_read(user, DRIVER_LOGS)),
                            headers={"Cache-Control": "no-store"})

    @app.get(f"{PAGE_PATH}.json")
    def apps_json(user: Any = Depends(user_of)) -> JSONResponse:  # noqa: B008
        rows = app_rows(load_catalog(check_programs=False), airflow_connection())
        return JSONResponse(rows_as_json(rows, driver_history=may_read(user, DRIVER_LOGS)))

    @app.get(f"{PAGE_PATH}/{{name}}/driver-log", response_class=PlainTextResponse)
    def driver_log(name: str, _user: str = Depends(log_login)) -> PlainTextResponse:
        try:
            spec = load_catalog(check_programs=False).app(name)
        except (CatalogError, KeyError):
            raise HTTPException(status_code=404, detail=f"No app {name!r} in the catalog") from None
        path = AppRuntime(spec.checkpoint_location()).driver_log()
        if path is None:
            raise HTTPException(status_code=404, detail=f"{name} has no driver log on this host (never started here)")
        with open(path, "rb") as log_file:
            size = log_file.seek(0, 2)
            log_file.seek(max(0, size - DRIVER_LOG_TAIL_BYTES))
            text = log_file.read().decode("utf-8", errors="replace")
        head = f"{path} ({size:,} bytes" + (
            f"; the last {DRIVER_LOG_TAIL_BYTES:,} shown)\n" if size > DRIVER_LOG_TAIL_BYTES else ")\n"
        )
        return PlainTextResponse(head + text, headers={"Cache-Control": "no-store"})
