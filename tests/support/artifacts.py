"""The shipped apps' artifacts for a test run (a version pins code: every launch runs one).

The run builds the catalog's artifacts once, from this checkout's code, into a store of its own
(tests/conftest.py, before any test process starts); a test that deploys or rolls a shipped app
to another version label first publishes that label with `same_code_as`."""

from __future__ import annotations

import os
from pathlib import Path

from streamops.artifacts import Artifact, ArtifactStore, ensure_catalog_artifacts
from streamops.catalog import AppSpec

STORE_ENV = "STREAMOPS_ARTIFACT_STORE"


def build_shipped_artifacts(store: Path) -> list[str]:
    """The project catalog's artifacts, built into `store`, which every process of the run uses."""
    from streamops.catalog import load_catalog

    os.environ[STORE_ENV] = str(store)
    return ensure_catalog_artifacts(load_catalog(check_programs=False), ArtifactStore(store), built_by="the test run")


def private_store(tmp_path: Path, monkeypatch) -> ArtifactStore:
    """A store of the test's own, holding the run's builds of the catalog's versions and nothing
    else: for a test that builds other code under a version. Other labels that tests published
    into the run's store (e.g. `same_code_as(router, "1.1.0")`) stay out, whatever ran before."""
    from streamops.catalog import load_catalog

    shared, own = ArtifactStore(os.environ[STORE_ENV]), ArtifactStore(tmp_path / "artifacts")
    for app in load_catalog(check_programs=False).apps:
        if app.artifact:
            built = shared.resolve(app.artifact, app.version)
            own.publish(app.artifact, app.version, built.path, built.manifest)
    monkeypatch.setenv(STORE_ENV, str(own.root))
    return ArtifactStore()


def same_code_as(app: AppSpec, version: str, base: str | None = None) -> Artifact:
    """Publish `app`'s artifact of `base` (default: its catalog version) again as `version`: the
    same code under another version label, as `streamops artifact build --version` of the same
    source gives (builds are reproducible). Already there with these bytes: nothing changes."""
    assert app.artifact, f"{app.name} runs installed code: it has no artifact"
    return ArtifactStore().relabel(app.artifact, base or app.version, version)

def router_source(tmp_path: Path, marker: str, *, refuse_odd_seqs: bool = False) -> Path:
    """A copy of spark_apps whose router adds `"code": marker` to what it routes (which version's
    code wrote a record is then in the record); with `refuse_odd_seqs`, it also refuses every odd
    seq as if its op type were in no category (a health gate then fails on dead letters)."""
    import shutil

    from streamops.paths import PROJECT_ROOT

    copy = tmp_path / f"router-{marker}"
    shutil.copytree(PROJECT_ROOT / "spark_apps", copy / "spark_apps", ignore=shutil.ignore_patterns("__pycache__"))
    module = copy / "spark_apps" / "oplog_router.py"
    text = module.read_text()
    changed = text.replace('            F.col("event_id"),\n            target["category"]',
                           '            F.col("event_id"),\n'
                           f'            F.lit("{marker}").alias("code"),\n'
                           '            target["category"]')
    assert changed != text, "the router's output select changed: update this helper"
    if refuse_odd_seqs:
        refusing = changed.replace(
            'unknown = F.col("error").isNull() & ~F.col("op_type").isin(*table)',
            'unknown = F.col("error").isNull() & (~F.col("op_type").isin(*table) | (F.col("seq") % 2 == 1))')
        assert refusing != changed, "the router's unknown-op-type rule changed: update this helper"
        changed = refusing
    module.write_text(changed)
    return copy



def presence_source_counting_by_length(tmp_path: Path) -> Path:
    """A copy of spark_apps whose presence notifier counts notifications per user id's length (a
    number) instead of per user id (text): a version whose `count` state has another key schema,
    which Spark refuses to read from the running version's checkpoint."""
    import shutil

    from streamops.paths import PROJECT_ROOT

    copy = tmp_path / "presence-by-length"
    shutil.copytree(PROJECT_ROOT / "spark_apps", copy / "spark_apps", ignore=shutil.ignore_patterns("__pycache__"))
    module = copy / "spark_apps" / "presence_notifier.py"
    text = module.read_text()
    changed = text.replace('''    return records.windowed_counts(
        timed, "user_id",''', '''    return records.windowed_counts(
        timed.withColumn("user_id", F.length("user_id")), "user_id",''')
    assert changed != text, "the notifier's windowed count changed: update this helper"
    module.write_text(changed)
    return copy
