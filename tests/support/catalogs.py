"""Small catalogs written for one test."""

from __future__ import annotations

from pathlib import Path

import yaml


def topic_entry(name: str, partitions: int = 3, **extra) -> dict:
    entry = {
        "name": name,
        "partitions": partitions,
        "replication_factor": 1,
        "owner": "tests",
        "description": f"test topic {name}",
    }
    entry.update(extra)
    return entry


def write_catalog(directory: Path, topics: list[dict], name: str = "catalog.yaml") -> Path:
    path = directory / name
    path.write_text(yaml.safe_dump({"version": 1, "topics": topics}, sort_keys=False))
    return path
