#!/usr/bin/env bash
# Makes sure the programs the test suite runs besides Go are installed: redis-server for the
# tests that use a real Redis. Installs them with apt-get when it can (root on Debian or
# Ubuntu); otherwise says how, and fails.
set -euo pipefail

missing=()
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
[ ${#missing[@]} -eq 0 ] && exit 0

if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" -eq 0 ]; then
	echo "ensure-deps: installing ${missing[*]} with apt-get" >&2
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq
	apt-get install -y -qq "${missing[@]}" >/dev/null
	for cmd in "${missing[@]}"; do
		command -v "$cmd" >/dev/null 2>&1 || { echo "ensure-deps: $cmd still missing after apt-get" >&2; exit 1; }
	done
	exit 0
fi

{
	echo "ensure-deps: missing ${missing[*]}; the tests need it on PATH. Install it, then run make test again:"
	echo "  Debian/Ubuntu:  sudo apt-get install -y redis-server"
	echo "  Fedora:         sudo dnf install -y redis        (or valkey)"
	echo "  macOS:          brew install redis"
} >&2
exit 1
