"""The settings module is the one list of environment variables: every STREAMOPS_* name the code,
scripts and images use is in it, nothing reads one from the environment around it, and the README
documents each."""

from __future__ import annotations

import re

import pytest

from streamops import settings
from tests.support import PROJECT_ROOT

NAME = re.compile(r"\bSTREAMOPS_[A-Z0-9_]+\b")
# A read of a STREAMOPS_ variable by its literal name (the settings module's accessors name it once).
DIRECT_READ = re.compile(r"""(?:os\.environ(?:\.get)?\s*[\[(]|os\.getenv\s*\(|environ\.get\s*\()\s*["']STREAMOPS_""")


def _sources():
    for folder in ("plugins", "spark_apps", "dags", "bin", "docker", "terraform"):
        for path in sorted((PROJECT_ROOT / folder).rglob("*")):
            if path.is_file() and path.suffix in ("", ".py", ".sh", ".yaml", ".yml", ".tf", ".cfg", ".env") \
                    and "__pycache__" not in path.parts and path.name != "Dockerfile.lock":
                yield path


def test_every_variable_the_code_uses_is_a_setting():
    registered = {setting.name for setting in settings.ALL}
    used: dict[str, set[str]] = {}
    for path in _sources():
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        for name in NAME.findall(text):
            used.setdefault(name, set()).add(str(path.relative_to(PROJECT_ROOT)))
    unknown = {name: sorted(files) for name, files in used.items() if name not in registered}
    assert not unknown, f"not in streamops.settings: {unknown}"
    assert len(registered) == len(settings.ALL), "two settings with one name"


def test_nothing_reads_a_variable_around_the_settings_module():
    readers = [f"{path.relative_to(PROJECT_ROOT)}:{n}" for path in _sources() if path.suffix == ".py"
               for n, line in enumerate(path.read_text().splitlines(), 1) if DIRECT_READ.search(line)]
    assert readers == []


def test_the_readme_documents_every_setting():
    readme = (PROJECT_ROOT / "README.md").read_text()
    assert [s.name for s in settings.ALL if f"`{s.name}`" not in readme] == []


@pytest.mark.parametrize("value", ["", None])
def test_an_empty_value_counts_as_unset(monkeypatch, value):
    if value is None:
        monkeypatch.delenv("STREAMOPS_SUPERVISOR", raising=False)
    else:
        monkeypatch.setenv("STREAMOPS_SUPERVISOR", value)
    assert settings.SUPERVISOR.get() is None
    monkeypatch.setenv("STREAMOPS_SUPERVISOR", "manual")
    assert settings.SUPERVISOR.get() == "manual"
