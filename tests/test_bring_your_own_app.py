"""Apps the suite did not ship: a program from outside spark_apps/ (tests/fixtures/byo_apps,
never on the path) run from versioned artifacts, and the router rolled to an artifact of other
code and back. Everything through real Airflow task runs, real drivers and a real broker; the
suite (plugins/streamops, dags/, terraform/) knows nothing of the fixture program."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import unquote

import pytest

from streamops.app_runtime import AppRuntime, CodeRecord
from streamops.artifacts import ArtifactError, ArtifactStore, build
from streamops.catalog import CatalogError, load_catalog
from streamops.kafka_records import produce, read_all
from streamops.spark_submit import DRIVER_ENTRYPOINT
from streamops.waiting import poll_until
from tests.support import LOCAL_SPARK_CONNECTION
from tests.support.artifacts import private_store, router_source

FIXTURE = Path(__file__).parent / "fixtures" / "byo_apps"


def revision_two(tmp_path: Path) -> Path:
    """A copy of the fixture package whose code is revision 2 (currency optional)."""
    copy = tmp_path / "acme-r2"
    shutil.copytree(FIXTURE / "acme_pipelines", copy / "acme_pipelines")
    module = copy / "acme_pipelines" / "dedup.py"
    text = module.read_text()
    assert "\nREVISION = 1\n" in text
    module.write_text(text.replace("\nREVISION = 1\n", "\nREVISION = 2\n"))
    return copy


@pytest.fixture
def store(tmp_path, monkeypatch) -> ArtifactStore:
    return private_store(tmp_path, monkeypatch)


# --- artifacts and the catalog (no Spark) -------------------------------------------------------


def test_an_artifact_is_immutable_reproducible_and_checked(store, tmp_path):
    first, new = build("acme-dedup", "1.0.0", "acme_pipelines.dedup", source=FIXTURE, store=store)
    assert new and first.digest.startswith("sha256:") and first.manifest["description"]["name"] == "acme_dedup"
    assert first.manifest["description"]["stateful_operators"] == {
        "dedup": ["dropDuplicatesWithinWatermark(event_id): the event ids seen within the watermark"]}
    again, new = build("acme-dedup", "1.0.0", "acme_pipelines.dedup", source=FIXTURE, store=store)
    assert not new and again.digest == first.digest  # the same source gives the same bytes
    with pytest.raises(ArtifactError, match=r"acme-dedup 1\.0\.0 exists with digest sha256:.*give the change a new version"):
        build("acme-dedup", "1.0.0", "acme_pipelines.dedup", source=revision_two(tmp_path), store=store)

    # Bytes changed after the build: refused by the store, and by the driver before it imports them.
    tampered = first.path
    tampered.chmod(0o644)
    tampered.write_bytes(tampered.read_bytes() + b"\0")
    with pytest.raises(ArtifactError, match=r"artifact acme-dedup 1\.0\.0 refused: .* has digest sha256:.*its manifest says"):
        store.resolve("acme-dedup", "1.0.0")
    driver = subprocess.run([sys.executable, str(DRIVER_ENTRYPOINT), "--app", "acme-dedup", "--program", "acme_pipelines.dedup",
                             "--artifact", str(tampered), "--artifact-digest", first.digest],
                            capture_output=True, text=True, timeout=120)
    assert driver.returncode == 5
    assert f"refused: artifact {tampered} has digest sha256:" in driver.stderr and f"expected {first.digest}" in driver.stderr


def test_the_catalog_refuses_apps_that_do_not_fit_their_program(store, tmp_path):
    build("acme-dedup", "1.0.0", "acme_pipelines.dedup", source=FIXTURE, store=store)
    good = (FIXTURE / "catalog.yaml").read_text()

    def problems(text: str) -> list[str]:
        path = tmp_path / "catalog.yaml"
        path.write_text(text.replace("expectations/", f"{FIXTURE}/expectations/"))
        with pytest.raises(CatalogError) as caught:
            load_catalog(path)
        assert str(path) in str(caught.value)
        return caught.value.problems

    assert load_catalog(FIXTURE / "catalog.yaml").app("acme-dedup").settings == {
        "watermark": "10 minutes", "source_name": "acme-web"}
    assert problems(good.replace("version: 1.0.0", "version: 1.2.0")) == [
        f"apps[0] 'acme-dedup' (line 31), field 'artifact': no artifact acme-dedup 1.2.0 in the store {store.root} (built "
        "versions: 1.0.0); build it with: streamops artifact build --app acme-dedup --version 1.2.0 [--source DIR]"
    ]
    assert problems(good.replace("watermark: 10 minutes", "watermark: 10 mins\n      colour: blue")) == [
        "apps[0] 'acme-dedup' (line 48), field 'settings.colour': "
        "unknown key (not a setting of this program; check the spelling) "
        f"(program acme_pipelines.dedup, artifact acme-dedup 1.0.0 ({store.resolve('acme-dedup', '1.0.0').digest[:19]}))",
        "apps[0] 'acme-dedup' (line 47), field 'settings.watermark': '10 mins' does not have the expected form "
        "(a Spark interval such as '10 seconds' or '5 minutes') (program acme_pipelines.dedup, artifact acme-dedup 1.0.0 "
        f"({store.resolve('acme-dedup', '1.0.0').digest[:19]}))",
    ]
    assert problems(good.replace("      unique_payments: acme.unique-payments", "      unique: acme.unique-payments")) == [
        "apps[0] 'acme-dedup' (line 39), field 'outputs': program acme_pipelines.dedup writes the roles ['unique_payments'], "
        "the catalog gives ['unique']"
    ]
    assert problems(good.replace("    artifact: acme-dedup\n", "    code: installed\n")) == [
        "apps[0] 'acme-dedup' (line 30), field 'program': program 'acme_pipelines.dedup': no module 'acme_pipelines' here "
        "(a typo, or a package not installed: name an artifact instead)"
    ]
    with_reads_outputs = good.replace("    artifact: acme-dedup\n",
                                      "    artifact: acme-dedup\n    reads_outputs: [unique_payments]\n")
    assert problems(with_reads_outputs) == [
        "apps[0] 'acme-dedup' (line 32), field 'reads_outputs': program acme_pipelines.dedup reads back the output roles [];"
        " the catalog says ['unique_payments'] (Terraform grants Read on exactly these)"
    ]


def test_what_reaches_a_store_path_or_the_driver_path_is_only_a_name_and_a_version(store, tmp_path, monkeypatch):
    from streamops.programs import running_version

    build("acme-dedup", "1.0.0", "acme_pipelines.dedup", source=FIXTURE, store=store)
    with pytest.raises(ArtifactError, match=r"'acme-dedup' '\.\./\.\./x': not an artifact name and a semantic version"):
        store.resolve("acme-dedup", "../../x")
    # driver.json lives on the shared checkpoint volume: a version there that is not a version is ignored.
    monkeypatch.setenv("STREAMOPS_CHECKPOINT_ROOT", str(tmp_path / "checkpoints"))
    app = load_catalog(FIXTURE / "catalog.yaml").app("acme-dedup")
    runtime = Path(app.checkpoint_location()) / "_runtime"
    runtime.mkdir(parents=True)
    (runtime / "driver.json").write_text(json.dumps({"version": "../../../tmp/x", "launch": {"version": "1.0.0/../../y"}}))
    assert running_version(app) == "1.0.0"
    # A package the runtime (or Python) provides never comes from an artifact: it would come first.
    shadow = tmp_path / "shadow" / "pydantic"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("program = None\n")
    with pytest.raises(ArtifactError, match=r"would carry pydantic: the runtime \(or Python itself\) provides it"):
        build("shadow", "1.0.0", "pydantic:program", source=tmp_path / "shadow", store=store)
    # The schema is as strict as the model: a final newline after an interval is not an interval.
    text = (FIXTURE / "catalog.yaml").read_text().replace("watermark: 10 minutes", 'watermark: "10 minutes\\n"')
    (tmp_path / "catalog.yaml").write_text(text.replace("expectations/", f"{FIXTURE}/expectations/"))
    with pytest.raises(CatalogError, match=r"field 'settings.watermark': '10 minutes\\n' does not have the expected form"):
        load_catalog(tmp_path / "catalog.yaml")


def test_a_version_that_ran_is_pinned_to_the_bytes_it_ran(store, tmp_path, monkeypatch):
    """A launch of a version the app ran (restart, rollback, backfill of the running version)
    refuses a store copy replaced since, before anything is started or stopped."""
    from streamops.kafka_client import KafkaClientConfig
    from streamops.programs import ProgramError
    from streamops.spark_submit import submit_spec

    artifact, _ = build("acme-dedup", "1.0.0", "acme_pipelines.dedup", source=FIXTURE, store=store)
    monkeypatch.setenv("STREAMOPS_CHECKPOINT_ROOT", str(tmp_path / "checkpoints"))
    app = load_catalog(FIXTURE / "catalog.yaml").app("acme-dedup")
    kafka = KafkaClientConfig.plaintext("127.0.0.1:9", source="test")
    spec = submit_spec(app, kafka=kafka)
    assert spec.py_files == [str(artifact.path)] and spec.digest == artifact.digest
    assert spec.application_args[spec.application_args.index("--artifact-digest") + 1] == artifact.digest

    runtime = Path(app.checkpoint_location()) / "_runtime"
    ran = "sha256:" + "0" * 64  # what the driver ran: not what the store holds now
    (runtime / "driver.json").write_text(json.dumps({"version": "1.0.0", "code": {"artifact": "x", "digest": ran}}))
    with pytest.raises(ProgramError,
                       match=rf"its digest is {artifact.digest}, but {ran} was expected .* the store's copy was replaced"):
        submit_spec(app, kafka=kafka)
    with pytest.raises(ProgramError, match="the store's copy was replaced"):
        submit_spec(app, kafka=kafka, version="1.0.0+v2")  # a cutover's label names the same code


# --- the fourth app, end to end ------------------------------------------------------------------


def payment(n: int, *, currency: bool = True, copy_of: int | None = None) -> tuple[str, str]:
    user = f"user-{n % 5}"
    body = {"event_id": f"pay-{copy_of if copy_of is not None else n}", "user_id": user, "amount": 100 + n,
            "event_time": datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")}
    if currency:
        body["currency"] = "EUR"
    return user, json.dumps(body)


def test_a_program_from_outside_the_project_is_provisioned_deployed_validated_reprocessed_replayed_and_rolled(
    run_dag, store, broker, admin, tmp_path, monkeypatch
):
    build("acme-dedup", "1.0.0", "acme_pipelines.dedup", source=FIXTURE, store=store)
    v11, _ = build("acme-dedup", "1.1.0", "acme_pipelines.dedup", source=revision_two(tmp_path), store=store)
    prefix = f"byo{os.getpid()}{tmp_path.name[-6:].replace('_', '')}".lower()
    catalog = load_catalog(FIXTURE / "catalog.yaml").with_topic_prefix(prefix)
    catalog_file = tmp_path / "catalog.yaml"
    catalog_file.write_text(catalog.to_yaml())
    monkeypatch.setenv("STREAMOPS_CHECKPOINT_ROOT", str(tmp_path / "checkpoints"))
    monkeypatch.setenv("STREAMOPS_QUALITY_ROOT", str(tmp_path / "quality"))
    monkeypatch.setenv("STREAMOPS_REPROCESS_ROOT", str(tmp_path / "reprocess"))  # not the checkout's .run/
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", LOCAL_SPARK_CONNECTION)
    app = catalog.app("acme-dedup")
    runtime = AppRuntime(app.checkpoint_location())
    kafka = broker.client_config
    try:
        provisioned = run_dag("provision_topics", catalog_file, dry_run=False)
        assert provisioned.state == "success", provisioned.task_states
        assert set(provisioned.xcoms["apply"]["applied"]) == set(catalog.topic_names())

        # 20 payments, 5 client retries of them, 3 without a currency (revision 1 refuses them).
        produce(kafka, app.inputs["payments"], [payment(n) for n in range(20)] + [payment(100 + n, copy_of=n) for n in range(5)]
                + [payment(200 + n, currency=False) for n in range(3)])
        deployed = run_dag("deploy_apps", catalog_file, apps=["acme-dedup"])
        assert deployed.state == "success", deployed.task_states
        unique = app.outputs["unique_payments"]
        poll_until(lambda: len(read_all(kafka, unique)) >= 20 and len(read_all(kafka, app.dead_letter_topic)) >= 3,
                   timeout=240, what="the dedup app's first output")
        written = [r.json() for r in read_all(kafka, unique)]
        assert sorted(v["event_id"] for v in written) == sorted(f"pay-{n}" for n in range(20))
        assert {(v["revision"], v["source"], v["currency"]) for v in written} == {(1, "acme-web", "EUR")}
        reasons = [r.json()["reason"] for r in read_all(kafka, app.dead_letter_topic)]
        assert len(reasons) == 3 and all("currency" in reason for reason in reasons), reasons

        v10 = store.resolve("acme-dedup", "1.0.0")
        status = run_dag("app_status", catalog_file, apps=["acme-dedup"]).xcoms["status"]["acme-dedup"]
        assert (status["state"], status["version"], status["code"]) == ("running", "1.0.0", v10.digest)
        assert runtime.driver().code == CodeRecord(artifact=str(v10.path), digest=v10.digest)

        validated = run_dag("validate_topic_quality", catalog_file, topics=[unique], range="last_records", last_records=1000)
        assert validated.state == "success", validated.task_states
        (outcome,) = validated.xcoms["validate"]
        assert outcome["success"] and outcome["records"] == 20
        assert outcome["written_by"] == f"acme-dedup 1.0.0 sha256 {v10.digest[7:19]}"
        docs = Path(unquote(outcome["data_docs"][0].removeprefix("file://")))
        assert f"sha256 {v10.digest[7:19]}" in docs.read_text()  # the Data Docs page names the code

        # Reprocess from earliest into versioned topics, with the running version's code.
        reprocessed = run_dag("reprocess", catalog_file, app="acme-dedup", start="earliest", end="now",
                              target="versioned", version="v2", dry_run=False)
        assert reprocessed.state == "success", reprocessed.task_states
        assert (reprocessed.xcoms["plan"]["program_version"], reprocessed.xcoms["plan"]["program_digest"]) == (
            "1.0.0", v10.digest)
        backfilled = [r.json() for r in read_all(kafka, f"{unique}.v2")]
        assert sorted(v["event_id"] for v in backfilled) == sorted(f"pay-{n}" for n in range(20))

        # Roll to 1.1.0 (revision 2: currency optional); then replay the dead letters: the running
        # version's input contract now accepts them, and 1.1.0 writes them once.
        rolled = run_dag("roll_restart_apps", catalog_file, apps=["acme-dedup"], version="1.1.0", gate_deadline_s=120)
        assert rolled.state == "success", rolled.task_states
        assert runtime.driver().code.digest == v11.digest
        replayed = run_dag("recover_replay_dead_letters", catalog_file, app="acme-dedup", dry_run=False)
        assert replayed.state == "success", replayed.task_states
        assert replayed.xcoms["apply"]["count"] == 3
        poll_until(lambda: len(read_all(kafka, unique)) >= 23, timeout=180, what="the replayed payments")
        late = [r.json() for r in read_all(kafka, unique) if r.json()["event_id"] in {f"pay-{200 + n}" for n in range(3)}]
        assert sorted((v["event_id"], v["revision"], v.get("currency")) for v in late) == [
            (f"pay-{200 + n}", 2, None) for n in range(3)]

        # A backfill of 1.0.0 while 1.1.0 runs live: 1.0.0's code (revision 1, currency required).
        old = run_dag("reprocess", catalog_file, app="acme-dedup", start="earliest", end="now", target="versioned",
                      version="v3", program_version="1.0.0", dry_run=False)
        assert old.state == "success", old.task_states
        old_output = [r.json() for r in read_all(kafka, f"{unique}.v3")]
        assert {v["revision"] for v in old_output} == {1}
        assert sorted(v["event_id"] for v in old_output) == sorted(f"pay-{n}" for n in range(20))
        assert len(read_all(kafka, f"{app.dead_letter_topic}.v3")) == 6  # the 3 originals and their 3 replays
        assert runtime.driver().code.digest == v11.digest  # live stayed on 1.1.0
    finally:
        if runtime.is_running():
            run_dag("stop_apps", catalog_file, apps=["acme-dedup"], deadline_s=30)


# --- the router: a bad code change is undone by the rollback ------------------------------------


def routed_event(seq: int, user: str) -> tuple[str, str]:
    return user, json.dumps({"seq": seq, "user_id": user, "op_type": "SEND_MESSAGE", "event_time": "2026-11-24T03:00:00.000Z"})


def test_a_rollback_runs_the_previous_artifact_again(run_dag, app_env, app_catalog, broker, store, tmp_path, capfd):
    catalog_file, runtime = app_env

    # The shipped router runs from its artifact by default: 1.0.0 is the run's build of this checkout.
    v1, new = build("oplog-router", "1.0.0", "spark_apps.oplog_router", store=store)
    assert not new, "the run's store holds the router's 1.0.0 already, with these exact bytes"
    build("oplog-router", "2.0.0", "spark_apps.oplog_router",
          source=router_source(tmp_path, "2.0.0", refuse_odd_seqs=True), store=store)
    spec = load_catalog(catalog_file).app("oplog-router")
    assert spec.artifact == "oplog-router" and spec.code == "artifact"
    messages, kafka = spec.outputs["messages"], broker.client_config

    assert run_dag("deploy_apps", catalog_file, apps=["oplog-router"]).state == "success"
    assert runtime.driver().code.digest == v1.digest
    produce(kafka, spec.inputs["operations"], [routed_event(seq, "before") for seq in range(1, 11)])
    poll_until(lambda: len(read_all(kafka, messages)) >= 10, timeout=120, what="v1's output")

    # 2.0.0 under a steady trickle: it marks what it routes and refuses half, so the gate fails.
    from streamops.loadgen import LoadSpec, background_load

    with background_load(spec, LoadSpec(count=1_000_000, keys=10, rate=40, seed=5, malformed=0.0), kafka):
        rolled = run_dag("roll_restart_apps", catalog_file, apps=["oplog-router"], version="2.0.0", gate_deadline_s=120)
    assert rolled.state == "failed"
    out = capfd.readouterr().out
    assert re.search(r"version 2\.0\.0 failed its health gate \(dead-letter rate \d+\.\d% over \d+ records", out), out[-3000:]
    assert "rolled back to version 1.0.0" in out
    v2_letters = [r.json() for r in read_all(kafka, spec.dead_letter_topic) if r.json()["app_version"] == "2.0.0"]
    v2_routed = [r.json() for topic in spec.outputs.values() for r in read_all(kafka, topic) if r.json().get("code") == "2.0.0"]
    assert v2_letters and v2_routed, "2.0.0 ran: its marked records and its dead letters are in the topics"

    # The rollback runs 1.0.0's code again: what arrives now is routed unmarked, none refused.
    assert runtime.driver().version == "1.0.0" and runtime.driver().code.digest == v1.digest
    produce(kafka, spec.inputs["operations"], [routed_event(seq, "after") for seq in range(1, 21)])

    def after_rollback() -> list[dict]:
        return [r.json() for r in read_all(kafka, messages) if r.json()["user_id"] == "after"]

    poll_until(lambda: len(after_rollback()) >= 20, timeout=180, what="the records sent after the rollback")
    assert sorted(v["seq"] for v in after_rollback()) == list(range(1, 21))
    assert all("code" not in v for v in after_rollback())
    assert not [r for r in read_all(kafka, spec.dead_letter_topic) if '"after"' in r.json().get("original_value_preview", "")]
    assert run_dag("stop_apps", catalog_file, apps=["oplog-router"], deadline_s=30).state == "success"
