#!/usr/bin/env bash
# Make sure the server binaries the tests start are installed (Debian packages).
# Idempotent: does nothing when they are already there.
set -euo pipefail

need=()
command -v etcd >/dev/null 2>&1 || need+=(etcd-server)
command -v etcdctl >/dev/null 2>&1 || need+=(etcd-client)
command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
command -v redis-sentinel >/dev/null 2>&1 || need+=(redis-sentinel)
{ command -v mariadbd >/dev/null 2>&1 || [ -x /usr/sbin/mariadbd ]; } || need+=(mariadb-server)
command -v mariadb-install-db >/dev/null 2>&1 || need+=(mariadb-server)
ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1 || need+=(postgresql)
{ command -v pgbouncer >/dev/null 2>&1 || [ -x /usr/sbin/pgbouncer ]; } || need+=(pgbouncer)
# tests/test_faults_keepalive.py puts a candidate in a network namespace (ip netns, veth): iproute2, and root.
{ command -v ip >/dev/null 2>&1 || [ -x /usr/sbin/ip ]; } || need+=(iproute2)

if [ ${#need[@]} -eq 0 ]; then
  exit 0
fi

sudo=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then sudo="sudo"; else
    echo "ensure-servers: need root (or sudo) to install: ${need[*]}" >&2; exit 1
  fi
fi
echo "ensure-servers: installing ${need[*]}"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
# Packages may try to start system services; the tests start their own servers.
$sudo apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
