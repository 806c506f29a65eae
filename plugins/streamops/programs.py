"""The one loader of streaming programs: from the catalog's reference to what the program declares
(`ProgramInfo`) or to the program itself (`load_program`).

An app names its program by an importable reference (`package.module` or
`package.module:attribute`) and, optionally, an `artifact`: then the code of the app's version
is that artifact's (streamops.artifacts), and its declarations come from the artifact's manifest
(recorded when it was built), so the control plane checks a version without importing its code.
Program code itself runs in the drivers, which get exactly one artifact on their path.
"""

from __future__ import annotations

import importlib
import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from streamops.app_runtime import AppRuntime, DriverRecord
from streamops.artifacts import ArtifactError, ArtifactStore, driver_protocol_problem
from streamops.name_patterns import PATTERN_HINTS, REFERENCE_PATTERN, VERSION_PATTERN
from streamops.program_contract import LineageOutput, StreamingProgram, WindowCountOutput, contract_problems, describe
from streamops.refusals import OneLineRefused

if TYPE_CHECKING:
    from streamops.artifacts import Artifact
    from streamops.catalog import AppSpec

DEFAULT_ATTRIBUTE = "program"


class ProgramError(OneLineRefused):
    """A program that cannot be found or does not keep the contract (or an artifact that is not
    there, or not the bytes it was built with): nothing that needs it is started."""


class DriverProtocolRefused(ProgramError):
    """The version's artifact was built for another driver protocol: it cannot run on this platform."""


def protocol_problem(app: AppSpec, version: str) -> str | None:
    """Why `version` of `app` cannot run on this platform's driver (its artifact's protocol), or
    None: it can, or it runs installed code, or its artifact is missing (said where it is launched)."""
    if app.artifact is None:
        return None
    try:
        artifact = resolve_artifact(app, version)
    except ProgramError:
        return None
    problem = driver_protocol_problem(artifact)
    return f"{app.name}: {problem}" if problem else None


@dataclass(frozen=True)
class ProgramInfo:
    """What a program declares (program_contract), as data."""

    reference: str
    name: str
    input_roles: tuple[str, ...]
    output_roles: tuple[str, ...] | None
    settings_schema: dict
    input_fields: dict[str, list[dict]]
    reads_outputs: tuple[str, ...]
    query_names: tuple[str, ...]
    output_roles_setting: str | None = None
    stateful_operators: dict[str, list[str]] = field(default_factory=dict)
    state_settings: dict[str, list[str]] = field(default_factory=dict)
    window_counts: dict[str, WindowCountOutput] = field(default_factory=dict)
    lineage_outputs: dict[str, LineageOutput] = field(default_factory=dict)
    # Where the code comes from: the artifact (name, version, digest), or None: installed here.
    artifact: Artifact | None = None

    @classmethod
    def from_description(cls, reference: str, data: dict, artifact: Artifact | None = None) -> ProgramInfo:
        return cls(
            reference=reference,
            name=data["name"],
            input_roles=tuple(data["input_roles"]),
            output_roles=None if data["output_roles"] is None else tuple(data["output_roles"]),
            settings_schema=data["settings_schema"],
            input_fields=data["input_fields"],
            reads_outputs=tuple(data["reads_outputs"]),
            query_names=tuple(data["query_names"]),
            output_roles_setting=data.get("output_roles_setting"),
            stateful_operators=data.get("stateful_operators") or {},
            state_settings=data.get("state_settings") or {},
            window_counts={role: WindowCountOutput(**w) for role, w in (data.get("window_counts") or {}).items()},
            lineage_outputs={role: LineageOutput(**w) for role, w in (data.get("lineage_outputs") or {}).items()},
            artifact=artifact,
        )

    def role_problems(
        self, inputs: set[str], outputs: set[str], reads_outputs: set[str], settings: Any = None
    ) -> list[tuple[str, str]]:
        """How an app's roles differ from the program's (field, then the difference)."""
        problems = []
        if self.output_roles_setting:
            named = settings.get(self.output_roles_setting) if isinstance(settings, dict) else None
            if isinstance(named, dict) and set(named) != outputs:
                problems.append(("outputs", f"program {self.reference} writes one output role per key of "
                                            f"settings.{self.output_roles_setting} ({sorted(named)}), the catalog gives "
                                            f"{sorted(outputs)}"))
        if inputs != set(self.input_roles):
            problems.append(("inputs", f"program {self.reference} reads the roles {sorted(self.input_roles)}, the catalog "
                                       f"gives {sorted(inputs)}"))
        if self.output_roles is not None and outputs != set(self.output_roles):
            problems.append(("outputs", f"program {self.reference} writes the roles {sorted(self.output_roles)}, the "
                                        f"catalog gives {sorted(outputs)}"))
        if reads_outputs != set(self.reads_outputs):
            problems.append(("reads_outputs", f"program {self.reference} reads back the output roles "
                                              f"{sorted(self.reads_outputs)}; the catalog says {sorted(reads_outputs)} "
                                              "(Terraform grants Read on exactly these)"))
        return problems

    def settings_problems(self, settings: dict) -> list[tuple[tuple, str]]:
        """What the settings schema refuses in the app's settings, as (path, message). As strict as
        the program's pydantic model where the schema can say it: an integer is not 5.0, and a
        pattern's '$' is the end of the text (not before a final newline)."""
        validator = _strict_validator(self.settings_schema)
        problems = []
        for error in sorted(validator.iter_errors(settings), key=lambda e: list(e.absolute_path)):
            message = error.message
            path = tuple(error.absolute_path)
            if error.validator == "additionalProperties":
                known = set((error.schema or {}).get("properties") or {})
                for key in sorted(set(error.instance) - known):
                    problems.append(((*path, key), "unknown key (not a setting of this program; check the spelling)"))
                continue
            elif error.validator == "pattern":
                hint = PATTERN_HINTS.get(error.validator_value, f"the pattern {error.validator_value}")
                message = f"{error.instance!r} does not have the expected form ({hint})"
            elif error.validator == "required":
                message = error.message.replace("is a required property", "is required but missing")
            problems.append((path, message))
        return problems

    def with_defaults(self, settings: dict) -> dict:
        """The settings with the schema's defaults for what the app leaves out."""
        filled = dict(settings)
        for name, prop in (self.settings_schema.get("properties") or {}).items():
            if name not in filled and "default" in prop:
                filled[name] = prop["default"]
        return filled


def _strict_validator(schema: dict):
    import jsonschema

    def is_integer(_checker, value) -> bool:
        return isinstance(value, int) and not isinstance(value, bool)

    def pattern(validator, regex, instance, _schema):
        if isinstance(instance, str) and (not re.search(regex, instance) or (regex.endswith("$") and instance.endswith("\n"))):
            yield jsonschema.ValidationError(f"{instance!r} does not match {regex!r}")

    base = jsonschema.Draft202012Validator
    strict = jsonschema.validators.extend(
        base, validators={"pattern": pattern}, type_checker=base.TYPE_CHECKER.redefine("integer", is_integer)
    )
    return strict(schema)


def parse_reference(reference: str) -> tuple[str, str]:
    if not re.fullmatch(REFERENCE_PATTERN, reference or ""):
        raise ProgramError(f"{reference!r} is not an importable reference such as 'my_pipelines.dedup' or "
                           "'my_pipelines.dedup:program'")
    module, _, attribute = reference.partition(":")
    return module, attribute or DEFAULT_ATTRIBUTE


def import_program(reference: str) -> StreamingProgram:
    """The program object of `reference`, imported in this process."""
    module_name, attribute = parse_reference(reference)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and (module_name == exc.name or module_name.startswith(exc.name + ".")):
            raise ProgramError(f"program {reference!r}: no module {exc.name!r} here (a typo, or a package not "
                               "installed: name an artifact instead)") from None
        raise ProgramError(f"program {reference!r} does not import: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - a program's import error is the user's to read
        raise ProgramError(f"program {reference!r} does not import: {type(exc).__name__}: {exc}") from None
    if not hasattr(module, attribute):
        raise ProgramError(f"program {reference!r}: module {module_name} has no {attribute!r}")
    program = getattr(module, attribute)
    problems = contract_problems(program, reference)
    if problems:
        raise ProgramError("; ".join(problems))
    return program


_INFO_CACHE: dict[tuple, ProgramInfo] = {}


def program_info(app: AppSpec, version: str | None = None, expected_digest: str | None = None) -> ProgramInfo:
    """What the app's program declares, at `version` (default: the catalog's). For an artifact
    app, from that version's manifest (its digest checked); else by importing the program."""
    version = version or app.version
    if app.artifact:
        artifact = resolve_artifact(app, version, expected_digest)
        return ProgramInfo.from_description(app.program, artifact.manifest["description"], artifact)
    key = (app.program, None)
    if key not in _INFO_CACHE:
        _INFO_CACHE[key] = ProgramInfo.from_description(app.program, describe(import_program(app.program)))
    return _INFO_CACHE[key]


def running_version(app: AppSpec) -> str:
    """The version the app's driver last ran (its driver record), else the catalog's."""
    version = (AppRuntime(app.checkpoint_location()).driver() or DriverRecord()).launched_version
    # driver.json is a file on the shared checkpoint volume: its version becomes a store path.
    if not isinstance(version, str) or len(version) > 64 or not re.fullmatch(VERSION_PATTERN, version):
        return app.version
    return version


def ran_digest(app: AppSpec, version: str) -> str | None:
    """The artifact digest the app's last driver ran `version` with (None: it did not run it):
    a version that ran is pinned to those bytes."""
    record = AppRuntime(app.checkpoint_location()).driver() or DriverRecord()
    ran = str(record.launched_version or "")
    # Build metadata (a cutover's 1.0.0+v2) names the same code.
    same = ran.split("+", 1)[0] == version.split("+", 1)[0]
    return record.artifact_digest if same else None


def resolve_artifact(app: AppSpec, version: str, expected_digest: str | None = None) -> Artifact:
    if app.artifact is None:
        raise ProgramError(f"{app.name} names no artifact in the catalog: it runs the code installed here")
    try:
        store = ArtifactStore()
        # Build metadata (1.0.0+v2: a cutover's topic version) does not name other code (semver).
        if "+" in version and not (store.folder(app.artifact, version) / "manifest.json").is_file():
            version = version.split("+", 1)[0]
        artifact = store.resolve(app.artifact, version, expected_digest,
                                 build_hint=f"streamops artifact build --app {app.name} --version {version} [--source DIR]")
    except ArtifactError as exc:
        raise ProgramError(str(exc)) from None
    if artifact.program != app.program:
        raise ProgramError(f"artifact {artifact.short()} holds program {artifact.program!r}, the catalog names "
                           f"{app.program!r} for {app.name}")
    return artifact


def load_program(app: AppSpec, version: str | None = None) -> StreamingProgram:
    """The app's program object in this process (for work that runs its code here: building a
    reconciliation's recomputation). An artifact's code is put first on the path, once per
    process: a process that already imported the package from elsewhere is refused, since two
    versions of one package cannot share a Python process."""
    if app.artifact:
        artifact = resolve_artifact(app, version or app.version)
        package = artifact.manifest.get("package") or parse_reference(app.program)[0].split(".")[0]
        loaded = sys.modules.get(package)
        origin = str(artifact.path)
        if loaded is not None and not str(getattr(loaded, "__file__", "") or "").startswith(origin) \
                and not _same_code(loaded, artifact.path):
            raise ProgramError(
                f"{app.name}: this process already imported package {package!r} from {getattr(loaded, '__file__', '?')}; "
                f"the code of {artifact.short()} must run in a process of its own (a driver)"
            )
        if origin not in sys.path:
            sys.path.insert(0, origin)
    return import_program(app.program)


def _same_code(loaded: Any, artifact_zip: Path) -> bool:
    """Is the package this process imported byte for byte the artifact's (every file of the zip
    under it, and no other Python file)? Then its code is the artifact's, wherever it was read from
    (the checkout an artifact was just built from)."""
    import zipfile

    folder = Path(getattr(loaded, "__file__", "") or "").parent
    if not folder.is_dir():
        return False
    prefix = f"{folder.name}/"
    with zipfile.ZipFile(artifact_zip) as archive:
        entries = {name[len(prefix):]: name for name in archive.namelist() if name.startswith(prefix) and not name.endswith("/")}
        here = {str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file() and "__pycache__" not in p.parts}
        if {e for e in entries if e.endswith(".py")} != {h for h in here if h.endswith(".py")}:
            return False
        return all(
            (folder / rel).is_file() and (folder / rel).read_bytes() == archive.read(name) for rel, name in entries.items()
        )


def settings_dict(app: AppSpec) -> dict[str, Any]:
    """The app's settings as a mapping with the program's defaults, however they are held (a
    dict, or a program's model). An artifact app's catalog entry keeps what its author wrote (a
    later version may drop a setting); its defaults come from the version it runs."""
    settings = app.settings
    if hasattr(settings, "model_dump"):
        return settings.model_dump(mode="json")
    if app.artifact:
        return program_info(app, running_version(app)).with_defaults(dict(settings or {}))
    return dict(settings or {})


def _describe_command(reference: str) -> int:
    """`python -m streamops.programs describe REF`: the declarations as one JSON line (used by the
    artifact build, in a Python whose path starts with the built zip)."""
    try:
        program = import_program(reference)
    except ProgramError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    print(json.dumps(describe(program), sort_keys=True))
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2 or argv[0] != "describe":
        print("usage: python -m streamops.programs describe <module[:attribute]>", file=sys.stderr)
        return 2
    return _describe_command(argv[1])


if __name__ == "__main__":
    sys.exit(main())
