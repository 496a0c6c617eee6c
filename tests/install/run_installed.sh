#!/usr/bin/env bash
# Shared by install_test.sh and package_test.sh; source it, do not run it.
#
# ring_check_no_build_paths ROOT DIR...: no ELF file under ROOT has a RUNPATH/RPATH naming one of
#   the DIRs (the source and build trees) or holds one of them as a string.
# ring_run_installed BINDIR EXAMPLES WORKDIR HIDE_DIR...: runs BINDIR/ringctl run EXAMPLES/tiny.yaml
#   --steps 2 with PATH holding system directories only, no LD_LIBRARY_PATH and, where a private
#   mount namespace can be made (root), every HIDE_DIR covered by an empty tmpfs: ringd, ring-coord,
#   ring-worker and the plugins must be found from BINDIR alone. Checks the exit status and one
#   loss line per step; prints the run's output.

fail() { echo "FAIL: $*" >&2; exit 1; }

ring_elf_files() {
  find "$1" -type f -print0 | while IFS= read -r -d '' f; do
    [ "$(head -c 4 "$f" | od -An -c | tr -d ' ')" = '177ELF' ] && printf '%s\n' "$f"
  done
}

ring_check_no_build_paths() {
  local root=$1; shift
  local f d n=0
  while IFS= read -r f; do
    n=$((n + 1))
    local dyn
    dyn=$(readelf -d "$f" 2>/dev/null | grep -E 'RUNPATH|RPATH' || true)
    for d in "$@"; do
      case $dyn in *"$d"*) fail "$f has a RUNPATH/RPATH into $d: $dyn" ;; esac
      if grep -qaF -- "$d/" "$f"; then
        fail "$f holds the path $d/: $(grep -aoF -- "$d/" "$f" | head -1)"
      fi
    done
  done < <(ring_elf_files "$root")
  [ "$n" -ge 4 ] || fail "only $n ELF files under $root"
  echo "ok: $n ELF files under $root name neither $*"
}

ring_run_installed() {
  local bindir=$1 examples=$2 w=$3; shift 3
  mkdir -p "$w/home" "$w/state" "$w/run" "$w/sock" "$w/job"
  chmod 700 "$w/home" "$w/state" "$w/run" "$w/sock" "$w/job"
  # shellcheck disable=SC2054  # commas are part of the values
  local envs=(env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME="$w/home" XDG_RUNTIME_DIR="$w/run"
              RING_COORD="ipc://$w/sock/coord.sock" RING_STATE_DIR="$w/state"
              UCX_TLS=self,posix UCX_NET_DEVICES=lo)
  local run=("${envs[@]}" timeout 240 "$bindir/ringctl" run "$examples/tiny.yaml" --steps 2
             --job-dir "$w/job")
  local hide="" d
  for d in "$@"; do
    hide+="mount -t tmpfs -o size=1m,mode=0755 ringmaster-hidden $(printf %q "$d") || exit 99; "
  done
  local rc=0
  cd "$w" || fail "cannot enter $w"
  if [ "$(id -u)" = 0 ] && unshare --mount --propagation private true 2>/dev/null; then
    echo "== ringctl run with the source and build trees hidden (private mount namespace): $*"
    unshare --mount --propagation private bash -c "$hide"'exec "$@"' _ "${run[@]}" \
      >"$w/run.out" 2>&1 || rc=$?
  else
    echo "== ringctl run (no private mount namespace here: the trees stay visible, PATH excludes them)"
    "${run[@]}" >"$w/run.out" 2>&1 || rc=$?
  fi
  cat "$w/run.out"
  [ "$rc" != 99 ] || fail "could not hide $*"
  [ "$rc" = 0 ] || fail "installed ringctl run exited $rc"
  for s in 1 2; do
    grep -qE "^step $s/2  loss [0-9]+\.[0-9]+ " "$w/run.out" || fail "no loss line for step $s/2"
  done
  echo "ok: the installed ringctl ran tiny.yaml (2 steps, loss lines present)"
}
