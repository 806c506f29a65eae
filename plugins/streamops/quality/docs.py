"""Data Docs in the Airflow UI: the GX site under <quality root>/gx is served by the Airflow API
server (plugins/streamops_data_docs.py) at /streamops/data-docs/, with a "Data Docs" link in
the UI's Browse menu, so an operator opens a run's page from the task log.

The pages hold sample records. The mount is not behind Airflow's login (Airflow does not put
plugin apps behind it): on a shared deployment set STREAMOPS_SERVE_DATA_DOCS=false and publish
the site through your own authenticated web server instead.
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import quote, unquote, urlparse

from streamops.quality.results import quality_root

URL_PREFIX = "/streamops/data-docs"


def site_dir(root: Path | None = None) -> Path:
    """GX's local Data Docs site (its default location inside the file project)."""
    return (root or quality_root()) / "gx" / "uncommitted" / "data_docs" / "local_site"


def serving_enabled() -> bool:
    return os.environ.get("STREAMOPS_SERVE_DATA_DOCS", "true").lower() not in ("0", "false", "no")


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


def data_docs_app():
    """A FastAPI app serving the site (created empty if no validation ran yet)."""
    from fastapi import FastAPI
    from fastapi.staticfiles import StaticFiles

    app = FastAPI(title="streamops Data Docs")
    directory = site_dir()
    directory.mkdir(parents=True, exist_ok=True)
    app.mount("/", StaticFiles(directory=str(directory), html=True), name="data-docs")
    return app
