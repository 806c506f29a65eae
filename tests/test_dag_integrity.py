"""Every DAG file imports cleanly and carries what operators rely on in the UI."""

from __future__ import annotations

from pathlib import Path

import pytest

DAGS_DIR = Path(__file__).resolve().parents[1] / "dags"


@pytest.fixture(scope="module")
def dag_bag(airflow_db):
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=str(DAGS_DIR))


def test_every_dag_file_imports_without_errors(dag_bag):
    assert dag_bag.import_errors == {}
    files = {Path(dag.fileloc).name for dag in dag_bag.dags.values()}
    assert files == {path.name for path in DAGS_DIR.glob("*.py")}


def test_every_dag_has_an_owner_tags_retries_and_a_doc(dag_bag):
    assert dag_bag.dags, "no DAGs were found"
    for dag_id, dag in dag_bag.dags.items():
        assert dag.tags, f"{dag_id} has no tags"
        assert dag.doc_md and len(dag.doc_md) > 100, f"{dag_id} has no doc for the UI"
        assert "retries" in dag.default_args, f"{dag_id} does not set retries"
        for task in dag.tasks:
            assert task.owner not in (None, "", "airflow"), f"{dag_id}.{task.task_id} has no owner"


def test_provision_topics_form_offers_the_catalog_topics_and_defaults_to_dry_run(dag_bag):
    from streamops.catalog import load_catalog

    params = dag_bag.get_dag("provision_topics").params
    assert params["dry_run"] is True
    schema = params.get_param("topics").schema
    assert schema["items"]["enum"] == load_catalog().topic_names()
    assert schema["type"] == ["array", "null"]  # optional in the form: empty means all


def test_broken_catalog_shows_as_an_import_error_naming_the_problem(airflow_db, tmp_path, monkeypatch):
    from airflow.dag_processing.dagbag import DagBag

    bad = tmp_path / "bad.yaml"
    bad.write_text("version: 1\ntopics:\n  - name: a.b\n    partitions: 0\n    replication_factor: 1\n"
                   "    owner: o\n    description: d\n")
    monkeypatch.setenv("STREAMOPS_CATALOG", str(bad))
    bag = DagBag(dag_folder=str(DAGS_DIR / "provision_topics.py"))
    (error,) = bag.import_errors.values()
    assert "topics[0] 'a.b' (line 4), field 'partitions': must be a positive integer (got 0)" in error


def test_every_dag_imports_with_a_catalog_of_topics_only(airflow_db, tmp_path, monkeypatch):
    """A catalog without apps or suites (a first catalog, or the provisioning tests') must not
    break the DAGs that offer apps and suites in their forms."""
    from airflow.dag_processing.dagbag import DagBag

    plain = tmp_path / "plain.yaml"
    plain.write_text("version: 1\ntopics:\n  - name: a.b\n    partitions: 1\n    replication_factor: 1\n"
                     "    owner: o\n    description: d\n")
    monkeypatch.setenv("STREAMOPS_CATALOG", str(plain))
    bag = DagBag(dag_folder=str(DAGS_DIR))
    assert bag.import_errors == {}
    assert len(bag.dags) == len(list(DAGS_DIR.glob("*.py")))
