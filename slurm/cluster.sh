#!/usr/bin/env bash
# slurm/cluster.sh - a real Slurm cluster of N emulated nodes on this one machine: munged,
# slurmctld and one `slurmd -N nodeK` per node (optionally slurmdbd on a private MariaDB), all
# started by hand (no systemd), configured from slurm/templates/ into a state directory, stopped
# by pid file. Used by the slurm-labelled tests and by anyone who wants to try ringmaster with
# Slurm on a laptop or a CI runner. See slurm/README.md.
#
#   slurm/cluster.sh up [--nodes N] [--state-dir DIR] [--port-base P|auto] [--gpus-per-node G]
#                       [--cpus-per-node C] [--with-dbd] [--munge auto|own|system]
#                       [--spank PATH [--spank-args "k=v ..."] [--spank-optional]]
#   slurm/cluster.sh down   [--state-dir DIR] [--purge]
#   slurm/cluster.sh status [--state-dir DIR]
#   slurm/cluster.sh env    [--state-dir DIR]      # eval "$(slurm/cluster.sh env)"
#   slurm/cluster.sh plugstack [--state-dir DIR] [--spank PATH [--spank-args ...]]
#   slurm/cluster.sh node-stop|node-start NODE [--state-dir DIR]   # failure tests: one slurmd
#
# The state directory defaults to $RING_SLURM_STATE or /tmp/ringmaster-slurm.
set -euo pipefail
# bash 5.2: '&' in a ${var//pat/rep} replacement would insert the match (render() below)
shopt -u patsub_replacement 2>/dev/null || true

PROG=cluster.sh
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
TEMPLATES=$HERE/templates
T0=$EPOCHREALTIME

die() { echo "$PROG: error: $*" >&2; exit 1; }
log() {
  [ "$QUIET" = 1 ] && return 0
  awk -v a="$T0" -v b="$EPOCHREALTIME" -v m="$*" 'BEGIN { printf "[cluster +%5.1fs] %s\n", b - a, m }'
}

usage() {
  sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed -e '$d' -e 's/^# \{0,1\}//'
  cat <<'EOF'
Options:
  --nodes N             emulated nodes node1..nodeN (1-32, default 2)
  --state-dir DIR       configuration, state, logs, pid files (default $RING_SLURM_STATE or
                        /tmp/ringmaster-slurm); must be owned by you
  --port-base P|auto    slurmctld on P, slurmdbd P+1, MariaDB P+2, nodeK's slurmd on P+2+K;
                        auto (default) picks the first free block from 17817 in steps of 100.
                        All ports are checked free before anything starts.
  --gpus-per-node G     fake GPUs per node (0-16, default 2), shown as gres gpu:G
  --cpus-per-node C     CPUs declared per node (1-64, default 2)
  --with-dbd            also run slurmdbd on a private MariaDB (needs slurmdbd,
                        slurm-wlm-mysql-plugin, mariadb-server; not installed by default)
  --munge MODE          auto (default): use a munged already answering on the default socket,
                        else start one with its own key and socket in the state dir;
                        own: always start one; system: require the running one
  --spank PATH          add `required PATH ARGS` to plugstack.conf (the SPANK plugin)
  --spank-args "A B"    plugstack arguments for that line, e.g. "default_coord=ipc:///tmp/c"
  --spank-optional      write `optional` instead of `required`
  --purge               (down) also delete the state directory
  --quiet               less output
EOF
}

# ---- arguments -----------------------------------------------------------------------------
CMD=${1:-}
[ -n "$CMD" ] || { usage >&2; exit 2; }
shift
NODE=""
case $CMD in
  node-stop|node-start)
    NODE=${1:-}
    [[ $NODE =~ ^node[0-9]+$ ]] || die "$CMD needs a node name (node1, node2, ...)"
    shift ;;
esac
STATE=${RING_SLURM_STATE:-/tmp/ringmaster-slurm}
NODES=2 PORT_BASE=auto GPUS=2 CPUS=2 MEM_MB=2048 WITH_DBD=0 MUNGE_MODE=auto
SPANK="" SPANK_ARGS="" SPANK_KIND=required SPANK_SET=0 PURGE=0 QUIET=0
WAIT_S=${RING_SLURM_WAIT_S:-60}

need_val() { [ $# -ge 2 ] && [ -n "$2" ] || die "$1 needs a value (see $PROG --help)"; }
while [ $# -gt 0 ]; do
  opt=$1 val=""
  case $opt in
    --*=*) val=${opt#*=}; opt=${opt%%=*}; set -- "$opt" "$val" "${@:2}" ;;
  esac
  case $opt in
    --nodes) need_val "$@"; NODES=$2; shift 2 ;;
    --state-dir) need_val "$@"; STATE=$2; shift 2 ;;
    --port-base) need_val "$@"; PORT_BASE=$2; shift 2 ;;
    --gpus-per-node) need_val "$@"; GPUS=$2; shift 2 ;;
    --cpus-per-node) need_val "$@"; CPUS=$2; shift 2 ;;
    --with-dbd) WITH_DBD=1; shift ;;
    --munge) need_val "$@"; MUNGE_MODE=$2; shift 2 ;;
    --spank) need_val "$@"; SPANK=$2; SPANK_SET=1; shift 2 ;;
    --spank-args) [ $# -ge 2 ] || die "--spank-args needs a value"; SPANK_ARGS=$2; shift 2 ;;
    --spank-optional) SPANK_KIND=optional; shift ;;
    --purge) PURGE=1; shift ;;
    --quiet|-q) QUIET=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) die "unknown argument '$opt' (see $PROG --help)" ;;
  esac
done
case $CMD in -h|--help|help) usage; exit 0 ;; esac

is_uint() { [[ $1 =~ ^[0-9]+$ ]] && [ ${#1} -le 6 ]; }
is_uint "$NODES" && [ "$NODES" -ge 1 ] && [ "$NODES" -le 32 ] || die "--nodes must be 1-32, got '$NODES'"
is_uint "$GPUS" && [ "$GPUS" -le 16 ] || die "--gpus-per-node must be 0-16, got '$GPUS'"
is_uint "$CPUS" && [ "$CPUS" -ge 1 ] && [ "$CPUS" -le 64 ] || die "--cpus-per-node must be 1-64, got '$CPUS'"
[ "$PORT_BASE" = auto ] || { is_uint "$PORT_BASE" && [ "$PORT_BASE" -ge 1024 ] && \
  [ $((PORT_BASE + NODES + 2)) -le 65535 ]; } || die "--port-base must be auto or 1024..$((65535 - NODES - 2)), got '$PORT_BASE'"
case $MUNGE_MODE in auto|own|system) ;; *) die "--munge must be auto, own or system, got '$MUNGE_MODE'" ;; esac
[ "$SPANK_SET" = 0 ] || [[ $SPANK = /* ]] || SPANK=$(cd "$(dirname "$SPANK")" 2>/dev/null && pwd)/$(basename "$SPANK")
# plugstack.conf splits on whitespace and cuts at '#'
[[ $SPANK != *[[:space:]#]* ]] || die "--spank path must not contain spaces or '#': '$SPANK'"
[[ $SPANK_ARGS != *[$'\n'#]* ]] || die "--spank-args must be one line without '#'"
[[ $STATE = /* ]] || STATE=$PWD/$STATE
STATE=${STATE%/}
# Slurm config lines are split on whitespace and '#': keep the paths plain.
[[ $STATE =~ ^/[A-Za-z0-9._/-]+$ ]] || die "--state-dir must be an absolute path of [A-Za-z0-9._/-], got '$STATE'"

CONF=$STATE/etc/slurm.conf
RUN=$STATE/run
# mariadbd runs as user mysql: its pid file, socket and error log live in a directory it owns
MYRUN=$STATE/mysql-run
MARIADB_PID=$MYRUN/mariadb.pid
export SLURM_CONF=$CONF

# ---- helpers -------------------------------------------------------------------------------
# A pid file counts only if its process is alive AND belongs to this state directory (its
# command line or environment names it): a stale pid file whose pid was reused by another
# process, or a real Slurm on this machine, is never touched.
pid_of() {   # pid_of FILE -> prints the pid if it is one of ours and alive
  local f=$1 pid
  [ -s "$f" ] || return 1
  pid=$(head -c 32 "$f" | tr -dc 0-9)
  [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || return 1
  if tr '\0' '\n' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "$STATE/" ||
     tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | grep -qxF -- "RING_SLURM_STATE=$STATE"; then
    echo "$pid"; return 0
  fi
  return 1
}
# stop_pidfiles NAME=FILE...: SIGTERM to all of them at once, wait up to 15 s, SIGKILL the rest
stop_pidfiles() {
  local kv name f pid i left names=() pids=()
  for kv in "$@"; do
    name=${kv%%=*} f=${kv#*=}
    if pid=$(pid_of "$f"); then
      kill "$pid" 2>/dev/null || true
      names+=("$name") pids+=("$pid")
    fi
    rm -f "$f"
  done
  for ((i = 0; i < 75; i++)); do
    left=0
    for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && left=1; done
    [ "$left" = 0 ] && break
    sleep 0.2
  done
  for i in "${!pids[@]}"; do
    if kill -0 "${pids[$i]}" 2>/dev/null; then
      log "${names[$i]} (pid ${pids[$i]}) ignored SIGTERM for 15 s: SIGKILL"
      kill -9 "${pids[$i]}" 2>/dev/null || true
    fi
    log "stopped ${names[$i]} (pid ${pids[$i]})"
  done
  return 0
}
# A slurmstepd runs in its slurmd's log directory and keeps none of our marks in its
# command line or environment: its working directory tells whose it is.
our_stepds() {
  local pid
  for pid in $(ps -eo pid=,comm= | awk '$2 == "slurmstepd" { print $1 }'); do
    case $(readlink "/proc/$pid/cwd" 2>/dev/null) in "$STATE"/*) echo "$pid" ;; esac
  done
}
# wait_for DESCRIPTION TIMEOUT_S CMD...: poll every 0.2 s (each try at most 10 s)
wait_for() {
  local what=$1 tmo=$2 i; shift 2
  local end=$((SECONDS + tmo))
  local limit=(timeout 10)
  declare -F "$1" >/dev/null && limit=()   # shell functions here bound their own commands
  while [ $SECONDS -lt $end ]; do "${limit[@]}" "$@" >/dev/null 2>&1 && return 0; sleep 0.2; done
  echo "$PROG: timeout (${tmo}s) waiting for $what" >&2
  return 1
}
port_in_use() {   # TCP LISTEN sockets from /proc (no ss/netstat needed)
  local hex; hex=$(printf '%04X' "$1")
  awk -v h="$hex" 'FNR > 1 && $4 == "0A" { n = split($2, a, ":"); if (a[n] == h) f = 1 }
                   END { exit !f }' /proc/net/tcp /proc/net/tcp6 2>/dev/null
}
ports_free() {   # ports_free BASE COUNT -> prints the ports in use, fails if any
  local p busy=""
  for ((p = $1; p < $1 + $2; p++)); do port_in_use "$p" && busy+=" $p"; done
  [ -z "$busy" ] || { echo "${busy# }"; return 1; }
}
# render TEMPLATE OUTPUT KEY=VALUE...: replace @KEY@ with VALUE (VALUE may span lines)
render() {
  local tpl=$1 out=$2 text kv; shift 2
  text=$(<"$tpl")
  for kv in "$@"; do text=${text//@${kv%%=*}@/${kv#*=}}; done
  if [[ $text =~ @[A-Z_]+@ ]]; then die "internal: unfilled ${BASH_REMATCH[0]} in $tpl"; fi
  printf '%s\n' "$text" >"$out"
}
node_names() { local i; for ((i = 1; i <= NODES; i++)); do echo "node$i"; done; }
tail_log() { [ -f "$1" ] && { echo "---- last lines of $1:" >&2; tail -n "${2:-15}" "$1" >&2; }; return 0; }
check_owner() {
  [ -d "$STATE" ] || return 0
  [ "$(stat -c %u "$STATE")" = "$(id -u)" ] || die "$STATE is not owned by you (uid $(id -u)); pick another --state-dir"
}
load_state() {   # reads what `up` recorded; returns 1 when there is no cluster here
  [ -f "$STATE/cluster.env" ] || return 1
  local k v
  while IFS='=' read -r k v; do
    case $k in
      NODES|CTLD_PORT|DBD_PORT|MYSQL_PORT|GPUS|CPUS|MUNGE_MODE|WITH_DBD) printf -v "$k" '%s' "$v" ;;
    esac
  done <"$STATE/cluster.env"
}
all_pidfiles() {
  local f
  for f in "$RUN"/slurmd-*.pid "$RUN"/slurmctld.pid "$RUN"/slurmdbd.pid "$MARIADB_PID" "$RUN"/munged.pid; do
    [ -e "$f" ] && echo "$f"
  done
  return 0
}
any_alive() { local f; for f in $(all_pidfiles); do pid_of "$f" >/dev/null && return 0; done; return 1; }

# ---- down ----------------------------------------------------------------------------------
do_down() {
  [ -d "$STATE" ] || { log "no cluster in $STATE"; return 0; }
  check_owner
  load_state || true
  if pid_of "$RUN/slurmctld.pid" >/dev/null; then
    # Cancel jobs while slurmctld and the slurmd's are up, else their slurmstepd's and tasks
    # would outlive the slurmd's.
    local jobs i
    jobs=$(timeout 10 squeue -h -o %i 2>/dev/null | tr '\n' ' ' || true)
    if [ -n "${jobs// /}" ]; then
      log "scancel $jobs"
      # shellcheck disable=SC2086
      timeout 10 scancel $jobs 2>/dev/null || true
      for ((i = 0; i < 100; i++)); do
        [ -z "$(timeout 5 squeue -h -o %i 2>/dev/null)" ] && break; sleep 0.2
      done
    fi
  fi
  # slurmd's and slurmctld together (jobs are gone), then what they depend on
  local f stops=()
  for f in "$RUN"/slurmd-*.pid; do [ -e "$f" ] && stops+=("slurmd $(basename "$f" .pid | sed 's/^slurmd-//')=$f"); done
  stop_pidfiles "${stops[@]}" "slurmctld=$RUN/slurmctld.pid"
  stop_pidfiles "slurmdbd=$RUN/slurmdbd.pid"
  stop_pidfiles "mariadbd=$MARIADB_PID" "munged=$RUN/munged.pid"   # munged: only when ours
  # A slurmstepd whose job could not be cancelled cleanly: only ours, one pid at a time.
  local pid
  for pid in $(our_stepds); do
    log "leftover slurmstepd (pid $pid): SIGKILL"
    kill -9 "$pid" 2>/dev/null || true
  done
  rm -f "$STATE"/munge/munge.socket* "$RUN"/*.pid
  if [ "$PURGE" = 1 ]; then
    rm -rf "$STATE"
    log "removed $STATE"
  fi
  log "down"
}

# ---- up ------------------------------------------------------------------------------------
check_packages() {
  local b missing=()
  for b in slurmctld slurmd srun sbatch sinfo squeue scontrol scancel sacct munged munge unmunge mungekey; do
    command -v "$b" >/dev/null 2>&1 || [ -x "/usr/sbin/$b" ] || missing+=("$b")
  done
  [ ${#missing[@]} -eq 0 ] || die "missing programs: ${missing[*]}. Run scripts/install-deps.sh (it installs slurm-wlm slurmctld slurmd slurm-client libslurm-dev munge)."
  if [ "$WITH_DBD" = 1 ]; then
    missing=()
    command -v slurmdbd >/dev/null 2>&1 || missing+=(slurmdbd)
    ls /usr/lib/*/slurm-wlm/accounting_storage_mysql.so >/dev/null 2>&1 || missing+=(slurm-wlm-mysql-plugin)
    { command -v mariadbd && command -v mariadb-install-db && command -v mariadb; } >/dev/null 2>&1 || missing+=(mariadb-server mariadb-client)
    [ ${#missing[@]} -eq 0 ] || die "--with-dbd needs packages scripts/install-deps.sh does not install: apt-get install ${missing[*]}  (or leave out --with-dbd: sacct -c works without it)"
  fi
}

munge_works() {   # munge_works [SOCKET]
  local s=()
  [ $# -gt 0 ] && s=(-S "$1")
  munge "${s[@]}" -n </dev/null 2>/dev/null | unmunge "${s[@]}" >/dev/null 2>&1
}

up_fail() {
  echo "$PROG: error: $*" >&2
  local f
  for f in "$STATE"/log/slurmctld.log "$STATE"/log/slurmd-*.log "$STATE"/log/slurmdbd.log "$STATE"/munge/munged.log; do
    [ -f "$f" ] && grep -qiE 'error|fatal' "$f" && tail_log "$f" 10
  done
  echo "$PROG: stopping what was started (logs stay in $STATE/log)" >&2
  QUIET=1 do_down || true
  exit 1
}

do_up() {
  [ "$(id -u)" = 0 ] || die "up must run as root (slurmd launches tasks as their users, and the fake GPUs are device nodes); on a laptop: sudo $0 up ..."
  check_packages
  check_owner
  # Idempotent: a complete cluster of the same shape is left alone; a partial or different
  # one is an error; a dead one (stale pid files, e.g. after a reboot) is replaced.
  if [ -f "$STATE/cluster.env" ] && any_alive; then
    local want_nodes=$NODES want_gpus=$GPUS all=1 n
    load_state
    for n in $(node_names); do pid_of "$RUN/slurmd-$n.pid" >/dev/null || all=0; done
    pid_of "$RUN/slurmctld.pid" >/dev/null || all=0
    if [ "$all" = 1 ] && [ "$want_nodes" = "$NODES" ] && [ "$want_gpus" = "$GPUS" ]; then
      log "already up in $STATE ($NODES nodes, slurmctld port $CTLD_PORT)"
      return 0
    fi
    die "a cluster is already running in $STATE ($NODES nodes, gpus $GPUS$([ "$all" = 1 ] || echo ', some daemons dead')); run '$0 down --state-dir $STATE' first"
  fi

  # ports: slurmctld P, slurmdbd P+1, MariaDB P+2, nodeK P+2+K
  local nports=$((NODES + 3)) busy
  if [ "$PORT_BASE" = auto ]; then
    local b
    for ((b = 17817; b + nports < 30000; b += 100)); do
      ports_free "$b" "$nports" >/dev/null && { PORT_BASE=$b; break; }
    done
    [ "$PORT_BASE" != auto ] || die "no free block of $nports TCP ports between 17817 and 30000"
  elif ! busy=$(ports_free "$PORT_BASE" "$nports"); then
    die "TCP port(s) $busy already in use (this cluster needs $PORT_BASE-$((PORT_BASE + nports - 1)): slurmctld, slurmdbd, MariaDB, one slurmd per node). Pick another --port-base or use --port-base auto."
  fi
  CTLD_PORT=$PORT_BASE DBD_PORT=$((PORT_BASE + 1)) MYSQL_PORT=$((PORT_BASE + 2))

  # fresh tree (logs of a previous run are kept in log.prev)
  mkdir -p "$STATE"
  chmod 0755 "$STATE"   # munged wants execute permission for all on the socket's directories
  rm -rf "$STATE/log.prev"
  [ -d "$STATE/log" ] && mv "$STATE/log" "$STATE/log.prev"
  rm -rf "$STATE"/{etc,ctld,spool,run,fakedev,munge,mysql,mysql-run} "$STATE/jobcomp.txt" "$STATE/cluster.env"
  mkdir -p "$STATE"/{etc,ctld,run,log,fakedev}
  local n i
  for n in $(node_names); do mkdir -p "$STATE/spool/$n"; done

  # fake GPUs: character devices with /dev/null's numbers; a symlink where mknod is refused
  for ((i = 0; i < GPUS; i++)); do
    mknod "$STATE/fakedev/nvidia$i" c 1 3 2>/dev/null || ln -s /dev/null "$STATE/fakedev/nvidia$i"
  done

  # munge
  local authinfo="" dbd_authinfo="" dbd_pass=""
  if [ "$MUNGE_MODE" != own ] && munge_works; then
    MUNGE_MODE=system
    log "using the munged already running on the default socket"
  elif [ "$MUNGE_MODE" = system ]; then
    die "--munge system: no munged answers on the default socket (start it, or use --munge own)"
  else
    MUNGE_MODE=own
    local sock=$STATE/munge/munge.socket
    [ ${#sock} -lt 100 ] || die "state dir path too long for a unix socket ($sock); use a shorter --state-dir"
    mkdir -p "$STATE/munge"; chmod 0755 "$STATE/munge"
    mungekey --create --keyfile="$STATE/munge/munge.key" 2>/dev/null || up_fail "mungekey failed"
    chmod 0600 "$STATE/munge/munge.key"
    RING_SLURM_STATE=$STATE munged --socket="$sock" --key-file="$STATE/munge/munge.key" \
      --log-file="$STATE/munge/munged.log" --pid-file="$RUN/munged.pid" \
      --seed-file="$STATE/munge/munged.seed" </dev/null >/dev/null 2>"$STATE/log/munged.stderr" ||
      up_fail "munged did not start: $(cat "$STATE/log/munged.stderr")"
    wait_for munged 10 munge_works "$sock" || up_fail "munged does not answer on $sock"
    log "munged up (own key and socket in $STATE/munge, pid $(cat "$RUN/munged.pid"))"
    authinfo=",socket=$sock"
    dbd_authinfo="AuthInfo=socket=$sock"
    # connections to slurmdbd take their munge socket from AccountingStoragePass, not AuthInfo
    dbd_pass=$'\n'"AccountingStoragePass=$sock"
  fi

  # configuration
  local node_lines="" gres_lines=""
  for ((i = 1; i <= NODES; i++)); do
    node_lines+="NodeName=node$i NodeAddr=127.0.0.1 Port=$((PORT_BASE + 2 + i)) CPUs=$CPUS Sockets=1 CoresPerSocket=$CPUS ThreadsPerCore=1 RealMemory=$MEM_MB"
    [ "$GPUS" -gt 0 ] && node_lines+=" Gres=gpu:$GPUS"
    node_lines+=" State=UNKNOWN"$'\n'
  done
  if [ "$GPUS" -gt 0 ]; then
    gres_lines="NodeName=node[1-$NODES] Name=gpu File=$STATE/fakedev/nvidia[0-$((GPUS - 1))]"
    [ "$GPUS" = 1 ] && gres_lines="NodeName=node[1-$NODES] Name=gpu File=$STATE/fakedev/nvidia0"
  else
    gres_lines="# no fake GPUs (--gpus-per-node 0)"
  fi
  local accounting="AccountingStorageType=accounting_storage/none"
  [ "$WITH_DBD" = 1 ] && accounting="AccountingStorageType=accounting_storage/slurmdbd"$'\n'"AccountingStorageHost=localhost"$'\n'"AccountingStoragePort=$DBD_PORT$dbd_pass"
  render "$TEMPLATES/slurm.conf.in" "$CONF" \
    "STATE=$STATE" "NUM_NODES=$NODES" "NODE_RANGE=node[1-$NODES]" "CLUSTER_NAME=ringlocal" \
    "CTLD_PORT=$CTLD_PORT" "SLURM_USER=$(id -un)" "MUNGE_AUTHINFO=$authinfo" \
    "ACCOUNTING=$accounting" "NODE_LINES=${node_lines%$'\n'}"
  render "$TEMPLATES/gres.conf.in" "$STATE/etc/gres.conf" "STATE=$STATE" "GPUS_PER_NODE=$GPUS" "GRES_LINES=$gres_lines"
  write_plugstack
  {
    echo "# written by slurm/cluster.sh up; read by down/status/env"
    echo "NODES=$NODES"; echo "GPUS=$GPUS"; echo "CPUS=$CPUS"; echo "CTLD_PORT=$CTLD_PORT"
    echo "DBD_PORT=$DBD_PORT"; echo "MYSQL_PORT=$MYSQL_PORT"; echo "MUNGE_MODE=$MUNGE_MODE"; echo "WITH_DBD=$WITH_DBD"
  } >"$STATE/cluster.env"

  # optional accounting: private MariaDB + slurmdbd
  if [ "$WITH_DBD" = 1 ]; then
    local pass; pass=$(head -c 12 /dev/urandom | od -An -tx1 | tr -d ' \n')
    render "$TEMPLATES/slurmdbd.conf.in" "$STATE/etc/slurmdbd.conf" "STATE=$STATE" "DBD_PORT=$DBD_PORT" \
      "MYSQL_PORT=$MYSQL_PORT" "SLURM_USER=$(id -un)" "DB_PASS=$pass" "DBD_AUTHINFO_LINE=$dbd_authinfo"
    chmod 0600 "$STATE/etc/slurmdbd.conf"
    install -d -o mysql -g mysql "$STATE/mysql" "$MYRUN"
    mariadb-install-db --no-defaults --user=mysql --datadir="$STATE/mysql" \
      --auth-root-authentication-method=socket --skip-test-db >"$STATE/log/mariadb-install.log" 2>&1 ||
      up_fail "mariadb-install-db failed (see $STATE/log/mariadb-install.log)"
    RING_SLURM_STATE=$STATE setsid -f mariadbd --no-defaults --user=mysql --datadir="$STATE/mysql" \
      --socket="$MYRUN/mysql.sock" --port="$MYSQL_PORT" --bind-address=127.0.0.1 \
      --pid-file="$MARIADB_PID" --log-error="$MYRUN/mariadb.err" \
      --innodb-buffer-pool-size=64M </dev/null >/dev/null 2>&1
    wait_for mariadb "$WAIT_S" mariadb --socket="$MYRUN/mysql.sock" -u root -e 'SELECT 1' ||
      up_fail "MariaDB did not start: $(tail -n 5 "$MYRUN/mariadb.err" 2>/dev/null)"
    mariadb --socket="$MYRUN/mysql.sock" -u root -e \
      "CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY '$pass';
       GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';"
    log "mariadb up (pid $(cat "$MARIADB_PID"), port $MYSQL_PORT)"
    RING_SLURM_STATE=$STATE slurmdbd </dev/null >"$STATE/log/slurmdbd.stderr" 2>&1 || up_fail "slurmdbd did not start"
    wait_for slurmdbd "$WAIT_S" sacctmgr -n show cluster || up_fail "slurmdbd does not answer on port $DBD_PORT"
    log "slurmdbd up (pid $(cat "$RUN/slurmdbd.pid"), port $DBD_PORT)"
  fi

  # controller (daemonizes, writes its pid file)
  RING_SLURM_STATE=$STATE slurmctld -f "$CONF" </dev/null >"$STATE/log/slurmctld.stderr" 2>&1 ||
    up_fail "slurmctld did not start: $(tail -n 3 "$STATE/log/slurmctld.stderr")"
  wait_for slurmctld "$WAIT_S" bash -c 'scontrol ping | grep -q "is UP"' || up_fail "slurmctld does not answer on port $CTLD_PORT"
  log "slurmctld up (pid $(cat "$RUN/slurmctld.pid"), port $CTLD_PORT)"

  # one slurmd per emulated node; -N picks its NodeName (no --enable-multiple-slurmd needed)
  for n in $(node_names); do
    RING_SLURM_STATE=$STATE slurmd -f "$CONF" -N "$n" </dev/null >"$STATE/log/slurmd-$n.stderr" 2>&1 ||
      up_fail "slurmd -N $n did not start: $(tail -n 3 "$STATE/log/slurmd-$n.stderr")"
  done
  wait_for "$NODES idle node(s)" "$WAIT_S" bash -c "[ \$(sinfo -h -N -t idle -o %N | sort -u | wc -l) -eq $NODES ]" ||
    up_fail "not all $NODES nodes became idle: $(sinfo -h -N -o '%N:%t' | sort -u | tr '\n' ' ')"
  log "slurmd x$NODES up (ports $((PORT_BASE + 3))-$((PORT_BASE + 2 + NODES))); cluster ready"
  if [ "$QUIET" != 1 ]; then
    sinfo -N -o '%N %P %t %c %m %G' | sort -u
    echo "# to use it from a shell:"
    print_env
  fi
}

write_plugstack() {
  local lines="# no SPANK plugin (cluster.sh up/plugstack --spank PATH adds one)"
  if [ "$SPANK_SET" = 1 ]; then
    [ -f "$SPANK" ] || die "--spank: no such file: $SPANK"
    lines="$SPANK_KIND $SPANK${SPANK_ARGS:+ $SPANK_ARGS}"
  fi
  render "$TEMPLATES/plugstack.conf.in" "$STATE/etc/plugstack.conf" "PLUGIN_LINES=$lines"
}

print_env() {
  echo "export SLURM_CONF=$CONF"
  echo "export RING_SLURM_STATE=$STATE"
}

# ---- status --------------------------------------------------------------------------------
do_status() {
  load_state || { echo "no cluster in $STATE"; return 1; }
  local f pid ok=1 name
  echo "state dir: $STATE ($NODES nodes, $GPUS fake GPUs each, slurmctld port $CTLD_PORT, munge $MUNGE_MODE)"
  for f in "$RUN"/slurmctld.pid $(for n in $(node_names); do echo "$RUN/slurmd-$n.pid"; done) \
           "$RUN"/slurmdbd.pid "$MARIADB_PID" "$RUN"/munged.pid; do
    name=$(basename "$f" .pid)
    case $name in slurmdbd|mariadb) [ "$WITH_DBD" = 1 ] || continue ;; munged) [ "$MUNGE_MODE" = own ] || continue ;; esac
    if pid=$(pid_of "$f"); then echo "  $name: running (pid $pid)"; else echo "  $name: not running"; ok=0; fi
  done
  if pid_of "$RUN/slurmctld.pid" >/dev/null; then
    timeout 10 sinfo -N -o '%N %P %t %c %m %G' | sort -u | sed 's/^/  /'
    timeout 10 squeue | sed 's/^/  /'
  fi
  [ "$ok" = 1 ]
}

# ---- one node's slurmd (failure tests: Slurm marks it DOWN after SlurmdTimeout) -------------
do_node() {
  load_state || die "no cluster in $STATE"
  [ "${NODE#node}" -ge 1 ] && [ "${NODE#node}" -le "$NODES" ] || die "$NODE is not a node of this cluster (node1..node$NODES)"
  if [ "$CMD" = node-stop ]; then
    stop_pidfiles "slurmd $NODE=$RUN/slurmd-$NODE.pid"
    return 0
  fi
  if pid_of "$RUN/slurmd-$NODE.pid" >/dev/null; then log "slurmd $NODE already running"; return 0; fi
  RING_SLURM_STATE=$STATE slurmd -f "$CONF" -N "$NODE" </dev/null >"$STATE/log/slurmd-$NODE.stderr" 2>&1 ||
    die "slurmd -N $NODE did not start: $(tail -n 3 "$STATE/log/slurmd-$NODE.stderr")"
  wait_for "slurmd $NODE pid file" 10 test -s "$RUN/slurmd-$NODE.pid" || die "slurmd $NODE wrote no pid file"
  log "started slurmd $NODE (pid $(cat "$RUN/slurmd-$NODE.pid"))"
}

case $CMD in
  up) do_up ;;
  node-stop|node-start) do_node ;;
  down) do_down ;;
  status) do_status ;;
  env) [ -f "$CONF" ] || die "no cluster configured in $STATE (run: $0 up --state-dir $STATE)"; print_env ;;
  plugstack) [ -d "$STATE/etc" ] || die "no cluster configured in $STATE"; write_plugstack; log "wrote $STATE/etc/plugstack.conf" ;;
  *) die "unknown command '$CMD' (up, down, status, env, plugstack, node-stop, node-start; --help)" ;;
esac
