"""The driver's entry point prefers this environment's pyspark to spark-submit's zips only when
they are the very same versions (a driver imports from whichever comes first on the path)."""

from __future__ import annotations

import zipfile
from importlib.metadata import version
from pathlib import Path

from streamops.entrypoints.driver import prefer_installed_pyspark


def _spark_zips(folder: Path, pyspark_version: str, py4j_version: str) -> list[str]:
    folder.mkdir(parents=True, exist_ok=True)
    pyspark_zip = folder / "pyspark.zip"
    with zipfile.ZipFile(pyspark_zip, "w") as archive:
        archive.writestr("pyspark/version.py", f"__version__: str = '{pyspark_version}'\n")
    py4j_zip = folder / f"py4j-{py4j_version}-src.zip"
    with zipfile.ZipFile(py4j_zip, "w") as archive:
        archive.writestr("py4j/__init__.py", "")
    return [str(pyspark_zip), str(py4j_zip)]


def test_the_same_versions_installed_move_sparks_zips_behind_the_environment(tmp_path):
    zips = _spark_zips(tmp_path, version("pyspark"), version("py4j"))
    path = ["/app", "/artifact.zip", *zips, "/usr/lib/python3.11", "/venv/site-packages"]

    assert prefer_installed_pyspark(path) == zips
    assert path == ["/app", "/artifact.zip", "/usr/lib/python3.11", "/venv/site-packages", *zips]


def test_another_sparks_zips_keep_their_place(tmp_path):
    for pyspark_version, py4j_version in (("3.5.1", version("py4j")), (version("pyspark"), "0.10.9.7")):
        zips = _spark_zips(tmp_path / pyspark_version / py4j_version, pyspark_version, py4j_version)
        path = ["/app", *zips, "/venv/site-packages"]

        assert prefer_installed_pyspark(path) == []
        assert path == ["/app", *zips, "/venv/site-packages"]


def test_a_path_without_sparks_zips_or_with_an_unreadable_one_is_left_alone(tmp_path):
    path = ["/app", "/venv/site-packages"]
    assert prefer_installed_pyspark(path) == [] and path == ["/app", "/venv/site-packages"]

    broken = tmp_path / "pyspark.zip"
    broken.write_bytes(b"not a zip")
    path = ["/app", str(broken), "/venv/site-packages"]
    assert prefer_installed_pyspark(path) == [] and path == ["/app", str(broken), "/venv/site-packages"]
