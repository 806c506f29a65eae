#!/usr/bin/env bash
# Compile the suite's JVM side (src/main/java: the input contract, the presence notifier) into one jar, against a folder of jars.
#   build/maven/streamops-contract/build-jar.sh CLASSPATH_DIR OUT_JAR
# bin/setup passes pyspark's own jars/ folder: the very jars it runs with, so no Maven download and
# no second copy of Spark. (The Docker images build the same source with this folder's pom.xml.)
set -euo pipefail
classpath_dir=$1 out=$2
src=$(cd "$(dirname "$0")" && pwd)/src/main/java
classes=$(mktemp -d)
trap 'rm -rf "$classes"' EXIT
find "$src" -name '*.java' -print0 | xargs -0 javac --release 17 -Xlint:all,-path -Werror -d "$classes" -cp "$classpath_dir/*"
mkdir -p "$(dirname "$out")"
jar --create --file "$out" -C "$classes" .
