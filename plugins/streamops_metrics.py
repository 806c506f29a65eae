"""Airflow plugin: every streaming app's figures for Prometheus at /streamops/metrics.

Airflow loads every .py file directly under plugins/ as a plugin module; this one only mounts
streamops.metrics (what is served, and the scrape token or UI login it asks for) on the API server.
"""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin

from streamops.metrics import URL_PREFIX, metrics_app


class StreamopsMetrics(AirflowPlugin):
    name = "streamops_metrics"
    fastapi_apps = [{"app": metrics_app(), "url_prefix": URL_PREFIX, "name": "streamops metrics"}]
