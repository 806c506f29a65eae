"""spark-submit's primary file for every app: checks the artifact, then runs the driver.

    spark-submit ... [--py-files ARTIFACT.zip] plugins/streamops/entrypoints/driver.py \
        --app APP --program REF [--artifact ARTIFACT.zip --artifact-digest sha256:...] ...

The artifact's digest is checked here, before anything is imported from it: an artifact whose
bytes are not the ones its version was built with never runs (exit 5). Its zip then comes first
on the path, so the program (and, for the shipped apps, the runtime in spark_apps.common) is
that version's code. This folder holds only this file: Python puts it first on the path.
"""

from __future__ import annotations

import sys


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


def main() -> int:
    argv = sys.argv[1:]
    artifact, expected = _flag(argv, "--artifact"), _flag(argv, "--artifact-digest")
    if artifact:
        try:
            actual = _sha256(artifact)
        except OSError as exc:
            print(f"refused: cannot read the artifact {artifact}: {exc.strerror}", file=sys.stderr)
            return 5
        if not expected or actual != expected:
            print(f"refused: artifact {artifact} has digest {actual}, expected {expected or '(none given)'}: "
                  "it is not the code this version was built with", file=sys.stderr)
            return 5
        if artifact not in sys.path:  # spark-submit --py-files puts it there; a run by hand may not
            sys.path.insert(1, artifact)
    from spark_apps.common.runner import main as run

    return run(argv)


if __name__ == "__main__":
    sys.exit(main())
