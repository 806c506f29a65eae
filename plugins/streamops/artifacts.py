"""Versioned program artifacts: a program's code, built once per version, never changed after.

An artifact is a zip of the program's top-level package (and the pure-Python packages its
requirements install), built reproducibly (sorted entries, fixed timestamps: the same source
gives the same bytes) and named by its content digest (sha256). The store keeps one folder per
artifact name and version:

    <store>/<name>/<version>/artifact.zip     what spark-submit ships (--py-files) to the driver
                                              and the executors
    <store>/<name>/<version>/manifest.json    digest, program reference, who built it from what,
                                              and the program's declarations (program_contract)

A version is written once: publishing different bytes under an existing version is refused (a
version pins code), publishing the same bytes again is a no-op. Every use checks the file's
digest against the manifest, and a rollback also against the digest its driver ran.

The store is a folder ($STREAMOPS_ARTIFACT_STORE, default .run/artifacts); on a cluster, a folder
every host mounts (NFS). Object-store URLs are refused for now (docs/bring-your-own-app.md).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from streamops import settings
from streamops.driver import DRIVER_PROTOCOL
from streamops.name_patterns import VERSION_PATTERN
from streamops.paths import RUN_DIR
from streamops.timestamps import iso_seconds_utc, utc_now

ARTIFACT_FILE = "artifact.zip"
MANIFEST_FILE = "manifest.json"
_NAME = re.compile(r"^[a-z][a-z0-9-]{1,62}$")
_ZIP_TIME = (1980, 1, 1, 0, 0, 0)
_SKIPPED = {"__pycache__", ".git", ".mypy_cache", ".pytest_cache"}
# What the runtime brings to every driver: an artifact carrying one of these would replace the
# platform's copy (a zip comes first on the path), the digest check included.
RUNTIME_PACKAGES = frozenset({"streamops", "pyspark", "py4j", "pydantic", "pydantic_core", "pandas", "pyarrow", "numpy",
                              "confluent_kafka", "airflow", "great_expectations"})


# Said to a program written for the driver of protocol 1, which programs imported from spark_apps.
MOVED_MODULES = ("\nThe driver moved into the platform (driver protocol 2): import `records` from streamops (was "
                 "spark_apps.common.records) and OutputQuery from streamops.program_contract (was spark_apps.common.runner).")


def driver_protocol_problem(artifact: Artifact) -> str | None:
    """Why this platform's driver cannot run the artifact's program (None: it can). Artifacts built
    before the protocol was recorded carried their own driver (protocol 1): refused by name."""
    protocol = artifact.manifest.get("driver_protocol", 1)
    if protocol == DRIVER_PROTOCOL:
        return None
    return (f"artifact {artifact.short()} was built for driver protocol {protocol}, and this platform's driver speaks "
            f"protocol {DRIVER_PROTOCOL}" + (" (protocol 1 artifacts carried their own driver, spark_apps.common.runner, "
            "which now lives in the platform)" if protocol == 1 else "") + ": build the program's source again under a new "
            f"version (streamops artifact build --name {artifact.name} --version X.Y.Z --program {artifact.program} "
            "--source DIR) and roll to it." + (MOVED_MODULES if protocol == 1 else ""))


class ArtifactError(RuntimeError):
    """An artifact that cannot be built, found or trusted; the message says which and why."""


@dataclass(frozen=True)
class Artifact:
    name: str
    version: str
    path: Path  # the zip
    digest: str  # "sha256:<hex>"
    manifest: dict

    @property
    def program(self) -> str:
        return self.manifest["program"]

    def short(self) -> str:
        return f"{self.name} {self.version} ({self.digest[:19]})"


def file_digest(path: str | os.PathLike[str]) -> str:
    sha = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            sha.update(block)
    return f"sha256:{sha.hexdigest()}"


def store_location() -> str:
    return settings.ARTIFACT_STORE.get() or str(RUN_DIR / "artifacts")


class ArtifactStore:
    """The folder of every artifact (see the module doc)."""

    def __init__(self, location: str | os.PathLike[str] | None = None):
        location = str(location or store_location())
        if location.startswith("file://"):
            location = location.removeprefix("file://")
        elif "://" in location:
            raise ArtifactError(
                f"artifact store {location}: object-store URLs are not supported yet; use a folder every host mounts "
                f"(${settings.ARTIFACT_STORE.name})"
            )
        self.root = Path(location)

    def folder(self, name: str, version: str) -> Path:
        # Both become path parts: only a name and a semantic version, never '..' or '/'.
        if not _NAME.fullmatch(name or "") or not re.fullmatch(VERSION_PATTERN, version or "") or len(version) > 64:
            raise ArtifactError(f"artifact {name!r} {version!r}: not an artifact name and a semantic version")
        return self.root / name / version

    def versions(self, name: str) -> list[str]:
        folder = self.root / name
        return sorted(p.name for p in folder.iterdir() if (p / MANIFEST_FILE).is_file()) if folder.is_dir() else []

    def resolve(self, name: str, version: str, expected_digest: str | None = None, build_hint: str | None = None) -> Artifact:
        """The artifact `name` at `version`, its zip checked against its manifest's digest (and
        against `expected_digest`, e.g. the digest a driver ran, when given)."""
        folder = self.folder(name, version)
        manifest_file = folder / MANIFEST_FILE
        if not manifest_file.is_file():
            built = self.versions(name)
            raise ArtifactError(
                f"no artifact {name} {version} in the store {self.root} (built versions: {', '.join(built) or 'none'}); "
                "build it with: "
                + (build_hint or f"streamops artifact build --name {name} --version {version} --program <module>")
            )
        manifest = json.loads(manifest_file.read_text())
        zip_path = folder / ARTIFACT_FILE
        if not zip_path.is_file():
            raise ArtifactError(f"artifact {name} {version}: {zip_path} is missing (the manifest is there)")
        actual = file_digest(zip_path)
        if actual != manifest["digest"]:
            raise ArtifactError(
                f"artifact {name} {version} refused: {zip_path} has digest {actual}, its manifest says {manifest['digest']} "
                "(changed after it was built): rebuild it under a new version"
            )
        if expected_digest and actual != expected_digest:
            raise ArtifactError(
                f"artifact {name} {version} refused: its digest is {actual}, but {expected_digest} was expected (the "
                "digest this version ran with): the store's copy was replaced; restore it or roll to a new version"
            )
        return Artifact(name, version, zip_path, actual, manifest)

    def publish(self, name: str, version: str, built_zip: Path, manifest: dict) -> tuple[Artifact, bool]:
        """Store a built zip under name/version; (artifact, True) if new, (existing, False) if the
        same bytes were there already. Different bytes under an existing version are refused."""
        if not _NAME.fullmatch(name):
            raise ArtifactError(f"artifact name {name!r}: lowercase letters, digits and '-', starting with a letter")
        if not re.fullmatch(VERSION_PATTERN, version):
            raise ArtifactError(f"artifact version {version!r} is not a semantic version such as 1.2.0")
        digest = file_digest(built_zip)
        folder = self.folder(name, version)
        if (folder / MANIFEST_FILE).is_file():
            existing = self.resolve(name, version)
            if existing.digest == digest:
                return existing, False
            raise ArtifactError(
                f"artifact {name} {version} exists with digest {existing.digest}; this build is {digest}: a version "
                "is never rebuilt with other code, give the change a new version"
            )
        folder.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{version}.", dir=folder.parent))
        staging.chmod(0o755)  # mkdtemp makes it private; every host's drivers read the store
        shutil.copyfile(built_zip, staging / ARTIFACT_FILE)
        (staging / MANIFEST_FILE).write_text(json.dumps({**manifest, "digest": digest}, indent=2, sort_keys=True) + "\n")
        for written in staging.iterdir():
            written.chmod(0o444)
        try:
            staging.rename(folder)  # atomic: a reader sees no artifact or a whole one
        except OSError as exc:
            shutil.rmtree(staging, ignore_errors=True)
            if (folder / MANIFEST_FILE).is_file():  # a racing build published first
                return self.publish(name, version, built_zip, manifest)
            raise ArtifactError(f"cannot publish artifact {name} {version} at {folder}: {exc.strerror or exc}") from None
        return self.resolve(name, version), True


    def relabel(self, name: str, base: str, version: str) -> Artifact:
        """Publish the artifact `name` of `base` again as `version`: the same code under another
        version label, as `streamops artifact build --version` of the same source gives (builds are
        reproducible). Already there with these bytes: nothing changes. For benchmarks and tests
        that roll an app to a new version without a code change."""
        built = self.resolve(name, base)
        artifact, _ = self.publish(name, version, built.path, {**built.manifest, "version": version})
        return artifact


def top_package(reference: str) -> str:
    return reference.split(":", 1)[0].split(".", 1)[0]


def package_source(reference: str, source: str | os.PathLike[str] | None) -> Path:
    """The folder of the reference's top-level package: under `source` when given, else where
    this environment imports it from."""
    package = top_package(reference)
    if source is not None:
        folder = Path(source) / package
        if not (folder / "__init__.py").is_file():
            raise ArtifactError(f"{source} has no package {package!r} (no {folder}/__init__.py) for program {reference}")
        return folder
    import importlib.util

    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ArtifactError(f"package {package!r} of program {reference} is not importable here; pass --source DIR")
    return Path(next(iter(spec.submodule_search_locations)))


def _zip_tree(archive: zipfile.ZipFile, folder: Path, prefix: str) -> int:
    count = 0
    for path in sorted(folder.rglob("*")):
        relative = path.relative_to(folder)
        if path.is_dir() or any(part in _SKIPPED for part in relative.parts) or path.suffix in {".pyc", ".pyo"}:
            continue
        info = zipfile.ZipInfo(f"{prefix}{relative.as_posix()}", date_time=_ZIP_TIME)
        info.external_attr = 0o644 << 16
        info.compress_type = zipfile.ZIP_DEFLATED
        archive.writestr(info, path.read_bytes())
        count += 1
    return count


def build(
    name: str,
    version: str,
    program: str,
    *,
    source: str | os.PathLike[str] | None = None,
    requirements: str | os.PathLike[str] | None = None,
    store: ArtifactStore | None = None,
    built_by: str = "",
) -> tuple[Artifact, bool]:
    """Package `program`'s top-level package (from `source`, else from this environment) and
    the packages `requirements` installs, check it against the contract in a separate Python,
    and publish it as name/version. Returns (artifact, newly published)."""
    store = store or ArtifactStore()
    package_dir = package_source(program, source)
    with tempfile.TemporaryDirectory(prefix="streamops-build-") as work:
        work_dir = Path(work)
        built = work_dir / ARTIFACT_FILE
        with zipfile.ZipFile(built, "w") as archive:
            files = _zip_tree(archive, package_dir, f"{package_dir.name}/")
            if requirements:
                deps = work_dir / "deps"
                result = subprocess.run(  # noqa: S603 - pip of this environment, a file the builder names
                    [sys.executable, "-m", "pip", "install", "--quiet", "--no-compile", "--disable-pip-version-check",
                     "--target", str(deps), "-r", str(requirements)],
                    capture_output=True, text=True,
                )
                if result.returncode:
                    raise ArtifactError(f"installing {requirements} failed:\n{result.stderr[-3000:]}")
                files += _zip_tree(archive, deps, "")
        with zipfile.ZipFile(built) as archive:
            tops = {entry.split("/", 1)[0] for entry in archive.namelist()}
        names = {top.removesuffix(".py") for top in tops}
        shadowing = sorted(names & (RUNTIME_PACKAGES | sys.stdlib_module_names))
        if shadowing:
            raise ArtifactError(
                f"the build of {name} {version} would carry {', '.join(shadowing)}: the runtime (or Python itself) "
                f"provides {'them' if len(shadowing) > 1 else 'it'}, and an artifact comes first on the driver's path; "
                "rename the package, or drop it from the requirements"
            )
        description = describe_in_subprocess(built, program)
        manifest = {
            "name": name,
            "version": version,
            "program": program,
            "package": package_dir.name,
            "files": files,
            "requirements": Path(requirements).read_text().splitlines() if requirements else [],
            "built_from": str(package_dir.resolve()),
            "built_at": iso_seconds_utc(utc_now()),
            "built_by": built_by or os.environ.get("USER", ""),
            "description": description,
            # The driver it is built for: its program is imported into the platform's driver.
            "driver_protocol": DRIVER_PROTOCOL,
        }
        return store.publish(name, version, built, manifest)


def describe_in_subprocess(zip_path: Path, program: str) -> dict:
    """The program's declarations, read by importing it from the zip in a fresh Python (so this
    process's imports neither hide nor pollute it), checked against the contract."""
    with tempfile.TemporaryDirectory() as cwd:  # not the project folder: nothing imported from there
        result = subprocess.run(  # noqa: S603
            [sys.executable, "-m", "streamops.programs", "describe", program],
            capture_output=True, text=True, cwd=cwd,
            env={**os.environ, "PYTHONPATH": os.pathsep.join([str(zip_path), os.environ.get("PYTHONPATH", "")])},
        )
    if result.returncode:
        told = (result.stderr or result.stdout)[-3000:]
        raise ArtifactError(f"program {program} in the build does not load as a streaming program:\n{told}"
                            + (MOVED_MODULES if "spark_apps.common" in told else ""))
    return json.loads(result.stdout.strip().splitlines()[-1])


def ensure_catalog_artifacts(catalog, store: ArtifactStore | None = None, built_by: str = "") -> list[str]:
    """Build the artifact of every catalog app at its catalog version that the store lacks, from
    the code installed here (what `streamops up` and a test run do first: a version pins code, so
    the catalog's versions must exist before anything launches). An app whose program is not
    installed here (built elsewhere, from its own source) is reported with the command, not built.
    One line per app."""
    store = store or ArtifactStore()
    said = []
    for app in catalog.apps:
        if app.artifact is None:
            said.append(f"{app.name}: code: installed (development): runs the code installed here, no artifact")
            continue
        if (store.folder(app.artifact, app.version) / MANIFEST_FILE).is_file():
            problem = driver_protocol_problem(store.resolve(app.artifact, app.version))
            said.append(f"{app.name}: " + (problem or f"artifact {app.artifact} {app.version} is in the store"))
            continue
        try:
            artifact, _ = build(app.artifact, app.version, app.program, store=store, built_by=built_by)
        except ArtifactError as exc:
            said.append(f"{app.name}: artifact {app.artifact} {app.version} is not in the store and could not be built "
                        f"from the code installed here ({str(exc).splitlines()[0]}); build it with: streamops artifact "
                        f"build --app {app.name} --version {app.version} --source DIR")
            continue
        said.append(f"{app.name}: built artifact {artifact.short()} from the code installed here")
    return said

