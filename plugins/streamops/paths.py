"""Where the project's files live on this machine."""

from __future__ import annotations

import os
from pathlib import Path

# plugins/streamops/paths.py -> the checkout root. Images may relocate it with STREAMOPS_HOME.
PROJECT_ROOT = Path(os.environ.get("STREAMOPS_HOME") or Path(__file__).resolve().parents[2])

CACHE_DIR = PROJECT_ROOT / ".cache"
JARS_DIR = CACHE_DIR / "jars"
KAFKA_BROKER_JARS = JARS_DIR / "kafka-broker"
SPARK_KAFKA_JARS = JARS_DIR / "spark-kafka"

# Runtime state of the local stack (pid files, logs, data), ignored by git.
RUN_DIR = Path(os.environ.get("STREAMOPS_RUN_DIR") or PROJECT_ROOT / ".run")
