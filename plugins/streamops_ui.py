"""Airflow plugin: the suite's operator pages on the Airflow API server, behind the UI's login.

    /streamops/apps          every streaming app on one screen (Browse -> Streaming apps)
    /streamops/apps.json     the same for scripts
    /streamops/messages      the message browser: a topic's records (Browse -> Messages)
    /streamops/apps/<app>/state   a stateful app's state per key (linked from the apps page)
    /streamops/data-docs/    validate_topic_quality's Data Docs (Browse -> Data Docs)
    /streamops/metrics       Prometheus figures (scrape token or login)

Airflow loads every .py file directly under plugins/ as a plugin module; this one only mounts
streamops.apps_page, streamops.messages_page, streamops.state_page, streamops.quality.docs and streamops.metrics (what
is served, and the login they ask for). One app under one prefix: two plugin apps on nested prefixes shadow each other.
"""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin

from streamops.apps_page import PAGE_PATH, add_apps_page
from streamops.messages_page import PAGE_PATH as MESSAGES_PATH
from streamops.messages_page import add_messages_page
from streamops.metrics import URL_PREFIX, metrics_app
from streamops.quality import docs
from streamops.state_page import add_state_page

operator_pages = metrics_app()
add_apps_page(operator_pages)
add_messages_page(operator_pages)
add_state_page(operator_pages)
# url_route: a page opens inside the Airflow UI (its navigation stays around it).
views = [{"name": "Streaming apps", "href": f"{URL_PREFIX}{PAGE_PATH}", "url_route": "streaming-apps",
          "destination": "nav", "category": "browse"},
         {"name": "Messages", "href": f"{URL_PREFIX}{MESSAGES_PATH}", "url_route": "messages",
          "destination": "nav", "category": "browse"}]
if docs.serving_enabled():
    operator_pages.mount(docs.URL_PREFIX.removeprefix(URL_PREFIX), docs.data_docs_app())
    views.append({"name": "Data Docs", "href": f"{docs.URL_PREFIX}/index.html", "url_route": "data-docs",
                  "destination": "nav", "category": "browse"})


class StreamopsUi(AirflowPlugin):
    name = "streamops_ui"
    fastapi_apps = [{"app": operator_pages, "url_prefix": URL_PREFIX, "name": "streamops operator pages"}]
    external_views = views
