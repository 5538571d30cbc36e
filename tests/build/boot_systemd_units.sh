#!/bin/bash
# Boots a real systemd (PID 1 of new pid+mount+net+cgroup namespaces) with the installed bitpush
# units and checks that they work: Type=notify readiness, the hardening (ProtectSystem=strict,
# PrivateTmp, PrivateDevices, NoNewPrivileges, RuntimeDirectory=bitpush, User=bitpush from the
# sysusers.d file) not breaking the daemons, CURVE (security.mode: curve: each node's key,
# root:root 0600 on disk, reaches its daemon through LoadCredential=; a peer without CURVE is
# refused), a training process talking to the worker daemon's socket under /run/bitpush, a clean
# end (every unit stops by itself with exit status 0, after READY=1 and STOPPING=1 datagrams),
# `systemctl stop` (SIGTERM ends each daemon by itself), a server that systemd restarts
# rejoining a running daemon-mode training job in place (bit-identical to an uninterrupted run),
# and a job that heals without a person (a server, the scheduler, the worker SIGKILLed in turn:
# every unit restarts, a new trainer is served).
# docs/deploy.md ("Tests") says what it covers.
#
#   boot_systemd_units.sh BUILD_DIR INSTALL_PREFIX
#
# Outside (this host, never modified): `cmake --install` into a temporary DESTDIR, a private copy
# of /etc with /etc/bitpush/{cluster.yaml,worker.env,token}, a target that pulls in
# bitpush-scheduler, bitpush-server@0, @1, bitpush-worker and a checker unit. Then a cgroup2
# child cgroup (removed at the end) is entered and `unshare -C -p -f -m -n` runs this script
# as `--ns` (PID 1 of the namespaces), which mounts the views below, writes the keys as
# docs/deploy.md says (`bitpush keygen --config /etc/bitpush/cluster.yaml --out
# /etc/bitpush/keys` with this build's `bitpush`, root:root 0600, worker-0.key as worker.key) and
# execs systemd with --unit=bitpush-sdboot.target. Inside the namespace:
#   /              read-only (a bind remount: the host's files cannot change)
#   /etc           the private copy (systemd-sysusers creates the user `bitpush` there)
#   PREFIX         the staged install over the host's PREFIX (overlay, else a bind mount)
#   /run /tmp /var/tmp /var/log /var/lib/systemd   fresh tmpfs
#   /dev           a minimal one (null, zero, random, a devpts, a private /dev/shm)
#   /proc/sys      read-only (PID 1 would raise host-wide sysctls)
#   /sys/fs/cgroup cgroup2, rooted at the child cgroup (cgroup namespace)
#   network        only `lo` (127.0.0.1; the host's interfaces are not visible)
# The checker unit (this script as `--check`, After= the four services) records each unit's
# state, the hardening in force on its process and its key in $CREDENTIALS_DIRECTORY, that a
# non-CURVE peer is refused, runs one bitpush-test-trainer as `bitpush`
# against /run/bitpush/worker.sock (a few push_pulls, checked bit for bit), waits for every
# unit to end, starts and `systemctl stop`s them once more, and writes result lines and
# the units' journals to a directory shared with the outside, which prints them. Every wait is
# bounded; a trap kills the whole namespace (cgroup.kill, then SIGKILL to its PID 1) on any exit.
#
# Exit 0 pass, 1 fail, 77 (ctest SKIP_RETURN_CODE) when this machine cannot run it: not root,
# no unshare/nsenter, no systemd, no cgroup2 hierarchy, namespaces refused, PREFIX missing.
# Environment: BITPUSH_SDBOOT_TIMEOUT (s, default 150) bounds the whole boot;
# BITPUSH_SDBOOT_KEEP=1 keeps the temporary directory (its path is printed).
set -u

readonly kTarget=bitpush-sdboot.target
readonly kChecker=bitpush-sdboot-check.service
readonly kUnits="bitpush-scheduler.service bitpush-server@0.service bitpush-server@1.service bitpush-worker.service"
readonly kInside=/run/bitpush-sdboot   # where the shared directory is inside the namespace

skip() { echo "SKIP: $*"; exit 77; }
fail() { echo "FAIL: $*"; exit 1; }

find_systemd() {
  for s in /lib/systemd/systemd /usr/lib/systemd/systemd; do
    if [ -x "$s" ]; then echo "$s"; return 0; fi
  done
  return 1
}

# ---------------------------------------------------------------------------------------------
# --ns SHARED PREFIX BUILD: PID 1 of the new namespaces; sets up the mounts and the keys, then
# becomes systemd.
ns_main() {
  local shared=$1 prefix=$2 build=$3 systemd
  set -e
  systemd=$(find_systemd)
  # Private propagation (unshare does it too): nothing mounted here reaches the host.
  mount --make-rprivate /
  mount -t tmpfs -o mode=0755,nosuid,nodev tmpfs /run
  mkdir -p "$kInside"
  mount --bind "$shared" "$kInside"
  mount --bind "$shared/etc" /etc
  if ! mount -t overlay overlay -o "lowerdir=$shared/stage$prefix:$prefix" "$prefix" 2>/dev/null; then
    echo "ns: overlay on $prefix unavailable, bind-mounting the staged install over it"
    mount --bind "$shared/stage$prefix" "$prefix"
  fi
  # The keys (security.mode: curve), as docs/deploy.md writes them for a systemd deployment:
  # root:root 0600 key files that only systemd (root) reads, handed to each unit by
  # LoadCredential=; the directory and public_keys readable by bitpush (security.public_keys).
  # All nodes run on this one machine, so it keeps every key; the worker unit's is worker.key.
  # Written before /tmp is replaced below: the build tree (and this test's workdir) may live
  # there. Reading the YAML reads its token file, which must be its owner's alone.
  chmod 0600 /etc/bitpush/token
  # `bitpush keygen` where the tree has the Python package; the sanitizer trees have not, and
  # bitpush-test-node writes the same files through the same C++ (common/security/keys.h).
  if [ -x "$build/bin/bitpush" ] && [ -d "$build/python/bitpush" ]; then
    "$build/bin/bitpush" keygen --config /etc/bitpush/cluster.yaml --out /etc/bitpush/keys
  else
    "$build/bin/bitpush-test-node" keygen /etc/bitpush/cluster.yaml /etc/bitpush/keys
  fi
  mv /etc/bitpush/keys/worker-0.key /etc/bitpush/keys/worker.key
  chown -R root:root /etc/bitpush/keys
  chmod 0755 /etc/bitpush/keys
  chmod 0600 /etc/bitpush/keys/*.key
  chmod 0644 /etc/bitpush/keys/public_keys
  mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs /tmp
  # A minimal /dev of its own, as a container manager gives: systemd cannot reach the host's
  # console or /dev/kmsg (its own messages go to the journal), no host device node changes, and
  # /dev/shm (the worker's segments) is private. /dev/console is a null device.
  mount -t tmpfs -o mode=0755,nosuid tmpfs /dev
  mknod -m 0666 /dev/null c 1 3; mknod -m 0666 /dev/zero c 1 5; mknod -m 0666 /dev/full c 1 7
  mknod -m 0666 /dev/random c 1 8; mknod -m 0666 /dev/urandom c 1 9; mknod -m 0666 /dev/tty c 5 0
  mkdir -m 0755 /dev/pts /dev/shm
  mount -t devpts -o newinstance,ptmxmode=0666,mode=0620 devpts /dev/pts
  ln -s pts/ptmx /dev/ptmx
  ln -s /proc/self/fd /dev/fd
  ln -s /proc/self/fd/0 /dev/stdin; ln -s /proc/self/fd/1 /dev/stdout
  ln -s /proc/self/fd/2 /dev/stderr
  mknod -m 0600 /dev/console c 1 3
  mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs /dev/shm
  for d in /var/tmp; do [ -d $d ] && mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs $d; done
  for d in /var/log /var/lib/systemd; do
    [ -d $d ] && mount -t tmpfs -o mode=0755,nosuid,nodev tmpfs $d
  done
  mount --bind /proc/sys /proc/sys
  mount -o remount,bind,ro /proc/sys
  mount -t cgroup2 cgroup2 /sys/fs/cgroup
  mount -o remount,bind,ro /
  if command -v ip >/dev/null 2>&1; then ip link set lo up; fi
  # The user the units run as, as a package install would create it (docs/deploy.md).
  systemd-sysusers "$prefix/lib/sysusers.d/bitpush.conf"
  getent passwd bitpush >/dev/null
  chown bitpush:bitpush /etc/bitpush/token
  chmod 0600 /etc/bitpush/token
  # Shared propagation inside the namespace, as a booted host (systemd makes / rshared when it
  # is not in a container) or a container manager has it: systemd mounts each unit's
  # $CREDENTIALS_DIRECTORY from a helper process's mount namespace, and the mount reaches
  # systemd's own namespace only by propagation (with private mounts the unit finds an empty
  # directory). The peer groups are new and this namespace's own: nothing reaches the host.
  mount --make-rshared /
  set +e
  # container=: systemd skips what a container manager owns (udev, kernel modules, sysctl,
  # the console) — this is a shared kernel, like a container.
  exec env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
       container=bitpush-sdboot "$systemd" --system --unit=$kTarget \
       --log-target=journal --log-level=debug --show-status=no
}

# ---------------------------------------------------------------------------------------------
# A job that heals without a person (docs/deploy.md, "Restarts"): the units start, `victim`'s
# main process is SIGKILLed, and Restart=on-failure with the nodes' own failure handling brings
# back a cluster that serves a new trainer, bounded by 90 s. Without server_rejoin_timeout_s
# (and in daemon mode) a dead node ends the job: the others fail in turn and restart, so every
# unit must have restarted, and `witness`'s journal must name the death (`names`). Uses
# check_main's say/show and $out, $shared.
heal_after_kill() {
  local victim=$1 witness=$2 names=$3 u pid0 t0 deadline pending rc tries=0 took_up
  local -A n0
  # This test starts each unit more often than StartLimitBurst allows in its interval; a job
  # of its own starts with a fresh count, as after an operator's reset-failed.
  systemctl reset-failed $kUnits 2>/dev/null
  if ! timeout 90 systemctl start $kUnits; then
    say "FAIL heal after killing $victim: systemctl start $kUnits failed or timed out"
    return
  fi
  for u in $kUnits; do n0[$u]=$(show "$u" NRestarts); done
  pid0=$(show "$victim" MainPID)
  t0=$SECONDS
  kill -KILL "$pid0"
  deadline=$((SECONDS + 90))
  while :; do
    pending=""
    for u in $kUnits; do
      if [ "$(show "$u" NRestarts)" -le "${n0[$u]}" ] || [ "$(show "$u" ActiveState)" != active ]; then
        pending="$pending $u"
      fi
    done
    [ -z "$pending" ] && break
    if [ $SECONDS -ge $deadline ]; then
      say "FAIL heal after killing $victim: 90 s later not restarted and active:$pending ($(for u in $pending; do echo -n "$u=$(show "$u" ActiveState)/$(show "$u" SubState)/NRestarts=$(show "$u" NRestarts) "; done))"
      return
    fi
    sleep 0.2
  done
  took_up=$((SECONDS - t0))
  # A new trainer is served (the worker may still be registering with the new cluster: the
  # trainer waits for its socket; a refusal while the cluster forms is retried, bounded).
  while :; do
    tries=$((tries + 1))
    timeout -s KILL 60 setpriv --reuid=bitpush --regid=bitpush --init-groups -- \
      "$shared/bin/bitpush-test-trainer" --config /etc/bitpush/cluster.yaml --node 0 \
      --local-rank 0 --local-size 1 --socket /run/bitpush/worker.sock --iters 5 \
      >"$out/trainer-heal.txt" 2>&1
    rc=$?
    if [ $rc = 0 ] && grep -q 'done$' "$out/trainer-heal.txt"; then
      if ! journalctl -b --no-pager -u "$witness" | grep -q "$names"; then
        say "FAIL heal after killing $victim: $witness's journal does not say '$names'"
        break
      fi
      local restarts=""
      for u in $kUnits; do restarts="$restarts ${u%.service}+$(( $(show "$u" NRestarts) - ${n0[$u]} ))"; done
      say "PASS heal after SIGKILL of $victim: every unit restarted by itself ($restarts) and active after ${took_up} s; a new trainer served after $((SECONDS - t0)) s ($tries tries); $witness logged '$names'"
      break
    fi
    if [ $SECONDS -ge $deadline ] || [ $tries -ge 10 ]; then
      say "FAIL heal after killing $victim: trainer exit $rc after $tries tries: $(tail -n 3 "$out/trainer-heal.txt" | tr '\n' ' ')"
      break
    fi
    sleep 1
  done
  timeout 60 systemctl stop $kUnits
}

# ---------------------------------------------------------------------------------------------
# A server that systemd restarts rejoins the running job in place (docs/deploy.md, "Restarts";
# cluster.server_rejoin_timeout_s: 30, above RestartSec=5s plus the start): a daemon-mode
# training process (examples/train_digits.py with --checkpoint-dir, as bitpush) trains while
# bitpush-server@1's main process is SIGKILLed after its first checkpoint; systemd starts the
# server again, the training process waits for it (wait_for_servers through the worker daemon)
# and goes back to its checkpoint, and it ends with the parameters of an uninterrupted run, bit
# for bit, while no other unit restarted. Uses check_main's say/show and $out, $shared.
rejoin_in_place() {
  local py=/usr/bin/python3 u rc pid0 i ref got
  local -A n0
  if [ ! -d "$shared/python/bitpush" ] || ! "$py" -c "import torch, sklearn" >/dev/null 2>&1; then
    say "SKIP rejoin in place: no bitpush Python package in this build tree, or no torch and sklearn for $py"
    return
  fi
  cp /etc/bitpush/cluster.yaml /etc/bitpush/cluster.yaml.orig
  sed -i 's/^  startup_timeout_s: 60$/&\n  server_rejoin_timeout_s: 30/' /etc/bitpush/cluster.yaml
  train() {  # JSON_OUT [extra args]: one training process of node 0, as bitpush, bounded
    local json=$1
    shift
    timeout -s KILL 120 setpriv --reuid=bitpush --regid=bitpush --init-groups -- \
      env -i PATH=/usr/bin:/bin HOME=/tmp PYTHONPATH="$shared/python" PYTHONDONTWRITEBYTECODE=1 \
      BITPUSH_CONFIG=/etc/bitpush/cluster.yaml BITPUSH_MODE=daemon BITPUSH_WORKER_RANK=0 \
      BITPUSH_LOCAL_RANK=0 BITPUSH_LOCAL_SIZE=1 BITPUSH_DAEMON_SOCKET=/run/bitpush/worker.sock \
      "$py" "$shared/examples/train_digits.py" --no-progress --json "$json" --optimizer clan \
      --compression onebit --epochs 25 "$@"
  }
  # The uninterrupted run (the units end by themselves after it).
  systemctl reset-failed $kUnits 2>/dev/null
  if ! timeout 90 systemctl start $kUnits; then
    say "FAIL rejoin in place: systemctl start $kUnits failed or timed out"
    return
  fi
  train /tmp/sdboot-ref.json >"$out/train-ref.txt" 2>&1
  rc=$?
  if [ $rc != 0 ]; then
    say "FAIL rejoin in place: the uninterrupted run exited $rc: $(tail -n 3 "$out/train-ref.txt" | tr '\n' ' ')"
    return
  fi
  timeout 60 systemctl stop $kUnits
  # The run whose server dies.
  systemctl reset-failed $kUnits 2>/dev/null
  if ! timeout 90 systemctl start $kUnits; then
    say "FAIL rejoin in place: systemctl start $kUnits (second) failed or timed out"
    return
  fi
  for u in $kUnits; do n0[$u]=$(show "$u" NRestarts); done
  pid0=$(show bitpush-server@1.service MainPID)
  train /tmp/sdboot-heal.json --checkpoint-dir /tmp/sdboot-ckpt --checkpoint-every 20 \
    >"$out/train-heal.txt" 2>&1 &
  local trainer=$!
  i=0
  until [ -e /tmp/sdboot-ckpt/step-00000020/COMPLETE ] || [ $i -ge 600 ]; do sleep 0.1; i=$((i + 1)); done
  if [ $i -ge 600 ]; then
    say "FAIL rejoin in place: no checkpoint at step 20 within 60 s: $(tail -n 3 "$out/train-heal.txt" | tr '\n' ' ')"
    wait $trainer
    return
  fi
  local t0=$SECONDS
  kill -KILL "$pid0"
  wait $trainer
  rc=$?
  local took=$((SECONDS - t0)) restarts=""
  for u in $kUnits; do restarts="$restarts ${u%.service}+$(( $(show "$u" NRestarts) - ${n0[$u]} ))"; done
  ref=$(sed -n 's/.*"params_sha256": "\([0-9a-f]*\)".*/\1/p' /tmp/sdboot-ref.json)
  got=$(sed -n 's/.*"params_sha256": "\([0-9a-f]*\)".*/\1/p' /tmp/sdboot-heal.json 2>/dev/null)
  if [ $rc = 0 ] && grep -q "a server restarted; back to step" "$out/train-heal.txt" &&
     [ -n "$ref" ] && [ "$got" = "$ref" ] &&
     [ "$restarts" = " bitpush-scheduler+0 bitpush-server@0+0 bitpush-server@1+1 bitpush-worker+0" ]; then
    say "PASS rejoin in place: bitpush-server@1 SIGKILLed after step 20 and restarted by systemd; the trainer went back to its checkpoint ($(grep -o 'back to step [0-9]*' "$out/train-heal.txt" | head -n 1)) and ended ${took} s later bit-identical to the uninterrupted run ($ref); restarts:$restarts"
  else
    say "FAIL rejoin in place: trainer exit $rc, restarts:$restarts (want only bitpush-server@1+1), params $got vs uninterrupted $ref: $(tail -n 4 "$out/train-heal.txt" | tr '\n' ' ')"
  fi
  timeout 60 systemctl stop $kUnits
  mv /etc/bitpush/cluster.yaml.orig /etc/bitpush/cluster.yaml
}

# ---------------------------------------------------------------------------------------------
# --check SHARED: the checker unit inside the booted namespace.
check_main() {
  local shared=$1 out=$1/result u pid uid state
  mkdir -p "$out"
  : >"$out/result"
  say() { echo "$*" >>"$out/result"; }
  show() { systemctl show -p "$2" --value "$1"; }

  for u in $kUnits; do
    state=$(show "$u" ActiveState)
    if [ "$state" = active ]; then
      say "PASS $u ready: active ($(show "$u" StatusText))"
    else
      say "FAIL $u ready: ActiveState=$state Result=$(show "$u" Result) (READY=1 never arrived?)"
      continue
    fi
    pid=$(show "$u" MainPID)
    uid=$(awk '/^Uid:/{print $2}' "/proc/$pid/status" 2>/dev/null)
    if [ "$uid" = "$(id -u bitpush)" ]; then
      say "PASS $u runs as bitpush (uid $uid)"
    else
      say "FAIL $u main pid $pid runs as uid '$uid', not bitpush"
    fi
    # The hardening is in force on the running daemon, not only written in the unit.
    local nnp capbnd rootro
    nnp=$(awk '/^NoNewPrivs:/{print $2}' "/proc/$pid/status" 2>/dev/null)
    capbnd=$(awk '/^CapBnd:/{print $2}' "/proc/$pid/status" 2>/dev/null)
    rootro=$(awk '$5 == "/" {print ($6 ~ /(^|,)ro(,|$)/) ? "ro" : "rw"}' "/proc/$pid/mountinfo" 2>/dev/null | tail -n 1)
    if [ "$nnp" = 1 ] && [ "$capbnd" = 0000000000000000 ] && [ "$rootro" = ro ]; then
      say "PASS $u hardened: NoNewPrivs=1, empty CapBnd, / read-only"
    else
      say "FAIL $u hardening not in force: NoNewPrivs=$nnp CapBnd=$capbnd /=$rootro"
    fi
    if [ "$u" != bitpush-worker.service ]; then   # the worker keeps the shared /tmp on purpose
      if awk '$5 == "/tmp" {print $4}' "/proc/$pid/mountinfo" 2>/dev/null | grep -q systemd-private; then
        say "PASS $u has its own /tmp (PrivateTmp)"
      else
        say "FAIL $u: /tmp is not a systemd-private directory (PrivateTmp not in force)"
      fi
    fi
    # Its CURVE key came through LoadCredential=: the file on disk is root's alone (the daemon,
    # as bitpush, could not open it), its copy in $CREDENTIALS_DIRECTORY is bitpush's alone (the
    # daemon refuses a key file its group or others may access), and the daemon runs with it.
    local key creds copy disk
    key=$(key_of "$u")
    creds=$(tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | sed -n 's/^CREDENTIALS_DIRECTORY=//p')
    copy=$(stat -c '%U %a' "$creds/bitpush.key" 2>&1)
    disk=$(stat -c '%U:%G %a' "/etc/bitpush/keys/$key" 2>&1)
    if [ -n "$creds" ] && [ "$disk" = "root:root 600" ] && [ "${copy% *}" = bitpush ] &&
       [ $((0${copy#* } & 077)) = 0 ] && cmp -s "$creds/bitpush.key" "/etc/bitpush/keys/$key" &&
       ! setpriv --reuid=bitpush --regid=bitpush --init-groups -- \
         cat "/etc/bitpush/keys/$key" >/dev/null 2>&1; then
      say "PASS $u key: /etc/bitpush/keys/$key ($disk, unreadable by bitpush) as $creds/bitpush.key ($copy)"
    else
      say "FAIL $u key: /etc/bitpush/keys/$key is '$disk' (want root:root 600, unreadable by bitpush), CREDENTIALS_DIRECTORY='$creds', its bitpush.key '$copy' (want bitpush's alone, the same bytes)"
    fi
  done
  if [ -S /run/bitpush/worker.sock ] && [ "$(stat -c %U /run/bitpush)" = bitpush ]; then
    say "PASS /run/bitpush/worker.sock exists (RuntimeDirectory owned by bitpush)"
  else
    say "FAIL /run/bitpush/worker.sock missing or /run/bitpush not owned by bitpush: $(ls -la /run/bitpush 2>&1 | tr '\n' ' ')"
  fi

  # CURVE in force on the wire: a ZMTP 3.0 greeting offering the NULL mechanism (what a node of
  # security.mode none sends) to the scheduler's port is refused, and the scheduler says why.
  if (exec 3<>/dev/tcp/127.0.0.1/47100 &&
      { printf '\xff'; head -c 8 /dev/zero; printf '\x7f\x03\x00NULL'; head -c 48 /dev/zero; } >&3 &&
      sleep 1) 2>/dev/null; then
    local i=0
    until journalctl -b --no-pager -u bitpush-scheduler.service |
          grep -q "refused a connection that does not speak CURVE" || [ $i -ge 50 ]; do
      sleep 0.2; i=$((i + 1))
    done
    if [ $i -lt 50 ]; then
      say "PASS a peer without CURVE is refused (the scheduler logged it)"
    else
      say "FAIL a NULL-mechanism ZMTP greeting to the scheduler was not refused as 'does not speak CURVE'"
    fi
  else
    say "FAIL could not send a ZMTP greeting to the scheduler at 127.0.0.1:47100"
  fi

  if grep -q '^FAIL' "$out/result"; then
    # Not every unit came up: the rest would only wait for it; the journals say why.
    save_journals
    say "END"
    return
  fi

  # One training process of node 0, as the daemon's user (it accepts only its own uid).
  timeout -s KILL 60 setpriv --reuid=bitpush --regid=bitpush --init-groups -- \
    "$shared/bin/bitpush-test-trainer" --config /etc/bitpush/cluster.yaml --node 0 \
    --local-rank 0 --local-size 1 --socket /run/bitpush/worker.sock --iters 5 \
    >"$out/trainer.txt" 2>&1
  local rc=$?
  if [ $rc = 0 ] && grep -q 'done$' "$out/trainer.txt"; then
    say "PASS trainer as bitpush: $(grep -c 'iteration .* ok' "$out/trainer.txt") push_pull iterations checked"
  else
    say "FAIL trainer exit $rc: $(tail -n 3 "$out/trainer.txt" | tr '\n' ' ')"
  fi

  # Every unit ends by itself: the scheduler shuts the cluster down once the worker is done.
  local deadline=$((SECONDS + 40)) pending
  while :; do
    pending=""
    for u in $kUnits; do
      case $(show "$u" ActiveState) in inactive|failed) ;; *) pending="$pending $u" ;; esac
    done
    [ -z "$pending" ] && break
    if [ $SECONDS -ge $deadline ]; then
      say "FAIL still running 40 s after the trainer ended:$pending"
      break
    fi
    sleep 0.5
  done
  for u in $kUnits; do
    local st code res act
    st=$(show "$u" ExecMainStatus); code=$(show "$u" ExecMainCode)
    res=$(show "$u" Result); act=$(show "$u" ActiveState)
    if [ "$act" = inactive ] && [ "$res" = success ] && [ "$st" = 0 ]; then
      say "PASS $u ended cleanly: ActiveState=$act Result=$res ExecMainStatus=$st"
    else
      say "FAIL $u end: ActiveState=$act Result=$res ExecMainCode=$code ExecMainStatus=$st"
    fi
  done
  if [ ! -e /run/bitpush ]; then
    say "PASS /run/bitpush removed at the end (RuntimeDirectory)"
  else
    say "FAIL /run/bitpush still there after bitpush-worker ended"
  fi

  # `systemctl stop` of a running cluster: the units start again (all four in one job, ready
  # together). Stopping the scheduler (SIGTERM, KillMode=mixed) ends it by itself with status
  # 0 (`inactive`); it shuts the cluster down, so the servers and the worker end by themselves
  # with status 1 naming "scheduler interrupted" (a failure for them: Restart=on-failure would
  # bring them back to rejoin a restarted scheduler; docs/deploy.md) — the stop job that
  # follows cancels that restart. (`systemctl stop A B C` enqueues one job per unit in the
  # order given, so which daemon hears of the stop first is up to the order: this makes it
  # the scheduler, deterministically.)
  if timeout 90 systemctl start $kUnits; then
    timeout 60 systemctl stop bitpush-scheduler.service
    local u act res code st
    act=$(show bitpush-scheduler.service ActiveState); res=$(show bitpush-scheduler.service Result)
    code=$(show bitpush-scheduler.service ExecMainCode)
    st=$(show bitpush-scheduler.service ExecMainStatus)
    # ExecMainCode 1: exited by itself (2: killed by a signal).
    if [ "$code" = 1 ] && [ "$st" = 0 ] && [ "$act" = inactive ]; then
      say "PASS bitpush-scheduler.service systemctl stop: ended by itself on SIGTERM, status 0, ActiveState=$act Result=$res"
    else
      say "FAIL bitpush-scheduler.service systemctl stop: ActiveState=$act Result=$res ExecMainCode=$code ExecMainStatus=$st (want exited, status 0, inactive)"
    fi
    local nodes="bitpush-server@0.service bitpush-server@1.service bitpush-worker.service"
    local -A ended
    for u in $nodes; do
      # Each ends by itself once it heard the Shutdown (bounded); read its exit before the
      # restart (RestartSec=5s) starts a new process. On its way out a daemon passes through
      # stop-sigterm (it sends STOPPING=1 before exiting), so wait for a settled state.
      local i=0 sub
      sub=$(show "$u" SubState)
      while [ "$sub" != auto-restart ] && [ "$sub" != failed ] && [ "$sub" != dead ] &&
            [ $i -lt 100 ]; do
        sleep 0.1; i=$((i + 1)); sub=$(show "$u" SubState)
      done
      ended[$u]="$sub $(show "$u" ExecMainCode) $(show "$u" ExecMainStatus)"
    done
    timeout 60 systemctl stop $nodes
    for u in $nodes; do
      act=$(show "$u" ActiveState)
      # ExecMainCode 1 (exited), status 1, then auto-restart pending (or failed).
      if [ "${ended[$u]}" = "auto-restart 1 1" ] && { [ "$act" = inactive ] || [ "$act" = failed ]; } &&
         journalctl -b --no-pager -u "$u" | grep -q "shut the cluster down: scheduler interrupted"; then
        say "PASS $u after the scheduler's stop: ended by itself, status 1 naming 'scheduler interrupted' (restart pending, then cancelled by stop: $act)"
      else
        say "FAIL $u after the scheduler's stop: SubState ExecMainCode ExecMainStatus = '${ended[$u]}', then ActiveState=$act (want 'auto-restart 1 1', 'scheduler interrupted' in its journal)"
      fi
    done
  else
    say "FAIL systemctl start $kUnits (second start) failed or timed out"
  fi

  rejoin_in_place
  heal_after_kill bitpush-server@1.service bitpush-worker.service \
    "server 1 at tcp://127.0.0.1:47102 failed"
  heal_after_kill bitpush-scheduler.service bitpush-worker.service \
    "scheduler at tcp://127.0.0.1:47100 silent"
  heal_after_kill bitpush-worker.service bitpush-scheduler.service \
    "worker 0 at tcp://127.0.0.1:47111 failed"

  save_journals
  for u in $kUnits; do
    # systemd (--log-level=debug) logs each datagram the daemon sent to $NOTIFY_SOCKET.
    if grep -q "Got notification message from PID [0-9]* (READY=1" "$out/journal-$u.txt" &&
       grep -q "Got notification message from PID [0-9]* (STOPPING=1)" "$out/journal-$u.txt"; then
      say "PASS $u sent READY=1 and, at its end, STOPPING=1"
    else
      say "FAIL $u: READY=1 or STOPPING=1 not in systemd's log of notifications"
    fi
  done
  say "END"
}

# The key file under /etc/bitpush/keys that unit $1 loads (LoadCredential=).
key_of() {
  case $1 in
    bitpush-scheduler.service) echo scheduler.key ;;
    bitpush-server@*.service) local n=${1#bitpush-server@}; echo "server-${n%.service}.key" ;;
    bitpush-worker.service) echo worker.key ;;
  esac
}

save_journals() {
  journalctl --sync >/dev/null 2>&1
  for u in $kUnits; do
    journalctl -b --no-pager -o short-monotonic -u "$u" >"$out/journal-$u.txt" 2>&1
  done
  journalctl -b --no-pager -o short-monotonic >"$out/journal.txt" 2>&1
}

# ---------------------------------------------------------------------------------------------
# Outside: prepare, boot, wait, report, clean up.
outer_main() {
  [ $# = 2 ] || { echo "usage: $0 BUILD_DIR INSTALL_PREFIX"; exit 2; }
  local build prefix systemd
  build=$(cd "$1" && pwd) || fail "no build directory $1"
  prefix=$2
  [ "$(id -u)" = 0 ] || skip "needs root (namespaces, mounts, a systemd PID 1); running as uid $(id -u)"
  systemd=$(find_systemd) || skip "no systemd binary (/lib/systemd/systemd)"
  for c in unshare nsenter systemctl journalctl systemd-sysusers setpriv timeout; do
    command -v $c >/dev/null 2>&1 || skip "$c not found"
  done
  grep -qw cgroup2 /proc/filesystems || skip "the kernel has no cgroup2"
  local cg_root
  cg_root=$(awk '$3 == "cgroup2" {print $2; exit}' /proc/self/mounts)
  [ -n "$cg_root" ] || skip "no cgroup2 hierarchy mounted on this machine to run systemd in"
  [ -w "$cg_root" ] || skip "cgroup2 hierarchy $cg_root is not writable"
  unshare -C -p -f -m -n true 2>/dev/null ||
    skip "unshare -C -p -f -m -n refused here (no namespaces for a systemd PID 1)"
  [ -d "$prefix" ] || skip "install prefix $prefix does not exist here (the test mounts the staged install over it)"
  case $prefix in /|/usr) skip "install prefix $prefix: the test mounts over it; use e.g. /usr/local" ;; esac
  [ -x "$build/bin/bitpush-test-trainer" ] || fail "$build/bin/bitpush-test-trainer not built"
  [ -x "$build/bin/bitpush" ] && [ -d "$build/python/bitpush" ] ||
    [ -x "$build/bin/bitpush-test-node" ] ||
    fail "neither $build/bin/bitpush (bitpush keygen) nor bitpush-test-node is built"

  local timeout_s=${BITPUSH_SDBOOT_TIMEOUT:-150}
  W=$(mktemp -d "${TMPDIR:-/tmp}/bitpush-sdboot.XXXXXX") || fail "mktemp"
  chmod 0755 "$W"
  CG="$cg_root/bitpush-sdboot.$$"
  NS_PID=""
  UNSHARE_PID=""
  WATCHDOG_PID=""
  trap cleanup EXIT
  trap 'echo "interrupted"; exit 1' INT TERM HUP

  echo "workdir $W"
  DESTDIR="$W/stage" cmake --install "$build" >"$W/install.log" 2>&1 ||
    { cat "$W/install.log"; fail "cmake --install $build"; }
  for u in $kUnits; do
    local f=${u/@[0-9]/@}
    [ -f "$W/stage$prefix/lib/systemd/system/$f" ] || fail "$prefix/lib/systemd/system/$f not installed"
  done
  mkdir -p "$W/bin"
  cp "$build/bin/bitpush-test-trainer" "$W/bin/"
  cp "$0" "$W/boot_systemd_units.sh"
  chmod 0755 "$W/bin/bitpush-test-trainer" "$W/boot_systemd_units.sh"
  # The Python package and the digits example, for the in-place rejoin (rejoin_in_place).
  if [ -d "$build/python/bitpush" ]; then
    cp -a "$build/python" "$W/python"
    mkdir -p "$W/examples"
    cp "$(dirname "$0")/../../examples/"*.py "$W/examples/"
    chmod -R a+rX "$W/python" "$W/examples"
  fi

  # The private /etc.
  cp -a /etc "$W/etc" || fail "copying /etc"
  local sys=$W/etc/systemd/system
  mkdir -p "$W/etc/bitpush" "$sys"
  # Enabled host units (timers, getty, ...) are not wanted: only our target's closure.
  rm -rf "$sys"/*.wants "$sys"/*.requires
  # systemd looks in /usr/local/lib/systemd/system and /usr/lib/systemd/system only; for
  # another prefix docs/deploy.md says to copy the units to /etc/systemd/system.
  case $prefix in
    /usr/local) ;;
    *) cp "$W/stage$prefix/lib/systemd/system/"bitpush-*.service "$sys/" ;;
  esac
  # Units that would touch what a container manager owns, or only slow the boot; masked.
  for m in systemd-udevd.service systemd-udev-trigger.service systemd-udev-settle.service \
           systemd-modules-load.service systemd-sysctl.service systemd-binfmt.service \
           systemd-remount-fs.service systemd-random-seed.service systemd-update-utmp.service \
           systemd-timesyncd.service systemd-pstore.service systemd-journal-flush.service \
           systemd-tmpfiles-setup-dev.service systemd-tmpfiles-clean.timer \
           systemd-hwdb-update.service systemd-firstboot.service ldconfig.service \
           systemd-machine-id-commit.service systemd-networkd-wait-online.service \
           NetworkManager-wait-online.service ifupdown-wait-online.service \
           networking.service kmod-static-nodes.service systemd-logind.service \
           getty.target console-getty.service systemd-ask-password-console.path \
           cryptsetup.target swap.target; do
    ln -sf /dev/null "$sys/$m"
  done
  cat >"$W/etc/bitpush/cluster.yaml" <<'EOF'
# bitpush boot test (tests/build/boot_systemd_units.sh): the whole cluster on loopback in the
# test's network namespace.
cluster:
  scheduler: 127.0.0.1:47100
  servers: [127.0.0.1:47101, 127.0.0.1:47102]     # bitpush-server@0, @1
  workers: [127.0.0.1:47111]                      # BITPUSH_WORKER_RANK=0
  token_file: /etc/bitpush/token                  # bitpush:bitpush 0600
  heartbeat_interval_ms: 200
  heartbeat_timeout_ms: 2000
  startup_timeout_s: 60
security:
  mode: curve                                     # keys: /etc/bitpush/keys (ns_main)
  public_keys: /etc/bitpush/keys/public_keys
compression:
  spec: onebit
  error_feedback: both
  min_compress_bytes: 4096
server:
  engine_threads: 1
  numa: off
worker:
  socket: /run/bitpush/worker.sock
  local_size: 1
  compress_threads: 1
  op_timeout_s: 60
EOF
  printf 'BITPUSH_WORKER_RANK=0\nBITPUSH_WORKER_ARGS=--local-size 1\n' >"$W/etc/bitpush/worker.env"
  echo "sdboot-$$-secret" >"$W/etc/bitpush/token"
  local wants="$kUnits $kChecker"
  cat >"$sys/$kTarget" <<EOF
[Unit]
Description=bitpush systemd boot test
Wants=$wants
EOF
  cat >"$sys/$kChecker" <<EOF
[Unit]
Description=bitpush systemd boot test checker
After=$kUnits
[Service]
Type=oneshot
ExecStart=/bin/bash $kInside/boot_systemd_units.sh --check $kInside
TimeoutStartSec=170s
StandardOutput=journal
EOF

  # Boot in a child cgroup (cgroup namespace: systemd's slices stay below it).
  mkdir "$CG" || fail "mkdir $CG"
  (
    echo $BASHPID >"$CG/cgroup.procs" || exit 1
    exec unshare -C -p -f -m -n --mount-proc "$W/boot_systemd_units.sh" --ns "$W" "$prefix" "$build"
  ) >"$W/boot.log" 2>&1 </dev/null &
  UNSHARE_PID=$!
  # Should this script be SIGKILLed (no trap runs), a watchdog still kills the namespace once
  # it is gone, or after the time limit plus a margin in any case.
  (
    trap '' INT TERM HUP
    trap 'kill "$s"; wait "$s"; exit 0' USR1   # the normal end: cleanup() below
    end=$((SECONDS + timeout_s + 30))
    while kill -0 $$ 2>/dev/null && [ $SECONDS -lt $end ]; do sleep 1 & s=$!; wait $s; done
    echo 1 >"$CG/cgroup.kill"
    kill -KILL "$UNSHARE_PID"
    sleep 1
    find "$CG" -depth -type d -exec rmdir {} +
    [ "${BITPUSH_SDBOOT_KEEP:-0}" = 1 ] || rm -rf "$W"
  ) >/dev/null 2>&1 </dev/null &
  WATCHDOG_PID=$!
  local i
  for i in $(seq 1 50); do
    NS_PID=$(pgrep -P "$UNSHARE_PID" | head -n 1)
    [ -n "$NS_PID" ] && break
    sleep 0.1
  done
  [ -n "$NS_PID" ] || { cat "$W/boot.log"; fail "the namespace's PID 1 did not start"; }
  echo "booting systemd (host pid $NS_PID) with --unit=$kTarget"

  local deadline=$((SECONDS + timeout_s)) ok=0
  while [ $SECONDS -lt $deadline ]; do
    if grep -qx END "$W/result/result" 2>/dev/null; then ok=1; break; fi
    kill -0 "$UNSHARE_PID" 2>/dev/null || break
    sleep 1
  done
  if [ $ok != 1 ]; then
    echo "--- no result after ${timeout_s} s (or systemd ended); boot log:"
    tail -n 30 "$W/boot.log"
    if kill -0 "$NS_PID" 2>/dev/null; then
      echo "--- inside (systemctl status, the units' bitpush and systemd messages):"
      timeout 10 nsenter -t "$NS_PID" -m -p -- systemctl --no-pager --lines=0 status \
        $kUnits $kChecker 2>&1
      for u in $kUnits; do
        echo "--- journalctl -u $u (last 25 lines without mount set-up):"
        timeout 10 nsenter -t "$NS_PID" -m -p -- journalctl -b --no-pager -o short-monotonic \
          -u "$u" 2>&1 | grep -v -e 'unit-root' -e 'namespace mount' | tail -n 25
      done
    fi
    [ -f "$W/result/result" ] && cat "$W/result/result"
    fail "the boot test did not finish"
  fi
  cat "$W/result/result"
  local failed
  failed=$(awk '$1 == "FAIL" {print $2}' "$W/result/result" | sort -u)
  for u in $failed; do
    if [ -f "$W/result/journal-$u.txt" ]; then
      echo "--- journalctl -u $u (without the mount set-up lines):"
      grep -v -e 'unit-root' -e 'namespace mount' "$W/result/journal-$u.txt"
    fi
  done
  if grep -q '^FAIL trainer' "$W/result/result"; then
    echo "--- trainer output:"; cat "$W/result/trainer.txt"
  fi
  if [ -n "$failed" ]; then fail "systemd boot test"; fi
  echo "PASS: the bitpush units booted under systemd, served a trainer and ended cleanly"
}

# Kills the namespace (every process in its cgroup, then its PID 1), removes the cgroup and
# the temporary directory. Runs on every exit of the outside script.
cleanup() {
  local rc=$? i
  trap - EXIT
  trap "" INT TERM HUP   # a second signal must not cut the cleanup short
  exec 3>&2 2>/dev/null   # not bash's "Killed" notice of the namespace's job
  # SIGKILL to the namespace's PID 1 ends every process of the pid namespace; unshare, its
  # parent, reaps it and exits. cgroup.kill then takes whatever is left in the cgroup.
  [ -n "${NS_PID:-}" ] && kill -KILL "$NS_PID"
  if [ -n "${UNSHARE_PID:-}" ]; then
    for i in $(seq 1 100); do kill -0 "$UNSHARE_PID" || break; sleep 0.1; done
  fi
  if [ -n "${CG:-}" ] && [ -e "$CG/cgroup.kill" ]; then echo 1 >"$CG/cgroup.kill"; fi
  if [ -n "${UNSHARE_PID:-}" ]; then
    kill -KILL "$UNSHARE_PID"
    wait "$UNSHARE_PID"
  fi
  [ -n "${WATCHDOG_PID:-}" ] && kill -USR1 "$WATCHDOG_PID" && wait "$WATCHDOG_PID"
  exec 2>&3 3>&-
  if [ -n "${CG:-}" ] && [ -d "$CG" ]; then
    for i in $(seq 1 50); do
      find "$CG" -depth -type d -exec rmdir {} + 2>/dev/null
      [ -d "$CG" ] || break
      sleep 0.1
    done
    [ -d "$CG" ] && echo "warning: could not remove cgroup $CG"
  fi
  if [ -n "${W:-}" ] && [ -d "$W" ]; then
    if [ "${BITPUSH_SDBOOT_KEEP:-0}" = 1 ]; then echo "kept $W"; else rm -rf "$W"; fi
  fi
  exit $rc
}

case ${1:-} in
  --ns) shift; ns_main "$@" ;;
  --check) shift; check_main "$@" ;;
  *) outer_main "$@" ;;
esac
