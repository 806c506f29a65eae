"""Where the project's files live on this machine."""

from __future__ import annotations

from pathlib import Path

from streamops import settings

# plugins/streamops/paths.py -> the checkout root. Images may relocate it with STREAMOPS_HOME.
PROJECT_ROOT = Path(settings.HOME.get() or Path(__file__).resolve().parents[2])

CACHE_DIR = PROJECT_ROOT / ".cache"
JARS_DIR = CACHE_DIR / "jars"
KAFKA_BROKER_JARS = JARS_DIR / "kafka-broker"
SPARK_KAFKA_JARS = JARS_DIR / "spark-kafka"
# The input contract's JVM side (build/maven/streamops-contract, compiled by bin/setup).
CONTRACT_JAR = JARS_DIR / "streamops-contract" / "streamops-contract.jar"

# Runtime state of the local stack (pid files, logs, data), ignored by git.
RUN_DIR = Path(settings.RUN_DIR.get() or PROJECT_ROOT / ".run")

