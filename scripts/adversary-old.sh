#!/usr/bin/env bash
# Run today's adversary (soak/adversary) against the library as it was before a fix, to show that it finds
# the bug that fix removed (docs/adversary.md, "Shown to find").
#
#   scripts/adversary-old.sh etcd-late-read  --backend etcd  --seed 1 --seeds 20 --seconds 12
#   scripts/adversary-old.sh mysql-kill      --backend mysql --seed 1 --seeds 20 --seconds 12
#   scripts/adversary-old.sh redis-split     --backend redis-sentinel --seed 1 --seeds 20 --seconds 12
#   scripts/adversary-old.sh mysql-kill pytest tests/test_adversary.py -k kept_session
#   scripts/adversary-old.sh stopped-shim    --backend etcd  --stops --seed 1 --seeds 20 --seconds 12
#
# The first argument names the old code:
#   etcd-late-read  12e8962^: a waiter's late read of the leader replaced a newer view, and a handover without
#                   a read trusted a read from before its key was put again (two etcd leaders)
#   mysql-kill      79d808b^: a lock session kept across a MariaDB restart KILLed, by its old connection id,
#                   a session of the new server (the leader's)
#   redis-split     e8940ad^: a Redis master cut off from its sentinels kept confirming the old leader's renews
#                   while the sentinels' new master elected another (two Redis leaders)
#   stopped-shim    f73605d^: a CMD that stopped its shim (kill -STOP $PPID) kept its workers running after the
#                   supervisor let the lock go (the next leader's CMD ran beside them)
# The rest goes to `python -m soak.adversary`, or, after `pytest`, to pytest.
#
# The old commit is checked out once as a detached worktree under $ADVERSARY_OLD (default /tmp/aioelect-old),
# with soak/adversary/old/seam-<commit>.patch applied: the interceptor seam the adversary plugs into (and
# _config.confirmation_gap where missing), nothing else. Only that tree's aioelect package is imported;
# soak/, tests/ and the servers' harness are this tree's.
set -euo pipefail

here="$(cd "$(dirname "$0")/.." && pwd)"
python="${PYTHON:-$here/.venv/bin/python}"
[ -x "$python" ] || { echo "no $python: run make venv first, or set PYTHON" >&2; exit 2; }
root="${ADVERSARY_OLD:-/tmp/aioelect-old}"

case "${1:-}" in
  etcd-late-read) commit=12e8962 ;;
  mysql-kill) commit=79d808b ;;
  redis-split) commit=e8940ad ;;
  stopped-shim) commit=f73605d ;;
  *) sed -n '2,25p' "$0" >&2; exit 2 ;;
esac
name="$1"
shift

tree="$root/$name/tree"
if [ ! -f "$tree/.seam-applied" ]; then
  rm -rf "$root/$name"
  git -C "$here" worktree prune
  git -C "$here" worktree add --force --detach "$tree" "$commit^" >/dev/null
  # No patch: the old commit has the seam already.
  if [ -f "$here/soak/adversary/old/seam-$commit.patch" ]; then
    git -C "$tree" apply "$here/soak/adversary/old/seam-$commit.patch"
  fi
  touch "$tree/.seam-applied"
  mkdir -p "$root/$name/path"
  ln -sfn "$tree/aioelect" "$root/$name/path/aioelect"
fi

# Run from a directory without an aioelect package, so that only the old one is on the path.
mkdir -p "$root/run"
cd "$root/run"
export PYTHONSAFEPATH=1 PYTHONPATH="$root/$name/path:$here"
"$python" -c 'import aioelect, sys; print("aioelect from", aioelect.__file__, file=sys.stderr)'
if [ "${1:-}" = pytest ]; then
  shift
  args=()
  for arg in "$@"; do
    if [ -e "$here/${arg%%::*}" ]; then args+=("$here/$arg"); else args+=("$arg"); fi
  done
  exec "$python" -m pytest -p tests.harness.plugin --rootdir "$here" "${args[@]}"
fi
exec "$python" -m soak.adversary "$@"
