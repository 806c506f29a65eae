"""The forms of the names the catalog, the artifact store and the launchers share (a leaf: it imports
no other module of the project, so each of them can import it without a cycle), and the words an
error gives for each form."""

from __future__ import annotations

from streamops.kafka_offsets import DURATION_PATTERN

# A semantic version (semver.org): X.Y.Z, a pre-release and build metadata of dot-separated,
# non-empty identifiers. Labels reach argv and folder names, so nothing else is allowed.
_IDENTIFIERS = r"[0-9A-Za-z-]+(\.[0-9A-Za-z-]+)*"
VERSION_PATTERN = rf"^[0-9]+\.[0-9]+\.[0-9]+(-{_IDENTIFIERS})?(\+{_IDENTIFIERS})?$"
# An app's name: a path part, a Spark application name and (with prefixes) a Kafka principal.
APP_NAME_PATTERN = r"^[a-z][a-z0-9-]{1,62}$"
# A program reference: `package.module` (its `program`) or `package.module:attribute`.
REFERENCE_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*(:[A-Za-z_][A-Za-z0-9_]*)?$"

PATTERN_HINTS = {
    DURATION_PATTERN: "a Spark interval such as '10 seconds' or '5 minutes'",
    APP_NAME_PATTERN: "lowercase letters, digits and '-', starting with a letter",
    VERSION_PATTERN: "a semantic version such as '1.2.0'",
    REFERENCE_PATTERN: "an importable reference such as 'my_pipelines.dedup' or 'my_pipelines.dedup:program'",
}
