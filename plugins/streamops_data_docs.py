"""Airflow plugin: serve the Great Expectations Data Docs of validate_topic_quality in the UI.

Airflow loads every .py file directly under plugins/ as a plugin module; this one only wires
streamops.quality.docs into the API server (see that module for what is served and why).
"""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin

from streamops.quality.docs import URL_PREFIX, data_docs_app, serving_enabled


class StreamopsDataDocs(AirflowPlugin):
    name = "streamops_data_docs"
    if serving_enabled():
        fastapi_apps = [{"app": data_docs_app(), "url_prefix": URL_PREFIX, "name": "streamops Data Docs"}]
        external_views = [
            {"name": "Data Docs", "href": f"{URL_PREFIX}/index.html", "destination": "nav", "category": "browse"}
        ]
