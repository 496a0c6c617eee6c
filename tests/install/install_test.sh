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

# The installed docs link to each other as in the source tree: every relative link resolves.
broken=0 links=0
while IFS= read -r md; do
  while IFS= read -r target; do
    case $target in http:*|https:*|mailto:*|'#'*) continue ;; esac
    links=$((links + 1))
    [ -e "$(dirname "$md")/${target%%#*}" ] || { echo "broken link in ${md#$prefix/}: ($target)"; broken=$((broken + 1)); }
  done < <(grep -o '\](\([^) ]*\))' "$md" | sed 's/^](\(.*\))$/\1/')
done < <(find "$prefix/share/doc/ringmaster" -name '*.md')
[ "$broken" -eq 0 ] || fail "$broken of $links links in the installed docs resolve to nothing"
echo "ok: all $links relative links of the installed docs resolve"

ring_check_no_build_paths "$prefix" "$(cd "$build" && pwd -P)" "$(cd "$src" && pwd -P)"
# The build tree first: it may lie inside the source tree, which hides it once covered.
ring_run_installed "$prefix/bin" "$prefix/share/ringmaster/examples" "$w/run" \
  "$(cd "$build" && pwd -P)" "$(cd "$src" && pwd -P)"
