"""Each DAG's runbook is written once, in dags/docs/<dag_id>.md: the DAG shows that file as its doc
in the UI, every file there belongs to a DAG, and the README links every one (rather than repeating it)."""

from __future__ import annotations

import re

import pytest

from tests.support import PROJECT_ROOT

DAGS_DIR = PROJECT_ROOT / "dags"
RUNBOOKS = DAGS_DIR / "docs"
README = PROJECT_ROOT / "README.md"


@pytest.fixture(scope="module")
def dags():
    """The project's DAGs as Airflow parses them (for their doc_md)."""
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(DAGS_DIR))
    assert not bag.import_errors, bag.import_errors
    assert len(bag.dags) == len(list(DAGS_DIR.glob("*.py")))
    return bag.dags


def test_every_dag_shows_its_runbook_file_as_its_doc(dags):
    missing = sorted(dag_id for dag_id in dags if not (RUNBOOKS / f"{dag_id}.md").is_file())
    assert missing == [], f"DAGs without dags/docs/<dag_id>.md: {missing}"
    for dag_id, dag in dags.items():
        assert dag.doc_md == (RUNBOOKS / f"{dag_id}.md").read_text(encoding="utf-8"), f"{dag_id}'s doc_md is not its runbook file"


def test_every_runbook_belongs_to_a_dag(dags):
    strays = sorted(path.name for path in RUNBOOKS.iterdir() if path.suffix != ".md" or path.stem not in dags)
    assert strays == [], f"files in dags/docs/ that are no DAG's runbook: {strays}"


def test_the_readme_links_every_runbook_and_only_runbooks_that_exist():
    readme = README.read_text(encoding="utf-8")
    linked = set(re.findall(r"\]\((dags/docs/[^)#\s]+)\)", readme))
    runbooks = {f"dags/docs/{path.name}" for path in RUNBOOKS.glob("*.md")}
    assert sorted(runbooks - linked) == [], "runbooks the README does not link"
    assert sorted(linked - runbooks) == [], "README links to runbooks that do not exist"


def test_a_missing_runbook_fails_naming_the_file(tmp_path):
    from streamops.dag_tasks import runbook

    (tmp_path / "no_such_dag.py").write_text("")
    with pytest.raises(FileNotFoundError, match=re.escape(str(tmp_path / "docs" / "no_such_dag.md"))):
        runbook(str(tmp_path / "no_such_dag.py"))


def test_a_runbook_is_found_beside_its_dag_file_wherever_the_dags_are_deployed(tmp_path):
    """A DAGs folder synced elsewhere (git-sync, a bundle) carries its docs/ along."""
    from streamops.dag_tasks import runbook

    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "moved.md").write_text("### Moved\n")
    assert runbook(str(tmp_path / "moved.py")) == "### Moved\n"
