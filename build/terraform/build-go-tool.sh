#!/usr/bin/env bash
# build-go-tool.sh MODULE VERSION PACKAGE OUTPUT
# Build a Go program from its module as published on the Go module proxy, inside its own module
# (so its go.mod replace directives apply: `go install pkg@version` refuses those).
set -euo pipefail
module=$1 version=$2 package=$3 output=$4
dir=$(go mod download -json "$module@$version" | python3 -c 'import json, sys; print(json.load(sys.stdin)["Dir"])')
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cp -r "$dir/." "$work/"
chmod -R u+w "$work"
mkdir -p "$(dirname "$output")"
(cd "$work" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$output" "$package")
