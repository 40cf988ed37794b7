#!/usr/bin/env bash
# Installs pgpool-II (Debian's pgpool2 package) for tests/stacks/pgpool_test.ts, when it is missing.
# Safe to run twice. Exits 0 with a note when it cannot install (not root, no apt-get): the pgpool
# tests then skip with a message that says so. Waits for the dpkg lock (other install scripts may
# run apt-get at the same time).
set -u

found() {
  command -v pgpool >/dev/null 2>&1 || [ -x /usr/sbin/pgpool ]
}

if found; then
  echo "pgpool2: $( (command -v pgpool || echo /usr/sbin/pgpool) | head -n 1) is installed"
  exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "pgpool2: not installed, and cannot install it here (needs root and apt-get)" >&2
  exit 0
fi
export DEBIAN_FRONTEND=noninteractive
apt=(apt-get -o DPkg::Lock::Timeout=600)
# The package's own service is not wanted: the tests start their own pgpool.
policy=/usr/sbin/policy-rc.d
made_policy=0
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod +x "$policy" && made_policy=1
fi
"${apt[@]}" update -qq >/dev/null 2>&1 || echo "pgpool2: apt-get update failed" >&2
"${apt[@]}" install -y -qq --no-install-recommends pgpool2 >/dev/null 2>&1 ||
  echo "pgpool2: apt-get install pgpool2 failed" >&2
[ "$made_policy" = 1 ] && rm -f "$policy"
if found; then
  echo "pgpool2: installed $(/usr/sbin/pgpool --version 2>&1 | head -n 1)"
else
  echo "pgpool2: still not installed; the pgpool tests will be skipped" >&2
fi
exit 0
