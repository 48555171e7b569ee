#!/usr/bin/env bash
# Makes sure the programs the benchmark harness runs besides Go are installed: redis-server,
# and nginx (the alternative it is compared with; Debian's nginx-light is enough). Installs
# them with apt-get when it can (root on Debian or Ubuntu); otherwise says how, and fails.
set -euo pipefail

missing=()
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ] || missing+=(nginx)
[ ${#missing[@]} -eq 0 ] && exit 0

if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" -eq 0 ]; then
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq
	pkgs=()
	for m in "${missing[@]}"; do
		if [ "$m" = nginx ]; then
			# nginx-light has the proxy and cache modules and little else; releases without
			# it have nginx.
			if apt-cache show nginx-light >/dev/null 2>&1; then pkgs+=(nginx-light); else pkgs+=(nginx); fi
		else
			pkgs+=("$m")
		fi
	done
	echo "ensure-deps: installing ${pkgs[*]} with apt-get" >&2
	apt-get install -y -qq "${pkgs[@]}" >/dev/null
	for cmd in "${missing[@]}"; do
		command -v "$cmd" >/dev/null 2>&1 || [ -x "/usr/sbin/$cmd" ] || { echo "ensure-deps: $cmd still missing after apt-get" >&2; exit 1; }
	done
	exit 0
fi

{
	echo "ensure-deps: missing ${missing[*]}; the benchmarks need them on PATH. Install them, then run make bench again:"
	echo "  Debian/Ubuntu:  sudo apt-get install -y redis-server nginx-light"
	echo "  Fedora:         sudo dnf install -y redis nginx"
	echo "  macOS:          brew install redis nginx"
} >&2
exit 1
