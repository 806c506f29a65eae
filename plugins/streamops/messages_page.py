"""The message browser's pages (Browse -> Messages), served at /streamops/messages behind the UI's
login and the role check (streamops.access.MESSAGES; sensitive fields per SENSITIVE_DATA):

    /streamops/messages                       the form and one page of records (streamops.message_browser)
    /streamops/messages.json                  the same for scripts
    /streamops/messages/plan/<dag>?...        a recovery DAG's form filled in from a selection

A plan form never applies anything: its button triggers the DAG through Airflow's own REST API as the
logged-in user (Airflow checks that user's permission and records them as the requester), with
'Wait for approval' on, so the run plans and waits for an approver as any other.

No `from __future__ import annotations` here: FastAPI reads the routes' annotations (Request, the
login dependency) at run time, and a postponed one naming a local import would not resolve.
"""


import html
import json
import re
from collections.abc import Iterable
from typing import Any
from urllib.parse import quote, urlencode

from streamops.access import MESSAGES, SENSITIVE_DATA
from streamops.catalog import Catalog, load_catalog
from streamops.dag_tasks.approval import APPROVE_PARAM
from streamops.kafka_client import airflow_connection
from streamops.message_browser import BrowseError, BrowseQuery, BrowseResult, Shown, ShownRecord, browse
from streamops.metrics import URL_PREFIX
from streamops.recovery.skip import MAX_SPECS, RECORD_PATTERN
from streamops.ui_auth import may_read, may_trigger, page_user

PAGE_PATH = "/messages"
SKIP_DAG, REPLAY_DAG = "recover_skip_records", "recover_replay_dead_letters"
PLAN_DAGS = (SKIP_DAG, REPLAY_DAG)
REASON_MAX = 200  # recover_replay_dead_letters' reason_contains

STYLE = """
body{font-family:system-ui,sans-serif;font-size:14px;margin:16px;color:#1f2933}
form.browse{display:flex;flex-wrap:wrap;gap:8px;align-items:end;margin-bottom:12px}
form.browse label{display:flex;flex-direction:column;font-size:12px;color:#52606d}
input,select,textarea{font:inherit;padding:3px 6px}
table{border-collapse:collapse;width:100%}td,th{border-bottom:1px solid #e4e7eb;padding:6px;text-align:left;
vertical-align:top}pre{margin:0;white-space:pre-wrap;word-break:break-all;max-height:24em;overflow:auto}
.small{font-size:12px;color:#52606d}.error{color:#b42318;font-weight:600}.masked{color:#8d2b0b}
.dl{background:#fff7ed;padding:4px 6px;margin-top:4px}.note{background:#f0f4f8;padding:6px;margin:6px 0}
button{font:inherit;padding:4px 10px}
"""


def e(value: Any) -> str:
    return html.escape("" if value is None else str(value))


def script_json(value: Any) -> str:
    """`value` as a JavaScript literal inside a <script>: JSON with '<', '>' and '&' escaped, so no
    text of a record (a dead letter's reason) can close the script."""
    return json.dumps(value).replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def record_specs(topic: str, partition: int, offsets: Iterable[int]) -> list[str]:
    """recover_skip_records' records for `offsets` of one partition: runs of consecutive offsets as
    topic:partition:first-last."""
    specs: list[str] = []
    run: list[int] = []
    for offset in sorted(set(offsets)):
        if run and offset != run[-1] + 1:
            specs.append(_spec(topic, partition, run))
            run = []
        run.append(offset)
    if run:
        specs.append(_spec(topic, partition, run))
    return specs


def _spec(topic: str, partition: int, run: list[int]) -> str:
    return f"{topic}:{partition}:{run[0]}" if len(run) == 1 else f"{topic}:{partition}:{run[0]}-{run[-1]}"


def skip_conf(app: str, records: list[str], note: str | None) -> dict[str, Any]:
    """The run's conf of recover_skip_records from a selection: planned and waiting for approval."""
    return {"app": app, "records": records, "note": note or None, "dry_run": False, APPROVE_PARAM: True}


def replay_conf(app: str, reason_contains: str | None, start: str, end: str) -> dict[str, Any]:
    return {"app": app, "reason_contains": (reason_contains or "")[:REASON_MAX] or None, "start": start, "end": end,
            "dry_run": False, APPROVE_PARAM: True}


def plan_conf(catalog: Catalog, dag_id: str, form: dict[str, str]) -> dict[str, Any]:
    """The conf a plan form starts from, checked here (the DAG's own schema checks it again)."""
    if dag_id not in PLAN_DAGS:
        raise BrowseError(f"dag: the browser fills the forms of {', '.join(PLAN_DAGS)}, not {dag_id!r}")
    app = form.get("app", "")
    if app not in catalog.app_names():
        raise BrowseError(f"app: {app!r} is not a catalog app ({', '.join(catalog.app_names())})")
    if dag_id == SKIP_DAG:
        records = [r for r in form.get("records", "").split(",") if r]
        bad = [r for r in records if not re.fullmatch(RECORD_PATTERN.strip("^$"), r)]
        if not records or bad or len(records) > MAX_SPECS:
            raise BrowseError(f"records: {len(records)} given, at most {MAX_SPECS}, each topic:partition:offset or "
                              f"topic:partition:first-last" + (f" (not: {', '.join(bad[:3])})" if bad else ""))
        return skip_conf(app, records, form.get("note"))
    return replay_conf(app, form.get("reason"), form.get("start") or "earliest", form.get("end") or "now")


# ---------------------------------------------------------------------------------------------
# Rendering


def _shown(value: Shown | None) -> str:
    if value is None:
        return "<span class='small'>not available</span>"
    cls = " class='masked'" if value.kind == "masked" or value.masked else ""
    masked = f"<div class='small masked'>masked: {e(', '.join(value.masked))}</div>" if value.masked and \
        value.kind != "masked" else ""
    return f"<pre{cls} data-kind='{e(value.kind)}'>{e(value.text)}</pre>{masked}<div class='small'>{value.kind}, " \
           f"{value.size:,} bytes</div>"


def _record_row(result: BrowseResult, row: ShownRecord, replay_app: str | None) -> str:
    headers = "".join(f"<div><b>{e(name)}</b>: {e(value.text)}</div>" for name, value in row.headers) or \
        "<span class='small'>none</span>"
    letter = row.dead_letter
    detail = ""
    if letter is not None:
        if letter.app is None:
            detail = f"<div class='dl'>{e(letter.note)}</div>"
        else:
            plan = ""
            if replay_app:
                query = urlencode({"app": replay_app, "reason": letter.reason[:REASON_MAX]})
                plan = (f" <a class='replay-link' href='{URL_PREFIX}{PAGE_PATH}/plan/{REPLAY_DAG}?{e(query)}'>"
                        "Plan a replay of dead letters with this reason</a>")
            detail = (
                f"<div class='dl' data-source='{e(letter.source)}'><div><b>reason</b>: <span class='reason'>"
                f"{e(letter.reason)}</span></div>"
                f"<div class='small'>refused by {e(letter.app)} {e(letter.app_version)} at {e(letter.failed_at)}; "
                f"source <b>{e(letter.source)}</b> ({e(letter.source_time)}); original {e(letter.stored)}</div>"
                f"<div><b>original key</b>{_shown(letter.original_key)}</div>"
                f"<div><b>original value</b>{_shown(letter.original_value)}</div>{plan}</div>")
    pick = (f"<input type='checkbox' class='pick' value='{row.offset}' aria-label='select offset {row.offset}'>"
            if result.readers else "")
    return (f"<tr data-offset='{row.offset}'><td>{pick}</td><td>{row.offset}</td><td class='small'>{e(row.timestamp)}</td>"
            f"<td>{_shown(row.key)}</td><td class='small'>{headers}</td><td>{_shown(row.value)}{detail}</td></tr>")


def render_browser(catalog: Catalog, form: dict[str, str], result: BrowseResult | None, error: str | None) -> str:
    topics = "".join(f"<option{' selected' if name == form.get('topic') else ''}>{e(name)}</option>"
                     for name in catalog.topic_names())

    def field(name: str, label: str, size: int = 10, placeholder: str = "") -> str:
        return (f"<label>{label}<input name='{name}' size='{size}' value='{e(form.get(name, ''))}' "
                f"placeholder='{e(placeholder)}'></label>")

    parts = [
        "<!doctype html><html><head><meta charset='utf-8'><title>Messages</title>"
        f"<style>{STYLE}</style></head><body><h2>Messages</h2>"
        "<p class='small'>Records of the catalog's topics, read without joining a consumer group or committing "
        "anything; at most one page per request. A selection opens a recovery DAG's form filled in: its run plans and "
        "waits for an approver, as always.</p>",
        f"<form class='browse' method='get' action='{URL_PREFIX}{PAGE_PATH}'>"  # noqa: S608 (HTML, not SQL)
        f"<label>topic<select name='topic'>{topics}</select></label>"
        + field("partition", "partition", 4, "0")
        + field("offset", "from offset", 10, "newest")
        + field("time", "or from time", 24, "2026-12-03T10:00:00Z or 30 minutes")
        + field("key", "key contains", 14)
        + field("header", "header (name or name=value)", 18)
        + field("reason", "dead letters: reason contains", 20)
        + field("limit", "records", 4, "20")
        + "<button type='submit'>Read</button></form>",
    ]
    if error:
        parts.append(f"<p class='error' id='error'>{e(error)}</p>")
    if result is not None:
        parts.append(_result_html(catalog, result, form))
    parts.append("</body></html>")
    return "".join(parts)


def _result_html(catalog: Catalog, result: BrowseResult, form: dict[str, str]) -> str:
    head = (f"<p id='summary'>{e(result.topic)} partition {result.partition} of {result.partitions}: offsets "
            f"{result.low}-{result.high - 1 if result.high > result.low else result.low} on the broker; read "
            f"{result.scanned:,} from {result.start}, showing {len(result.records)}.")
    if result.next_offset < result.high:
        # The next page keeps the filters and the page size.
        query = {**{k: v for k, v in form.items() if k in ("key", "header", "reason", "limit") and v},
                 "topic": result.topic, "partition": result.partition, "offset": result.next_offset}
        head += f" <a id='next' href='{URL_PREFIX}{PAGE_PATH}?{e(urlencode(query))}'>Next page from {result.next_offset}</a>"
    head += "</p>"
    notes = "".join(f"<div class='note'>{e(n)}</div>" for n in result.notes)
    if result.sensitive_masked:
        notes += ("<div class='note masked' id='masked-note'>Fields the catalog marks sensitive are masked: your role may "
                  "not see them.</div>")
    replay_app = result.dead_letter_of
    rows = "".join(_record_row(result, row, replay_app) for row in result.records)
    table = ("<table><thead><tr><th></th><th>offset</th><th>timestamp</th><th>key</th><th>headers</th><th>value</th>"
             f"</tr></thead><tbody>{rows or '<tr><td colspan=6>no records</td></tr>'}</tbody></table>")
    skip = ""
    if result.readers and result.records:
        apps = "".join(f"<option>{e(a)}</option>" for a in result.readers)
        skip = (f"<form id='skip-selection' method='get' action='{URL_PREFIX}{PAGE_PATH}/plan/{SKIP_DAG}'>"
                f"<input type='hidden' name='topic' value='{e(result.topic)}'>"
                f"<input type='hidden' name='partition' value='{result.partition}'>"
                "<input type='hidden' name='offsets' id='skip-offsets'>"
                f"Skip the selected records in <select name='app'>{apps}</select> "
                "<button type='submit'>Plan a skip…</button></form>"
                "<script>document.getElementById('skip-selection').addEventListener('submit',function(ev){"
                "var offsets=[].slice.call(document.querySelectorAll('input.pick:checked')).map(function(b){"
                "return b.value});if(!offsets.length){ev.preventDefault();alert('Select records first');return}"
                "document.getElementById('skip-offsets').value=offsets.join(',')});</script>")
    return head + notes + skip + table


def render_plan_form(dag_id: str, conf: dict[str, Any], may_trigger: bool, user: str) -> str:
    """The filled-in form: editable fields, and a button that triggers the DAG through Airflow's
    REST API as the logged-in user (the run then waits for approval)."""
    if dag_id == SKIP_DAG:
        fields = (f"<label>App <input name='app' value='{e(conf['app'])}' readonly></label><br>"
                  f"<label>Records (one per line)<br><textarea name='records' rows='6' cols='60'>"
                  f"{e(chr(10).join(conf['records']))}</textarea></label><br>"
                  f"<label>Note <input name='note' size='60' maxlength='500' value='{e(conf.get('note') or '')}' "
                  "placeholder='why (a ticket, the error)'></label>")
    else:
        fields = (f"<label>App <input name='app' value='{e(conf['app'])}' readonly></label><br>"
                  f"<label>Reason contains <input name='reason_contains' size='80' maxlength='{REASON_MAX}' "
                  f"value='{e(conf.get('reason_contains') or '')}'></label><br>"
                  f"<label>Start <input name='start' value='{e(conf['start'])}'></label> "
                  f"<label>End <input name='end' value='{e(conf['end'])}'></label>")
    button = ("<button type='submit' id='plan'>Trigger: plan it and wait for an approver</button>" if may_trigger else
              f"<p class='error'>Your role ({e(user)}) may not trigger {e(dag_id)}: ask an operator.</p>")
    script = ("<script>document.getElementById('plan-form').addEventListener('submit',async function(ev){"
              "ev.preventDefault();var f=new FormData(this);var conf=" + script_json(conf) + ";"
              "if(f.has('records')){conf.records=f.get('records').split(/\\n/).map(function(s){return s.trim()})"
              ".filter(Boolean)}"
              "['note','reason_contains','start','end'].forEach(function(k){if(f.has(k)){var v=f.get(k).trim();"
              "conf[k]=v===''&&(k==='note'||k==='reason_contains')?null:v}});"
              "var out=document.getElementById('outcome');out.textContent='Triggering…';"
              "var r=await fetch('/api/v2/dags/" + dag_id + "/dagRuns',{method:'POST',credentials:'same-origin',"
              "headers:{'Content-Type':'application/json'},body:JSON.stringify({logical_date:null,conf:conf})});"
              "var body=await r.json().catch(function(){return {}});"
              "if(r.ok){window.top.location.href='/dags/" + dag_id + "/runs/'+encodeURIComponent(body.dag_run_id);}"
              "else{out.className='error';out.textContent='Not triggered ('+r.status+'): '+"
              "(typeof body.detail==='string'?body.detail:JSON.stringify(body.detail||body))}});</script>")
    return ("<!doctype html><html><head><meta charset='utf-8'><title>Plan</title>"
            f"<style>{STYLE}</style></head><body><h2>{e(dag_id)}</h2>"
            "<p class='small'>Filled in from the message browser. The run only plans: it shows the plan for approval "
            "('Wait for approval' is on) and applies it after an approver approves.</p>"
            f"<form id='plan-form'>{fields}<br><br>{button}</form><p id='outcome'></p>"
            f"<p class='small'><a href='/dags/{quote(dag_id)}' target='_top'>{e(dag_id)} in Airflow</a></p>"
            + (script if may_trigger else "") + "</body></html>")


# ---------------------------------------------------------------------------------------------
# Routes


def add_messages_page(app: Any) -> None:
    """The routes on the operator pages' FastAPI app (mounted at metrics.URL_PREFIX)."""
    from fastapi import Depends, HTTPException, Request
    from fastapi.responses import HTMLResponse, JSONResponse

    user_of = page_user("the message browser", MESSAGES)

    def read(request: Request, user: Any) -> tuple[Catalog, dict[str, str], BrowseResult | None, str | None]:
        catalog = load_catalog(check_programs=False)
        form = {k: v for k, v in request.query_params.items() if k in BrowseQuery.model_fields}
        if not form.get("topic"):
            return catalog, form, None, None
        try:
            query = BrowseQuery.from_form(form)
            return catalog, form, browse(catalog, airflow_connection(), query,
                                         may_see_sensitive=may_read(user, SENSITIVE_DATA)), None
        except BrowseError as exc:
            return catalog, form, None, str(exc)

    @app.get(PAGE_PATH, response_class=HTMLResponse)
    def messages(request: Request, user: Any = Depends(user_of)) -> HTMLResponse:  # noqa: B008
        catalog, form, result, error = read(request, user)
        return HTMLResponse(render_browser(catalog, form, result, error), status_code=400 if error else 200,
                            headers={"Cache-Control": "no-store"})

    @app.get(f"{PAGE_PATH}.json")
    def messages_json(request: Request, user: Any = Depends(user_of)) -> JSONResponse:  # noqa: B008
        _catalog, form, result, error = read(request, user)
        if error or result is None:
            raise HTTPException(status_code=400, detail=error or "topic: give a catalog topic to read")
        return JSONResponse(result.to_json(), headers={"Cache-Control": "no-store"})

    @app.get(f"{PAGE_PATH}/plan/{{dag_id}}", response_class=HTMLResponse)
    def plan_form(dag_id: str, request: Request, user: Any = Depends(user_of)) -> HTMLResponse:  # noqa: B008
        form = dict(request.query_params)
        if "offsets" in form and "records" not in form:
            topic, partition, offsets = form.get("topic", ""), form.get("partition", ""), form.get("offsets", "")
            form["records"] = ",".join(_offset_specs(topic, partition, offsets))
        try:
            conf = plan_conf(load_catalog(check_programs=False), dag_id, form)
        except BrowseError as exc:
            raise HTTPException(status_code=400, detail=str(exc)) from None
        return HTMLResponse(render_plan_form(dag_id, conf, may_trigger(user, dag_id), user.get_name()),
                            headers={"Cache-Control": "no-store"})


def _offset_specs(topic: str, partition: str, offsets: str) -> list[str]:
    try:
        return record_specs(topic, int(partition), [int(o) for o in offsets.split(",") if o])
    except ValueError:
        raise BrowseError("offsets: a comma-separated list of offsets") from None
