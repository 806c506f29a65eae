"""The drivers' class archive (streamops.class_archive): the first driver records it at its exit,
one at a time; a later launch names the finished file and maps it; real JVMs write and map it."""

from __future__ import annotations

import subprocess
import sys

import pytest

from streamops import class_archive


@pytest.fixture
def archives(tmp_path, monkeypatch):
    monkeypatch.setattr(class_archive, "archive_dir", lambda: tmp_path / "class-archives")
    monkeypatch.delenv("STREAMOPS_CLASS_ARCHIVE", raising=False)
    return tmp_path / "class-archives"


def _option(options: str, name: str) -> str:
    return next(part.split("=", 1)[1] for part in options.split() if part.startswith(f"{name}="))


def test_the_first_driver_records_the_archive_and_later_ones_map_it_once_its_jvm_is_gone(archives):
    first = class_archive.driver_jvm_options("-Xmx1g")
    assert first.startswith("-Xmx1g -XX:ArchiveClassesAtExit=")
    partial = _option(first, "-XX:ArchiveClassesAtExit")
    assert partial.startswith(str(class_archive.archive_path("-Xmx1g")) + class_archive.PARTIAL)

    # While a JVM that writes it at its exit runs, other drivers neither record nor map one.
    recorder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)",
                                 f"-XX:ArchiveClassesAtExit={partial}"])
    try:
        assert class_archive.driver_jvm_options("-Xmx1g") == "-Xmx1g"  # its claim, still empty
        with open(partial, "wb") as written:
            written.write(b"classes")
        assert class_archive.driver_jvm_options("-Xmx1g") == "-Xmx1g"
    finally:
        recorder.kill()
        recorder.wait()

    mapped = class_archive.driver_jvm_options("-Xmx1g")
    assert _option(mapped, "-XX:SharedArchiveFile") == str(class_archive.archive_path("-Xmx1g"))
    assert class_archive.archive_path("-Xmx1g").read_bytes() == b"classes"
    assert not list(archives.glob(f"*{class_archive.PARTIAL}*"))
    # Other JVM options: another archive.
    assert "-XX:ArchiveClassesAtExit=" in class_archive.driver_jvm_options("-Xmx2g")


def test_options_naming_an_archive_and_the_off_switch_are_left_alone(archives, monkeypatch):
    assert class_archive.driver_jvm_options("-XX:SharedArchiveFile=/x.jsa") == "-XX:SharedArchiveFile=/x.jsa"
    monkeypatch.setenv("STREAMOPS_CLASS_ARCHIVE", "off")
    assert class_archive.driver_jvm_options("-Xmx1g") == "-Xmx1g"
    assert not archives.exists() or not list(archives.iterdir())


def test_an_empty_partial_left_by_a_killed_jvm_is_dropped_and_recording_starts_again(archives):
    first = class_archive.driver_jvm_options("")
    partial = _option(first, "-XX:ArchiveClassesAtExit")
    # Its JVM was killed before it wrote anything: the claim is left empty.
    again = class_archive.driver_jvm_options("")
    assert "-XX:ArchiveClassesAtExit=" in again and _option(again, "-XX:ArchiveClassesAtExit") != partial
    assert sorted(p.name for p in archives.iterdir()) == [_option(again, "-XX:ArchiveClassesAtExit").rsplit("/", 1)[1]]


def test_a_real_jvm_writes_an_archive_that_the_next_jvm_maps(archives):
    recording = class_archive.driver_jvm_options("")
    subprocess.run(["java", *recording.split(), "-version"], check=True, capture_output=True)
    mapping = class_archive.driver_jvm_options("")
    assert "-XX:SharedArchiveFile=" in mapping
    # -Xshare:on refuses to start unless the archive maps.
    done = subprocess.run(["java", *mapping.split(), "-Xshare:on", "-version"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
