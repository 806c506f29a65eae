"""spark-submit's primary file for every app: checks the artifact, then runs the driver.

    spark-submit ... [--py-files ARTIFACT.zip] plugins/streamops/entrypoints/driver.py \
        --app APP --program REF [--artifact ARTIFACT.zip --artifact-digest sha256:...] ...

The artifact's digest is checked here, before anything is imported from it: an artifact whose
bytes are not the ones its version was built with never runs (exit 5, ExitCode.ARTIFACT_REFUSED). Its zip then comes first
on the path, so the program is that version's code; the driver (`streamops.driver`) is the
platform's. This folder holds only this file: Python puts it first on the path.
"""

from __future__ import annotations

import os
import re
import sys
import zipfile

# streamops.driver.exit_codes.ExitCode.ARTIFACT_REFUSED: nothing is imported from the package path
# before the artifact is checked (a test holds the two equal).
ARTIFACT_REFUSED = 5
_SPARK_ZIPS = re.compile(r"pyspark\.zip|py4j-(?P<py4j>[\w.]+)-src\.zip")


def _flag(argv: list[str], name: str) -> str | None:
    for index, arg in enumerate(argv):
        if arg == name and index + 1 < len(argv):
            return argv[index + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return None


def _sha256(path: str) -> str:
    # Nothing imported from the package path before the check: the artifact comes first on it.
    import hashlib

    sha = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            sha.update(block)
    return f"sha256:{sha.hexdigest()}"


def _zipped_versions(zips: list[str]) -> dict[str, str]:
    """The pyspark and py4j versions inside spark-submit's zips (pyspark: its version.py)."""
    found = {}
    for path in zips:
        name = os.path.basename(path)
        match = _SPARK_ZIPS.fullmatch(name)
        if match and match["py4j"]:
            found["py4j"] = match["py4j"]
        elif match:
            with zipfile.ZipFile(path) as archive:
                version = re.search(r"""__version__[^=]*=\s*['"]([^'"]+)['"]""", archive.read("pyspark/version.py").decode())
            if version:
                found["pyspark"] = version[1]
    return found


def prefer_installed_pyspark(path: list[str]) -> list[str]:
    """spark-submit puts Spark's own pyspark.zip and py4j zip before this environment's packages.
    Python keeps no bytecode for modules it imports from a zip: it compiled pyspark's anew at every
    driver start (about 0.6 CPU-s here, before the first record). Where this environment holds the
    very same versions (bytecode cached), those zips move to the end of the path; otherwise (another
    Spark's zips, or no pyspark installed) the path stays as Spark made it. Returns the zips moved."""
    zips = [entry for entry in path if _SPARK_ZIPS.fullmatch(os.path.basename(entry))]
    if not zips:
        return []
    from importlib.metadata import PackageNotFoundError, version

    try:
        zipped = _zipped_versions(zips)
        installed = {name: version(name) for name in zipped}
    except (OSError, KeyError, zipfile.BadZipFile, PackageNotFoundError):
        return []
    if set(zipped) != {"pyspark", "py4j"} or zipped != installed:
        return []
    for entry in zips:
        path.remove(entry)
        path.append(entry)
    return zips


def main() -> int:
    argv = sys.argv[1:]
    artifact, expected = _flag(argv, "--artifact"), _flag(argv, "--artifact-digest")
    if artifact:
        try:
            actual = _sha256(artifact)
        except OSError as exc:
            print(f"refused: cannot read the artifact {artifact}: {exc.strerror}", file=sys.stderr)
            return ARTIFACT_REFUSED
        if not expected or actual != expected:
            print(f"refused: artifact {artifact} has digest {actual}, expected {expected or '(none given)'}: "
                  "it is not the code this version was built with", file=sys.stderr)
            return ARTIFACT_REFUSED
        if artifact not in sys.path:  # spark-submit --py-files puts it there; a run by hand may not
            sys.path.insert(1, artifact)
    prefer_installed_pyspark(sys.path)
    from streamops.driver.run import main as run

    return run(argv)


if __name__ == "__main__":
    sys.exit(main())
