"""Data Docs in the Airflow UI: the GX site under <quality root>/gx is served by the Airflow API
server (plugins/streamops_ui.py) at /streamops/data-docs/, with a "Data Docs" link in
the UI's Browse menu, so an operator opens a run's page from the task log.

The pages hold sample records, so they are behind the UI's login (streamops.ui_auth). Their
styles and scripts come from the suite (streamops.quality.docs_assets), not from public CDNs.
Before the first validation the index says so instead of answering a bare 404.
STREAMOPS_SERVE_DATA_DOCS=false turns the mount off (publish the site your own way).
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import quote, unquote, urlparse

from streamops import settings
from streamops.access import DATA_DOCS
from streamops.quality.docs_assets import ASSETS_DIR, localise
from streamops.quality.results import quality_root
from streamops.ui_auth import page_login

URL_PREFIX = "/streamops/data-docs"


def site_dir(root: Path | None = None) -> Path:
    """GX's local Data Docs site (its default location inside the file project)."""
    return (root or quality_root()) / "gx" / "uncommitted" / "data_docs" / "local_site"


def serving_enabled() -> bool:
    return (settings.SERVE_DATA_DOCS.get() or "true").lower() not in ("0", "false", "no")


def ui_link(file_url: str, base_url: str | None, root: Path | None = None) -> str | None:
    """The page's address on the Airflow API server, or None if it is not in the served site."""
    if not base_url or not serving_enabled():
        return None
    path = Path(unquote(urlparse(file_url).path))
    try:
        relative = path.relative_to(site_dir(root))
    except ValueError:
        return None
    return f"{base_url.rstrip('/')}{URL_PREFIX}/{quote(relative.as_posix())}"


def airflow_base_url() -> str | None:
    """[api] base_url of this Airflow, if it is configured."""
    try:
        from airflow.configuration import conf

        return conf.get("api", "base_url", fallback=None) or None
    except Exception:  # noqa: BLE001 - outside Airflow there is simply no UI link
        return None


ASSETS_PATH = "_assets"


def _page(title: str, body: str) -> str:
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{title}</title>"
            "<style>body{font-family:sans-serif;max-width:46em;margin:3em auto;line-height:1.5}"
            "code{background:#eee;padding:0 .3em}</style></head>"
            f"<body><h1>{title}</h1>{body}</body></html>")


NO_VALIDATION_YET = _page(
    "No validation has run yet",
    "<p>The Data Docs are written by the <code>validate_topic_quality</code> DAG. It runs every hour once "
    "the catalog's topics exist; trigger it from its page to validate now:</p>"
    "<p><a href='/dags/validate_topic_quality'>validate_topic_quality</a></p>"
    "<p>This page shows the results as soon as a run has finished.</p>")


def data_docs_app():
    """A FastAPI app serving the site behind the UI's login, CDN addresses rewritten to the
    suite's copies, and a "no validation has run yet" index before the first run."""
    import mimetypes

    from fastapi import Depends, FastAPI
    from fastapi.responses import FileResponse, HTMLResponse, RedirectResponse, Response

    app = FastAPI(title="streamops Data Docs", docs_url=None, redoc_url=None, openapi_url=None)
    login = page_login("Data Docs", DATA_DOCS)

    def inside(base: Path, relative: str) -> Path | None:
        candidate = (base / relative).resolve()
        return candidate if candidate.is_relative_to(base.resolve()) and candidate.is_file() else None

    @app.get("/")
    def root(_user: str = Depends(login)) -> Response:
        return RedirectResponse(f"{URL_PREFIX}/index.html")

    @app.get(f"/{ASSETS_PATH}/{{path:path}}")
    def asset(path: str, _user: str = Depends(login)) -> Response:
        file = inside(ASSETS_DIR, path)
        if file is None:
            return Response(f"No such Data Docs asset: {path} (bin/setup fetches them into {ASSETS_DIR})",
                            status_code=404, media_type="text/plain")
        return FileResponse(file, headers={"Cache-Control": "max-age=86400"})

    @app.get("/{path:path}")
    def page(path: str, _user: str = Depends(login)) -> Response:
        file = inside(site_dir(), path or "index.html")
        if file is None:
            if path in ("", "index.html"):
                return HTMLResponse(NO_VALIDATION_YET)
            return HTMLResponse(_page("No such Data Docs page",
                                      f"<p>There is no page <code>{_escape(path)}</code>. "
                                      f"<a href='{URL_PREFIX}/index.html'>Open the index</a>.</p>"), status_code=404)
        if file.suffix == ".html":
            return HTMLResponse(localise(file.read_text(encoding="utf-8"), f"{URL_PREFIX}/{ASSETS_PATH}"))
        return FileResponse(file, media_type=mimetypes.guess_type(file.name)[0])

    return app


def _escape(text: str) -> str:
    import html

    return html.escape(text)
