"""The streaming apps: PySpark Structured Streaming programs, one per catalog `program`.

Each program module exposes `queries(sources, spec)`, the transformation shared by streaming
runs and backfills, and `main()`, the spark-submit entry point. No Airflow import here.
"""
