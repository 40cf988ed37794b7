#!/usr/bin/env bash
# Installs Patroni, etcd and HAProxy (Debian's packages) for tests/stacks/patroni_test.ts, when any is
# missing. Safe to run twice. Exits 0 with a note when it cannot install (not root, no apt-get): the
# Patroni tests then skip with a message that says so.
set -u

# Debian puts etcd and haproxy in /usr/bin and /usr/sbin; patroni and patronictl in /usr/bin.
found() {
  for bin in patroni patronictl etcd haproxy; do
    command -v "$bin" >/dev/null 2>&1 || [ -x "/usr/sbin/$bin" ] || [ -x "/usr/bin/$bin" ] || return 1
  done
}

if found; then
  echo "patroni: patroni, etcd and haproxy are installed"
  exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "patroni: not installed, and cannot install it here (needs root and apt-get)" >&2
  exit 0
fi
export DEBIAN_FRONTEND=noninteractive
# The packages' own services are not wanted: the tests start their own etcd, Patroni and HAProxy.
policy=/usr/sbin/policy-rc.d
made_policy=0
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod +x "$policy" && made_policy=1
fi
# Another install script may hold the dpkg lock (.ci/run runs them one after another, but a machine
# may run apt elsewhere): wait for it instead of failing.
apt=(apt-get -o DPkg::Lock::Timeout=600)
"${apt[@]}" update -qq >/dev/null 2>&1 || echo "patroni: apt-get update failed" >&2
"${apt[@]}" install -y -qq --no-install-recommends patroni etcd-server haproxy >/dev/null 2>&1 ||
  echo "patroni: apt-get install patroni etcd-server haproxy failed" >&2
[ "$made_policy" = 1 ] && rm -f "$policy"
if found; then
  echo "patroni: installed $(patroni --version 2>/dev/null | head -n 1), $(etcd --version 2>/dev/null |
    head -n 1), $(haproxy -v 2>/dev/null | head -n 1)"
else
  echo "patroni: still not installed; the Patroni tests will be skipped" >&2
fi
exit 0
