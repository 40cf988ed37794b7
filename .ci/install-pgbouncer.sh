#!/usr/bin/env bash
# Installs PgBouncer (Debian's package) for tests/pooler_test.ts, when it is missing.
# Safe to run twice. Exits 0 with a note when it cannot install (not root, no apt-get):
# the pooler tests then skip with a message that says so.
set -u

found() {
  command -v pgbouncer >/dev/null 2>&1 || [ -x /usr/sbin/pgbouncer ]
}

if found; then
  echo "pgbouncer: $( (command -v pgbouncer || echo /usr/sbin/pgbouncer) | head -n 1) is installed"
  exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "pgbouncer: not installed, and cannot install it here (needs root and apt-get)" >&2
  exit 0
fi
export DEBIAN_FRONTEND=noninteractive
# The package's own service is not wanted: the tests start their own PgBouncer.
policy=/usr/sbin/policy-rc.d
made_policy=0
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod +x "$policy" && made_policy=1
fi
apt-get update -qq >/dev/null 2>&1 || echo "pgbouncer: apt-get update failed" >&2
apt-get install -y -qq --no-install-recommends pgbouncer >/dev/null 2>&1 ||
  echo "pgbouncer: apt-get install pgbouncer failed" >&2
[ "$made_policy" = 1 ] && rm -f "$policy"
if found; then
  echo "pgbouncer: installed $(/usr/sbin/pgbouncer --version 2>/dev/null | head -n 1)"
else
  echo "pgbouncer: still not installed; the pooler tests will be skipped" >&2
fi
exit 0
