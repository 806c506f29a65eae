"""Helpers the tests share (no test module imports another test module: shared pieces live here).

`conftest.py` turns the session-wide ones into fixtures; these are the plain functions."""

from pathlib import Path

# The checkout these tests are in (not streamops.paths.PROJECT_ROOT, which $STREAMOPS_HOME moves).
PROJECT_ROOT = Path(__file__).resolve().parents[2]

# spark_default for drivers the tests launch: local mode, client deploy (the driver's lock and
# runtime files where the test looks).
LOCAL_SPARK_CONNECTION = (
    '{"conn_type": "spark", "host": "local[2]", "extra": {"deploy-mode": "client", "spark-binary": "spark-submit"}}'
)
