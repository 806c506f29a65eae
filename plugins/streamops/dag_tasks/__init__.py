"""The code behind each DAG's tasks. DAG files only wire these together.

These functions run inside Airflow tasks, so they take what they need (hooks, params) as
arguments and return JSON-friendly dicts for XCom; they never touch the metadata database.
"""
