#!/usr/bin/env bash
# Makes sure the programs the test suite runs besides Go are installed: redis-server for the
# tests that use a real Redis; for the end-to-end suite (e2e/) also prometheus and promtool
# (a real Prometheus scrapes the proxies; promtool checks deploy/prometheus/prometheus.yml
# and the Helm chart's alert rules in deploy/helm/charttest), node with npm (the official
# Node SDK is installed with npm during the run), curl (the README's examples, which e2e
# runs as written, use it) and python3 (which compiles the README's Python snippet). Installs what is missing with apt-get when it can (root on
# Debian or Ubuntu); otherwise says how, and fails. First it builds, with Go, the Jaeger the
# suite sends its traces to (scripts/jaeger.sh: once per machine and Jaeger version).
set -euo pipefail

bash "$(dirname "${BASH_SOURCE[0]}")/jaeger.sh" >/dev/null

# command → Debian package
declare -A pkg_of=(
	[redis-server]=redis-server
	[prometheus]=prometheus
	[promtool]=prometheus
	[node]=nodejs
	[npm]=npm
	[curl]=curl
	[python3]=python3
)

missing=()
for cmd in redis-server prometheus promtool node npm curl python3; do
	command -v "$cmd" >/dev/null 2>&1 && continue
	p=${pkg_of[$cmd]}
	[[ " ${missing[*]-} " == *" $p "* ]] || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" -eq 0 ]; then
	echo "ensure-deps: installing ${missing[*]} with apt-get" >&2
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq
	apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
	for cmd in redis-server prometheus promtool node npm curl python3; do
		command -v "$cmd" >/dev/null 2>&1 || { echo "ensure-deps: $cmd still missing after apt-get" >&2; exit 1; }
	done
	exit 0
fi

{
	echo "ensure-deps: missing packages ${missing[*]}; the tests need redis-server, prometheus, promtool, node, npm, curl and python3 on PATH."
	echo "Install them, then run make test again:"
	echo "  Debian/Ubuntu:  sudo apt-get install -y redis-server prometheus nodejs npm curl python3"
	echo "  Fedora:         sudo dnf install -y redis golang-github-prometheus nodejs npm curl python3"
	echo "  macOS:          brew install redis prometheus node"
} >&2
exit 1
