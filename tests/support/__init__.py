"""Helpers the tests share (no test module imports another test module: shared pieces live here).

`conftest.py` turns the session-wide ones into fixtures; these are the plain functions."""
