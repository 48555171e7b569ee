#!/usr/bin/env bash
# Prints the path of the Jaeger binary the end-to-end suite sends its traces to, building it
# first when it is not there. The version is the one e2e/jaeger/go.mod requires: a module of
# its own, so that Jaeger's dependencies stay out of the proxy's go.mod (`go install` cannot
# build Jaeger: its go.mod has replace directives). The binary is kept beside the Go build
# cache, one per version, so it is built once per machine and again when the version
# changes. The first build takes minutes (Jaeger is about 2300 packages); later runs print
# the path at once. Progress goes to stderr, the path alone to stdout.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
mod="$root/e2e/jaeger"
version=$(awk '$1 == "github.com/jaegertracing/jaeger" { print $2; exit }' "$mod/go.mod")
if [ -z "$version" ]; then
	echo "jaeger.sh: no github.com/jaegertracing/jaeger requirement in $mod/go.mod" >&2
	exit 1
fi
dir="$(dirname "$(go env GOCACHE)")/llm-dedupe-proxy-jaeger/$version"
bin="$dir/jaeger"

if [ ! -x "$bin" ]; then
	echo "jaeger.sh: building Jaeger $version into $dir (the first time takes several minutes)" >&2
	mkdir -p "$dir"
	tmp=$(mktemp "$dir/jaeger.XXXXXX")
	trap 'rm -f "$tmp"' EXIT
	start=$SECONDS
	# Without optimisations or inlining (-N -l): less to compile, for a binary that only ever
	# stores a test's few hundred spans.
	(cd "$mod" && GOWORK=off CGO_ENABLED=0 go build -trimpath -gcflags='all=-N -l' -ldflags='-s -w' -o "$tmp" \
		github.com/jaegertracing/jaeger/cmd/jaeger)
	mv -f "$tmp" "$bin" # whole or not at all, also when two runs build at once
	echo "jaeger.sh: built in $((SECONDS - start))s" >&2
fi
echo "$bin"
