#!/usr/bin/env bash
# `cmake --install` into a fresh prefix: every expected file is there (binaries, plugins, man pages,
# completion, examples, docs), no installed ELF file refers to the build or source tree, and the
# installed ringctl runs the tiny example with the trees out of reach (run_installed.sh).
#   install_test.sh BUILD_DIR SOURCE_DIR EXPECTED_FILE...   (paths relative to the prefix)
set -euo pipefail
build=$1 src=$2; shift 2
source "$(dirname "$0")/run_installed.sh"

w=$(mktemp -d /tmp/ring-install-test.XXXXXX)
trap 'rm -rf "$w"' EXIT
prefix="$w/prefix"

cmake --install "$build" --prefix "$prefix" >"$w/install.log" 2>&1 || { cat "$w/install.log"; fail "cmake --install failed"; }
for f in "$@"; do
  [ -e "$prefix/$f" ] || fail "cmake --install did not install $f"
done
for b in ringctl ring-coord ringd ring-worker; do
  [ -x "$prefix/bin/$b" ] || fail "bin/$b is not executable"
done
echo "ok: cmake --install put all $# expected files under the prefix"

ring_check_no_build_paths "$prefix" "$(cd "$build" && pwd -P)" "$(cd "$src" && pwd -P)"
# The build tree first: it may lie inside the source tree, which hides it once covered.
ring_run_installed "$prefix/bin" "$prefix/share/ringmaster/examples" "$w/run" \
  "$(cd "$build" && pwd -P)" "$(cd "$src" && pwd -P)"
