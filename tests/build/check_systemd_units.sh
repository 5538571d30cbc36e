#!/bin/bash
# Installs the build (cmake --install, DESTDIR) into a temporary root and checks the systemd
# units there with `systemd-analyze verify --root`: syntax, unknown keys, and that ExecStart=
# names an installed executable. Any line verify prints fails the check (it reports unknown
# keys as warnings with exit status 0). Exit 77 (ctest SKIP_RETURN_CODE) without
# systemd-analyze. verify does not resolve User=/Group= (the sysusers.d user need not exist).
# Also: each unit loads its node's CURVE key with LoadCredential=bitpush.key:/etc/bitpush/keys/...
# (docs/deploy.md, "Keys"), and the installed cluster.yaml asks for CURVE with a public_keys path
# (and parses, with this build's `bitpush check-config`, when it is built); the server and
# worker units allow what UCX needs (LimitMEMLOCK=infinity, /dev/infiniband) and the server
# keeps the rest of its hardening.
#
#   check_systemd_units.sh BUILD_DIR INSTALL_PREFIX
set -u
build=$1
prefix=$2

if ! command -v systemd-analyze >/dev/null 2>&1; then
  echo "SKIP: systemd-analyze not found (install systemd to check the units)"
  exit 77
fi
host_units=""
for d in /usr/lib/systemd/system /lib/systemd/system; do
  if [ -e "$d/sysinit.target" ]; then host_units=$d; break; fi
done
if [ -z "$host_units" ]; then
  echo "SKIP: no systemd unit directory with sysinit.target on this machine"
  exit 77
fi

root=$(mktemp -d "${TMPDIR:-/tmp}/bitpush-units.XXXXXX")
trap 'rm -rf "$root"' EXIT

if ! DESTDIR="$root" cmake --install "$build" >"$root.install.log" 2>&1; then
  cat "$root.install.log"; rm -f "$root.install.log"
  echo "FAIL: cmake --install $build"
  exit 1
fi
rm -f "$root.install.log"

units="$root$prefix/lib/systemd/system"
fail=0
for f in bitpush-scheduler.service bitpush-server@.service bitpush-worker.service; do
  [ -f "$units/$f" ] || { echo "FAIL: $units/$f not installed"; fail=1; }
done
for f in lib/sysusers.d/bitpush.conf share/bitpush/cluster.yaml \
         share/bitpush/examples/local.yaml share/bitpush/examples/multi-host.yaml \
         share/bitpush/grafana/bitpush.json; do
  [ -f "$root$prefix/$f" ] || { echo "FAIL: $prefix/$f not installed"; fail=1; }
done
[ $fail = 0 ] || exit 1
for u in "$units"/*.service; do
  grep -q "^ExecStart=$prefix/bin/" "$u" || { echo "FAIL: $u: ExecStart= not under $prefix/bin"; fail=1; }
  if grep -q '@[A-Z_]*@' "$u"; then echo "FAIL: $u: unsubstituted @VAR@"; fail=1; fi
done
for pair in bitpush-scheduler.service:scheduler.key 'bitpush-server@.service:server-%i.key' \
            bitpush-worker.service:worker.key; do
  u=${pair%%:*}; key=${pair#*:}
  n=$(grep -c '^LoadCredential=' "$units/$u")
  if [ "$n" != 1 ] || ! grep -qx "LoadCredential=bitpush.key:/etc/bitpush/keys/$key" "$units/$u"; then
    echo "FAIL: $u: want exactly LoadCredential=bitpush.key:/etc/bitpush/keys/$key"; fail=1
  fi
done
# The ucx data plane (docs/deploy.md, "RDMA nodes"): the servers and the worker may register
# (pin) memory without bound, and reach /dev/infiniband. The server keeps its devices closed but
# for the RDMA ones (PrivateDevices=yes would hide /dev/infiniband); the worker sets no device
# policy at all (an allow list would also hide the GPUs).
for u in 'bitpush-server@.service' bitpush-worker.service; do
  n=$(grep -c '^LimitMEMLOCK=' "$units/$u")
  if [ "$n" != 1 ] || ! grep -qx 'LimitMEMLOCK=infinity' "$units/$u"; then
    echo "FAIL: $u: want exactly LimitMEMLOCK=infinity"; fail=1
  fi
  if grep -q '^PrivateDevices=yes' "$units/$u"; then
    echo "FAIL: $u: PrivateDevices=yes hides /dev/infiniband"; fail=1
  fi
done
server="$units/bitpush-server@.service"
for line in 'DevicePolicy=closed' 'DeviceAllow=char-infiniband_verbs rw' \
            'DeviceAllow=/dev/infiniband/rdma_cm rw' 'SystemCallFilter=~@raw-io'; do
  grep -qxF "$line" "$server" || { echo "FAIL: $server: want $line"; fail=1; }
done
if grep -v '^DeviceAllow=char-infiniband_verbs rw$' "$server" |
     grep -v '^DeviceAllow=/dev/infiniband/rdma_cm rw$' | grep -q '^DeviceAllow='; then
  echo "FAIL: $server: a DeviceAllow= beyond the RDMA devices"; fail=1
fi
if grep -Eq '^(DevicePolicy|DeviceAllow|ProtectClock)=' "$units/bitpush-worker.service"; then
  echo "FAIL: bitpush-worker.service: a device allow list would hide /dev/infiniband and the GPUs"
  fail=1
fi
# The rest of the hardening stays (the server's list in docs/deploy.md, "Hardening").
for line in NoNewPrivileges=yes ProtectSystem=strict ProtectHome=yes PrivateTmp=yes \
            ProtectKernelTunables=yes ProtectKernelModules=yes ProtectKernelLogs=yes \
            ProtectControlGroups=yes ProtectClock=yes CapabilityBoundingSet=; do
  grep -qxF "$line" "$server" || { echo "FAIL: $server: want $line"; fail=1; }
done
yaml="$root$prefix/share/bitpush/cluster.yaml"
if ! grep -qx '  mode: curve' "$yaml" ||
   ! grep -qx '  public_keys: /etc/bitpush/keys/public_keys' "$yaml"; then
  echo "FAIL: $yaml: want security.mode curve and public_keys /etc/bitpush/keys/public_keys"; fail=1
fi
if [ -x "$build/bin/bitpush" ] && [ -d "$build/python/bitpush" ]; then
  if out=$("$build/bin/bitpush" check-config --no-resolve "$yaml" 2>&1); then
    echo "ok: $prefix/share/bitpush/cluster.yaml parses (bitpush check-config)"
  else
    echo "FAIL: bitpush check-config --no-resolve $yaml:"; echo "$out"; fail=1
  fi
fi

# The root needs the stock units (sysinit.target, ...) for default dependencies, and ours
# where systemd looks for them: /usr/lib/systemd/system inside the root.
mkdir -p "$root/usr/lib/systemd/system"
cp -a "$host_units/." "$root/usr/lib/systemd/system/"
cp "$units"/*.service "$root/usr/lib/systemd/system/"
for u in bitpush-scheduler.service bitpush-server@0.service bitpush-server@1.service \
         bitpush-worker.service; do
  out=$(SYSTEMD_LOG_COLOR=0 systemd-analyze verify --man=no --root="$root" \
          "/usr/lib/systemd/system/$u" 2>&1)
  rc=$?
  if [ $rc != 0 ] || [ -n "$out" ]; then
    echo "FAIL: systemd-analyze verify $u (exit $rc):"
    echo "$out"
    fail=1
  else
    echo "ok: $u"
  fi
done
[ $fail = 0 ] && echo "PASS: systemd units verified"
exit $fail
