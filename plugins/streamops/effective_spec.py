"""What an app runs: its one effective spec, the approved changes the catalog does not say yet,
and drift (what the catalog declares against what the live driver runs).

    effective spec = the app's catalog entry, resolved for the environment
                   + the changes approved since: a reprocess cutover's topic bindings
                     (<checkpoint>/_runtime/approved.json), the version and Spark conf a roll,
                     trigger or restore asked for (the launch that asked for them)
                   + the Kafka cluster it runs against (by cluster id)

`bind_app` and `BoundApp.spec` build it, and every launch path passes there (streamops.dag_tasks.launching:
deploy, roll and rollback, the standby, the recoveries, the supervisor's restarts, restore, the
cutover). The driver gets the spec's catalog as a file of its own (`launch-catalog.yaml` in the
runtime folder, the main catalog with the approved bindings applied), and records the spec and
its digest in its launch record (driver.json `launch.spec`), where drift reads it back.

The suite never edits the operator's catalog: an approved change the catalog does not say shows
as drift with the exact catalog edit that commits it (`catalog_edit`).
No Airflow here.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError

from streamops.app_runtime import AppRuntime, DriverRecord
from streamops.artifacts import file_digest
from streamops.catalog import AppSpec, Catalog
from streamops.checkpoints import CheckpointOfAnotherCluster, bind_cluster
from streamops.programs import ProgramError, parse_reference, program_info, resolve_artifact
from streamops.refusals import OneLineRefused
from streamops.runtime_files import read_json, write_json_atomic
from streamops.timestamps import now_iso

APPROVED_FILE = "approved.json"
LAUNCH_CATALOG_FILE = "launch-catalog.yaml"
INSTALLED = "installed"
# The fields drift compares, in the order an operator reads them.
DRIFT_FIELDS = ("version", "code", "program", "settings", "spark_conf", "inputs", "outputs", "dead_letter_topic",
                "trigger", "environment", "principal", "kafka_cluster")


class SpecRefused(OneLineRefused):
    """The app's effective spec cannot be built (an approval file that cannot be read, a
    checkpoint of another Kafka cluster): nothing was started."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# A legal Kafka topic name: the file is on a shared volume, and its names become the driver's topics.
TopicName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9._-]{1,249}$")]


class ApprovedChange(_Strict):
    """One approved change that the catalog did not say when it was made."""

    kind: str  # cutover
    topics: dict[TopicName, TopicName] = Field(default_factory=dict)  # topic the catalog named -> the one it runs on
    run_id: str
    by: str | None = None
    at: str


class ApprovedChanges(_Strict):
    """<checkpoint>/_runtime/approved.json: the approved topic bindings every later launch keeps.
    An entry whose topic the catalog no longer names for the app is spent: the catalog was edited
    to say it (or to say something else, which drift then shows)."""

    topics: dict[TopicName, TopicName] = Field(default_factory=dict)
    history: list[ApprovedChange] = Field(default_factory=list)


def read_approved(runtime: AppRuntime) -> ApprovedChanges:
    """The app's approved changes; none when there is no file. A file that cannot be read is a
    refusal, never "no approvals": launching without them would write to the topics a cutover left."""
    path = runtime.dir / APPROVED_FILE
    if not path.exists():
        return ApprovedChanges()
    raw = read_json(path)
    try:
        return ApprovedChanges.model_validate(raw)
    except ValidationError as exc:
        raise SpecRefused(
            f"{path} (the approved changes every launch of the app keeps, e.g. a cutover's new topics) cannot be read: "
            f"{exc.errors()[0]['msg'] if exc.errors() else exc}; put back the file the last cutover wrote (its run log "
            "names the topics), nothing was started") from None


def approve_topics(runtime: AppRuntime, topics: dict[str, str], *, run_id: str, by: str | None) -> ApprovedChanges:
    """Record that the app runs on `topics` (the topic it runs on now -> the new one) from now on,
    composed with earlier cutovers (a -> b, then b -> c: a -> c)."""
    before = read_approved(runtime)
    composed = {old: topics.get(new, new) for old, new in before.topics.items()}
    # The topic it runs on now is bound too: the catalog may already name it (a cutover committed).
    composed.update(topics)
    composed = {old: new for old, new in composed.items() if old != new}
    approved = ApprovedChanges(
        topics=composed,
        history=[*before.history, ApprovedChange(kind="cutover", topics=dict(topics), run_id=run_id, by=by, at=now_iso())],
    )
    runtime.dir.mkdir(parents=True, exist_ok=True)
    write_json_atomic(runtime.dir / APPROVED_FILE, approved.model_dump(mode="json"), indent=1)
    return approved


def with_bindings(catalog: Catalog, app_name: str, topics: dict[str, str]) -> Catalog:
    """The catalog with the app bound to the approved topics (each new topic declared as a copy of
    the one it replaces, as the cutover created it). Other apps are untouched."""
    app = catalog.app(app_name)
    live = {t for t in app.topics() if t in topics}
    if not live:
        return catalog
    known = set(catalog.topic_names())
    copies = [catalog.topic(t).model_copy(update={"name": topics[t]}) for t in sorted(live) if topics[t] not in known]
    bound = app.model_copy(update={
        "inputs": {role: topics.get(t, t) for role, t in app.inputs.items()},
        "outputs": {role: topics.get(t, t) for role, t in app.outputs.items()},
        "dead_letter_topic": topics.get(app.dead_letter_topic, app.dead_letter_topic),
    })
    return catalog.model_copy(update={"topics": [*catalog.topics, *copies],
                                      "apps": [bound if a.name == app_name else a for a in catalog.apps]})


class EffectiveSpec(_Strict):
    """What one launch of an app runs (the fields drift compares), and which of them an approved
    change set rather than the catalog (`approved`: field -> by what)."""

    app: str
    environment: str
    version: str
    code: str  # the artifact's digest (sha256:...), or "installed" with the installed module's digest
    program: str
    settings: dict[str, Any]
    spark_conf: dict[str, str]
    inputs: dict[str, str]
    outputs: dict[str, str]
    dead_letter_topic: str
    trigger: str
    principal: str | None = None
    kafka_cluster: str | None = None
    # Which fields an approved change set rather than the catalog: field path ("outputs.contacts",
    # "spark_conf.spark.driver.memory", "version") -> by what.
    approved: dict[str, str] = Field(default_factory=dict)

    def digest(self) -> str:
        """sha256 over what runs (not over `approved`, which says why)."""
        body = json.dumps(self.model_dump(mode="json", exclude={"approved"}), sort_keys=True, separators=(",", ":"))
        return "sha256:" + hashlib.sha256(body.encode()).hexdigest()

    def to_record(self) -> dict[str, Any]:
        return {**self.model_dump(mode="json"), "digest": self.digest()}


def installed_code(program: str) -> str:
    """'installed sha256:...' for a program run from this environment (the digest the driver
    records for its module file), or 'installed' when its module cannot be found here."""
    module, _ = parse_reference(program)
    try:
        found = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        found = None
    origin = getattr(found, "origin", None)
    return f"{INSTALLED} {file_digest(origin)}" if origin and os.path.isfile(origin) else INSTALLED


def effective_settings(app: AppSpec, version: str) -> dict[str, Any]:
    """The program settings with the defaults of the version that runs, however the catalog was
    read (its programs checked or not), so declared and running compare like for like."""
    settings = app.settings
    if hasattr(settings, "model_dump"):
        settings = settings.model_dump(mode="json")
    settings = json.loads(json.dumps(settings or {}, sort_keys=True, default=str))
    try:
        return program_info(app, version).with_defaults(settings)
    except ProgramError:  # the version is not built: as written (drift shows its code as missing)
        return settings


def spec_of(app: AppSpec, *, environment: str, version: str, code: str, spark_conf: dict[str, str],
            principal: str | None, kafka_cluster: str | None, approved: dict[str, str] | None = None) -> EffectiveSpec:
    conf = {key: str(value).lower() if isinstance(value, bool) else str(value) for key, value in app.spark_conf.items()}
    return EffectiveSpec(
        app=app.name, environment=environment, version=version, code=code, program=app.program,
        settings=effective_settings(app, version), spark_conf={**conf, **spark_conf},
        inputs=dict(app.inputs), outputs=dict(app.outputs), dead_letter_topic=app.dead_letter_topic,
        trigger=app.trigger, principal=principal, kafka_cluster=kafka_cluster, approved=approved or {},
    )


@dataclass(frozen=True)
class BoundApp:
    """The app as its next launch runs it: the catalog with the approved bindings applied, written
    to the catalog file its driver reads, and which fields an approved change set (field -> by what)."""

    app: AppSpec
    catalog: Catalog
    catalog_file: Path
    approved: dict[str, str]

    def spec(self, *, version: str, spark_conf: dict[str, str], code: str, principal: str | None,
             kafka_cluster: str | None) -> EffectiveSpec:
        """The launch's effective spec at `version` with the `spark_conf` overrides asked for."""
        why = dict(self.approved)
        if version != self.app.version:
            why["version"] = "the launch's version (a roll, restore or trigger)"
            why["code"] = why["version"]
        for key in sorted(spark_conf):
            why[f"spark_conf.{key}"] = "the launch's Spark conf (a roll, restore or trigger)"
        return spec_of(self.app, environment=self.catalog.environment, version=version, code=code, spark_conf=spark_conf,
                       principal=principal, kafka_cluster=kafka_cluster, approved=why)


def launch_cluster(app: AppSpec, kafka: Any) -> str:
    """The id of the Kafka cluster a launch of `app` runs against through `kafka` (asked through
    one of its input topics: its principal may describe no other), checked against the cluster the
    app's checkpoint was written against and recorded there. SpecRefused, nothing started, if the
    cluster does not say its id or the checkpoint belongs to another one."""
    from confluent_kafka import KafkaException

    try:
        found = kafka.cluster_id(next(iter(app.inputs.values())))
    except KafkaException as exc:
        raise SpecRefused(f"{app.name}: the Kafka cluster at {kafka.describe()} did not say its id ({exc}); nothing was "
                          "started") from None
    if not found:
        raise SpecRefused(f"{app.name}: the Kafka cluster at {kafka.describe()} did not say its id; nothing was started")
    try:
        bind_cluster(app.name, app.checkpoint_location(), found, kafka.bootstrap_servers)
    except CheckpointOfAnotherCluster as exc:
        raise SpecRefused(f"{exc}; nothing was started") from None
    return found


def effective_catalog(catalog: Catalog, app_name: str) -> Catalog:
    """The catalog as the app runs it: with its approved topic bindings (for work that continues
    the live app, e.g. a reprocess of what it writes now)."""
    app = catalog.app(app_name)
    return with_bindings(catalog, app_name, read_approved(AppRuntime(app.checkpoint_location())).topics)


def bind_app(catalog: Catalog, app_name: str) -> BoundApp:
    """The app with its approved changes, and its driver's catalog file (written now, in the
    runtime folder: launch-catalog.yaml)."""
    declared = catalog.app(app_name)
    runtime = AppRuntime(declared.checkpoint_location())
    approved = read_approved(runtime)
    bound_catalog = with_bindings(catalog, app_name, approved.topics)
    app = bound_catalog.app(app_name)
    why: dict[str, str] = {}
    last = approved.history[-1] if approved.history else None
    by = (f"the {last.kind} by run {last.run_id}" + (f" ({last.by})" if last.by else "")) if last else "an approved change"
    for field_name in ("inputs", "outputs"):
        for role, topic in getattr(app, field_name).items():
            if getattr(declared, field_name).get(role) != topic:
                why[f"{field_name}.{role}"] = by
    if app.dead_letter_topic != declared.dead_letter_topic:
        why["dead_letter_topic"] = by
    runtime.dir.mkdir(parents=True, exist_ok=True)
    catalog_file = runtime.dir / LAUNCH_CATALOG_FILE
    tmp = catalog_file.with_name(f".{catalog_file.name}.{os.getpid()}.tmp")
    tmp.write_text(f"# The catalog {app_name}'s driver was last launched with (streamops.effective_spec): the main catalog "
                   "with the approved changes applied. Written by the suite at every launch; never edit it.\n"
                   + bound_catalog.to_yaml())
    os.replace(tmp, catalog_file)
    return BoundApp(app, bound_catalog, catalog_file, why)


# --- drift ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DriftField:
    field: str
    declared: Any
    running: Any
    # "approved": an approved change the catalog does not say yet (commit it with the catalog
    # edit); "catalog": the catalog changed since the launch (a reconcile rolls it out).
    cause: str
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"field": self.field, "declared": self.declared, "running": self.running, "cause": self.cause, "note": self.note}


@dataclass(frozen=True)
class Drift:
    app: str
    state: str  # in sync | drifted | unknown (no spec recorded) | not running
    fields: list[DriftField]
    running_digest: str | None = None
    declared_digest: str | None = None
    catalog_edit: str = ""  # the YAML edit that makes the catalog say the approved changes
    evidence: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"app": self.app, "state": self.state, "fields": [f.to_dict() for f in self.fields],
                "running_digest": self.running_digest, "declared_digest": self.declared_digest,
                "catalog_edit": self.catalog_edit, "evidence": self.evidence}

    def line(self) -> str:
        """One log line: 'oplog-router in sync' or 'oplog-router drifted: outputs.contacts: ...'."""
        if not self.fields:
            return f"{self.app}: {self.state}" + (f" ({self.evidence})" if self.evidence else "")
        return f"{self.app}: {self.state}: " + "; ".join(_field_text(f) for f in self.fields)


def _field_text(item: DriftField) -> str:
    text = f"{item.field}: the catalog says {_short(item.declared)}, it runs {_short(item.running)}"
    return f"{text} ({item.note})" if item.note else text


def _short(value: Any) -> str:
    text = json.dumps(value, sort_keys=True) if not isinstance(value, str) else value
    return text if len(text) <= 160 else text[:157] + "..."


def declared_spec(catalog: Catalog, app_name: str, *, principal: str | None, kafka_cluster: str | None) -> EffectiveSpec:
    """What the catalog alone declares for the app (its version's code, no approved change)."""
    app = catalog.app(app_name)
    if app.artifact:
        try:
            code = resolve_artifact(app, app.version).digest
        except ProgramError:
            code = f"no artifact of {app.version} built"
    else:
        code = installed_code(app.program)
    return spec_of(app, environment=catalog.environment, version=app.version, code=code, spark_conf={},
                   principal=principal, kafka_cluster=kafka_cluster)


def _flatten(name: str, declared: Any, running: Any) -> list[tuple[str, Any, Any]]:
    """Mappings compared key by key ('outputs.contacts'), everything else as a whole."""
    if isinstance(declared, dict) and isinstance(running, dict):
        return [(f"{name}.{key}", declared.get(key), running.get(key))
                for key in sorted(set(declared) | set(running)) if declared.get(key) != running.get(key)]
    return [(name, declared, running)] if declared != running else []


def drift(catalog: Catalog, app_name: str, runtime: AppRuntime, *, principal: str | None,
          kafka_cluster: str | None) -> Drift:
    """Declared (the catalog) against running (the spec the live or last driver recorded), field
    by field; which differences an approved change explains, and the catalog edit that commits them."""
    record = runtime.driver() or DriverRecord()
    running_raw = record.launch.spec
    declared = declared_spec(catalog, app_name, principal=principal, kafka_cluster=kafka_cluster)
    if record.app is None:
        return Drift(app_name, "not running", [], declared_digest=declared.digest(), evidence="never started here")
    if not running_raw:
        return Drift(app_name, "unknown", [], declared_digest=declared.digest(),
                     evidence="its driver was launched before launches recorded their spec: the next roll or restart records it")
    running = dict(running_raw)
    approved = running.get("approved") or {}
    found: list[DriftField] = []
    for name in DRIFT_FIELDS:
        for field_path, want, have in _flatten(name, getattr(declared, name), running.get(name)):
            if name == "code" and str(have or "").startswith(INSTALLED) and str(want).startswith(INSTALLED):
                cause, note = "catalog", "the installed code changed since the launch"
            elif (why := approved.get(field_path) or approved.get(name)) is not None:
                cause, note = "approved", f"set by {why}; the catalog still names {_short(want)}"
            elif name == "code" and running.get("version") != declared.version:
                cause, note = "catalog", "another version's code"
            else:
                cause, note = "catalog", "the catalog changed since the launch"
            found.append(DriftField(field_path, want, have, cause, note))
    state = "in sync" if not found else "drifted"
    return Drift(app_name, state, found, running_digest=running_raw.get("digest"), declared_digest=declared.digest(),
                 catalog_edit=catalog_edit(catalog, app_name, [f for f in found if f.cause == "approved"]))


def catalog_edit(catalog: Catalog, app_name: str, approved: list[DriftField]) -> str:
    """The edit of the catalog file, as a unified diff of the app's entry, that makes the catalog
    say the approved changes (topic bindings, version); '' when there is none."""
    import difflib

    import yaml

    if not approved:
        return ""
    app = catalog.app(app_name)
    before = {"name": app.name, "version": app.version, "inputs": dict(app.inputs), "outputs": dict(app.outputs),
              "dead_letter_topic": app.dead_letter_topic}
    after = json.loads(json.dumps(before))
    for item in approved:
        head, _, key = item.field.partition(".")
        if head in ("inputs", "outputs") and key:
            after[head][key] = item.running
        elif head in ("dead_letter_topic", "version"):
            after[head] = item.running
    if after == before:
        return ""
    lines = list(difflib.unified_diff(
        yaml.safe_dump([before], sort_keys=False).splitlines(), yaml.safe_dump([after], sort_keys=False).splitlines(),
        fromfile="catalog/pipelines.yaml (apps: " + app_name + ")", tofile="as it runs", lineterm=""))
    new_topics = sorted(
        {item.running for item in approved if item.field.split(".")[0] in ("inputs", "outputs", "dead_letter_topic")}
        - set(catalog.topic_names())
    )
    if new_topics:
        lines.append(f"# and declare the topic(s) {', '.join(new_topics)} under topics: (copies of the ones they replace)")
    return "\n".join(lines)
