"""A stateful app's state on the operator pages: /streamops/apps/<app>/state (linked from the apps
page), and .../state.json for scripts, behind the UI's login and the role check.

The read is `streamops app state` (streamops.state_query: Spark's state data source, as of each
query's last committed batch), run as a child process of the API server with a deadline, one at
a time per host: a Spark session is a JVM, which the API server itself must not carry. The key,
query and limit reach it as separate arguments (`--key=<text>`: never a shell, never an option).

Only roles with "StreamOps Sensitive Data" read state (operator, approver, admin): state holds raw
values of the inputs (user ids as keys) that no masking covers, and each read starts Spark on the
server. A viewer is told so.

No `from __future__ import annotations` here: FastAPI reads the routes' annotations at run time.
"""


import fcntl
import html
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

from streamops.access import SENSITIVE_DATA
from streamops.catalog import load_catalog
from streamops.paths import RUN_DIR
from streamops.state_query import MAX_ROWS, StateRefused, StateRequest
from streamops.ui_auth import page_user

PAGE_PATH = "/apps/{name}/state"
READ_TIMEOUT_S = 180
LOCK_FILE = RUN_DIR / "state-read.lock"

STYLE = """
body{font-family:system-ui,sans-serif;font-size:14px;margin:16px;color:#1f2933}
form{display:flex;gap:8px;align-items:end;margin-bottom:12px}label{display:flex;flex-direction:column;font-size:12px}
input,select{font:inherit;padding:3px 6px}table{border-collapse:collapse;width:100%}
td,th{border-bottom:1px solid #e4e7eb;padding:6px;text-align:left;vertical-align:top}
pre{margin:0;white-space:pre-wrap;word-break:break-all}.small{font-size:12px;color:#52606d}
.error{color:#b42318;font-weight:600}
"""


class StateReadFailed(RuntimeError):
    """The read did not answer (busy, timed out, or failed): the text says which and what to do."""


def state_command(app: str, request: StateRequest, out: Path) -> list[str]:
    """The child process's argv: every value a separate argument, the key glued to its option."""
    argv = [sys.executable, "-m", "streamops.cli", "app", "state", app, f"--json-out={out}", f"--limit={request.limit}"]
    if request.key is not None:
        argv.append(f"--key={request.key}")
    if request.query is not None:
        argv.append(f"--query={request.query}")
    return argv


def run_state_read(app: str, request: StateRequest, timeout_s: float = READ_TIMEOUT_S) -> dict[str, Any]:
    """The answer's JSON (streamops.state_query.StateAnswer), one read at a time on this host."""
    LOCK_FILE.parent.mkdir(parents=True, exist_ok=True)
    with open(LOCK_FILE, "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise StateReadFailed("another state read is running on this server (one at a time: each starts Spark): "
                                  "try again in a few seconds") from None
        with tempfile.TemporaryDirectory(prefix="streamops-state-") as folder:
            out = Path(folder) / "answer.json"
            try:
                # argv of this interpreter, a catalog app and validated values, each one argument: no shell.
                done = subprocess.run(state_command(app, request, out), stdout=subprocess.DEVNULL,  # noqa: S603
                                      stderr=subprocess.PIPE, text=True, timeout=timeout_s, check=False)
            except subprocess.TimeoutExpired:
                raise StateReadFailed(f"the state read of {app} did not finish within {timeout_s:.0f} s (a large state, "
                                      "or a busy host): filter by a key, or use `streamops app state` on a host "
                                      "with room") from None
            if out.exists():
                answer: dict[str, Any] = json.loads(out.read_text())
                if "refused" in answer:
                    raise StateRefused([str(answer["refused"])])
                return answer
            tail = [line for line in (done.stderr or "")[-20_000:].splitlines() if line.strip()][-3:]
            raise StateReadFailed(f"the state read of {app} failed (exit {done.returncode}): {' / '.join(tail) or 'no output'}")


def render_state(app: str, form: dict[str, str], answer: dict[str, Any] | None, error: str | None) -> str:
    e = html.escape
    fields = "".join(
        f"<label>{label}<input name='{name}' value='{e(form.get(name, ''))}' size='{size}'></label>"
        for name, label, size in (("key", "key (user id, fingerprint)", 24), ("query", "query (all)", 14),
                                  ("limit", f"rows per store (max {MAX_ROWS})", 6)))
    body = [f"<h2>State of {e(app)}</h2>",
            "<p class='small'>Read through Spark's state data source as of each query's last committed batch; the "
            "live app is not paused. Each read starts Spark: seconds.</p>",
            f"<form method='get'>{fields}<button type='submit'>Read</button></form>"]
    if error:
        body.append(f"<p id='error' class='error'>{e(error)}</p>")
    for store in (answer or {}).get("stores", []):
        watermark = f", watermark {e(store['watermark'])}" if store.get("watermark") else ""
        more = " (more match: filter by key or raise the limit)" if store.get("more") else ""
        rows = "".join(f"<tr><td><pre>{e(json.dumps(r.get('key'), indent=1, ensure_ascii=False))}</pre></td>"
                       f"<td><pre>{e(json.dumps(r.get('value'), indent=1, ensure_ascii=False))}</pre></td></tr>"
                       for r in store.get("rows", []))
        body.append(
            f"<h3 class='store' data-query='{e(store['query'])}' data-batch='{store['batch_id']}'>query {e(store['query'])}: "
            f"operator {store['operator_id']} {e(store['operator'])}, store {e(store['store'])}</h3>"
            f"<p class='small'>as of batch {store['batch_id']} ({e(store.get('batch_time') or 'time unknown')}{watermark}); "
            f"{len(store.get('rows', []))} row(s){more}</p>"
            f"<table><thead><tr><th>key</th><th>value</th></tr></thead><tbody>{rows or '<tr><td colspan=2>no rows</td></tr>'}"
            "</tbody></table>")
    body += [f"<p class='small'>{e(note)}</p>" for note in (answer or {}).get("notes", [])]
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>State of {e(app)}</title><style>{STYLE}</style>"
            f"</head><body>{''.join(body)}</body></html>")


def state_link(base: str, app: str, **query: str) -> str:
    return f"{base}{PAGE_PATH.format(name=quote(app))}" + (f"?{urlencode(query)}" if query else "")


def add_state_page(app: Any) -> None:
    """The routes on the operator pages' FastAPI app (mounted at metrics.URL_PREFIX)."""
    from fastapi import Depends, HTTPException, Request
    from fastapi.responses import HTMLResponse, JSONResponse

    user_of = page_user("an app's state", SENSITIVE_DATA)

    def read(name: str, request: Request) -> tuple[dict[str, str], dict[str, Any] | None, str | None, int]:
        catalog = load_catalog(check_programs=False)
        if name not in catalog.app_names():
            raise HTTPException(status_code=404, detail=f"no app {name!r} in the catalog")
        form = {k: v for k, v in request.query_params.items() if k in StateRequest.model_fields}
        try:
            return form, run_state_read(name, StateRequest.from_form(form)), None, 200
        except StateRefused as exc:
            return form, None, exc.operator_text(), 400
        except StateReadFailed as exc:
            return form, None, str(exc), 503

    @app.get(PAGE_PATH, response_class=HTMLResponse)
    def state(name: str, request: Request, _user: Any = Depends(user_of)) -> HTMLResponse:  # noqa: B008
        form, answer, error, status = read(name, request)
        return HTMLResponse(render_state(name, form, answer, error), status_code=status,
                            headers={"Cache-Control": "no-store"})

    @app.get(PAGE_PATH + ".json")
    def state_json(name: str, request: Request, _user: Any = Depends(user_of)) -> JSONResponse:  # noqa: B008
        _form, answer, error, status = read(name, request)
        if error:
            raise HTTPException(status_code=status, detail=error)
        return JSONResponse(answer, headers={"Cache-Control": "no-store"})
