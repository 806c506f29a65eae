"""An artifact says which driver it was built for; a launch refuses one built for another by
name, before anything starts (artifacts of protocol 1 carried their own driver)."""

from __future__ import annotations

import json
import zipfile

import pytest

from streamops.artifacts import ARTIFACT_FILE, MANIFEST_FILE, ArtifactStore, file_digest
from streamops.catalog import load_catalog
from streamops.driver import DRIVER_PROTOCOL
from streamops.programs import ProgramError
from streamops.spark_submit import submit_spec


def _publish(store: ArtifactStore, version: str, **manifest: object) -> None:
    folder = store.folder("oplog-router", version)
    folder.mkdir(parents=True)
    with zipfile.ZipFile(folder / ARTIFACT_FILE, "w") as archive:
        archive.writestr("spark_apps/__init__.py", "")
    (folder / MANIFEST_FILE).write_text(json.dumps({
        "name": "oplog-router", "version": version, "program": "spark_apps.oplog_router",
        "digest": file_digest(folder / ARTIFACT_FILE), **manifest,
    }))


@pytest.fixture
def router(tmp_path, monkeypatch):
    monkeypatch.setenv("STREAMOPS_ARTIFACT_STORE", str(tmp_path / "store"))
    store = ArtifactStore()
    _publish(store, "0.9.0")  # built before the driver moved: no protocol recorded
    _publish(store, "1.3.0", driver_protocol=DRIVER_PROTOCOL)
    return load_catalog(check_programs=False).app("oplog-router")


def test_an_artifact_built_for_the_old_driver_is_refused_by_name_with_the_way_forward(router, tmp_path):
    settings_file = tmp_path / "kafka.json"
    with pytest.raises(ProgramError) as refused:
        submit_spec(router, kafka=None, version="0.9.0", settings_file=settings_file)  # type: ignore[arg-type]
    said = str(refused.value)
    assert said.startswith("oplog-router: artifact oplog-router 0.9.0 (sha256:")
    assert f"was built for driver protocol 1, and this platform's driver speaks protocol {DRIVER_PROTOCOL}" in said
    assert "build the program's source again under a new version (streamops artifact build --name oplog-router" in said
    assert "OutputQuery from streamops.program_contract (was spark_apps.common.runner)" in said


def test_an_artifact_of_this_drivers_protocol_launches(router, tmp_path):
    spec = submit_spec(router, kafka=None, version="1.3.0", settings_file=tmp_path / "kafka.json")  # type: ignore[arg-type]
    args = spec.application_args
    assert args[args.index("--version") + 1] == "1.3.0" and args[args.index("--artifact-digest") + 1] == spec.digest
