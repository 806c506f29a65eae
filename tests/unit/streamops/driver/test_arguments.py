"""The driver's command line is one typed value: what a launcher builds parses back to the same
value in the driver, and a bad value is refused with the flag's name."""

from __future__ import annotations

import pytest

from streamops.driver.arguments import DriverArgs, parse_args
from streamops.driver.exit_codes import ExitCode
from streamops.entrypoints import driver as entrypoint


def test_every_field_survives_the_trip_through_the_command_line():
    full = DriverArgs(
        app="oplog-router", program="spark_apps.oplog_router", artifact="/store/a.zip", artifact_digest="sha256:ab",
        catalog="/c.yaml", kafka_config="/ck/_runtime/kafka-client.json", checkpoint="/ck", trigger="2 seconds",
        starting_offsets='{"t": {"0": 5}}', ending_offsets={"t": {"0": 9, "1": 12}}, skip_records_of="/live",
        consumer_group=False, version="1.2.0", max_offsets_per_trigger=500, standby="tok", standby_timeout_s=30.0,
    )
    assert parse_args(full.to_argv()) == full
    plain = DriverArgs(app="a", program="p", bootstrap_servers="127.0.0.1:1")
    assert parse_args(plain.to_argv()) == plain


def test_without_a_connection_the_driver_reads_the_environments_plaintext_kafka(monkeypatch):
    monkeypatch.setenv("STREAMOPS_KAFKA_BOOTSTRAP", "127.0.0.9:9092")
    assert parse_args(["--app", "a", "--program", "p"]).bootstrap_servers == "127.0.0.9:9092"


def test_bad_ending_offsets_are_refused_naming_the_flag(capsys):
    with pytest.raises(SystemExit) as refused:
        parse_args(["--app", "a", "--program", "p", "--ending-offsets", '{"t": 5}'])
    assert refused.value.code == ExitCode.USAGE
    assert "argument --ending-offsets: '{\"t\": 5}' is not a JSON of offsets per topic and partition" in capsys.readouterr().err


def test_the_entrypoint_refuses_an_artifact_with_the_drivers_code_for_it(tmp_path, monkeypatch, capsys):
    zip_file = tmp_path / "artifact.zip"
    zip_file.write_bytes(b"not the built bytes")
    monkeypatch.setattr("sys.argv", ["driver.py", "--artifact", str(zip_file), "--artifact-digest", "sha256:00"])
    assert entrypoint.main() == entrypoint.ARTIFACT_REFUSED == ExitCode.ARTIFACT_REFUSED
    assert "it is not the code this version was built with" in capsys.readouterr().err
