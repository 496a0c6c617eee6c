#!/usr/bin/env bash
# The Debian package: `cpack -G DEB` in the build tree, its metadata (name, version, architecture,
# section, maintainer; every Depends names a package installed here), its contents (binaries,
# plugins, man pages, completion, examples, copyright), lintian without errors, then dpkg unpacks
# it into a fresh root (--root, --force-not-root: no system change) and the unpacked
# usr/bin/ringctl runs usr/share/ringmaster/examples/tiny.yaml with the build and source trees out
# of reach (run_installed.sh).
#   package_test.sh BUILD_DIR SOURCE_DIR VERSION EXPECTED_RUNTIME_FILES EXPECTED_CUDA_FILES
#   (file lists: ':'-separated paths relative to the package root; the CUDA list may be empty)
set -euo pipefail
build=$1 src=$2 version=$3
IFS=':' read -r -a expect_runtime <<<"$4"
IFS=':' read -r -a expect_cuda <<<"${5:-}"
source "$(dirname "$0")/run_installed.sh"

w=$(mktemp -d /tmp/ring-package-test.XXXXXX)
trap 'rm -rf "$w"' EXIT
arch=$(dpkg --print-architecture)

# cpack writes into the build tree; its own output directory keeps parallel runs apart.
(cd "$build" && cpack -G DEB -B "$w/out" >"$w/cpack.log" 2>&1) || { cat "$w/cpack.log"; fail "cpack -G DEB failed"; }
deb="$w/out/ringmaster_${version}_${arch}.deb"
[ -f "$deb" ] || { ls -l "$w/out"; fail "no ringmaster_${version}_${arch}.deb"; }
echo "ok: built $(basename "$deb") ($(du -k "$deb" | cut -f1) KiB)"

field() { dpkg-deb -f "$1" "$2"; }
[ "$(field "$deb" Package)" = ringmaster ] || fail "Package: $(field "$deb" Package)"
[ "$(field "$deb" Version)" = "$version" ] || fail "Version: $(field "$deb" Version)"
[ "$(field "$deb" Architecture)" = "$arch" ] || fail "Architecture: $(field "$deb" Architecture)"
[ "$(field "$deb" Section)" = science ] || fail "Section: $(field "$deb" Section)"
[[ "$(field "$deb" Maintainer)" == *"<"*"@"*">" ]] || fail "Maintainer: $(field "$deb" Maintainer)"
depends=$(field "$deb" Depends)
[ -n "$depends" ] || fail "no Depends"
# Each dependency (or one of its alternatives) is a package installed on this machine, or a
# virtual package one of them provides (libspdlog1.10 provides libspdlog1.10-fmt9).
dpkg-query -W -f='${db:Status-Abbrev} ${Package} ${Provides}\n' | awk '$1 == "ii" {
    for (i = 2; i <= NF; i++) { n = $i; sub(/,$/, "", n); if (n !~ /^\(/ && n !~ /\)$/ && n != "(=") print n } }' \
  | sed 's/:.*//' | sort -u >"$w/installed"
IFS=',' read -r -a deps <<<"$depends"
for d in "${deps[@]}"; do
  ok=0
  IFS='|' read -r -a alts <<<"$d"
  for a in "${alts[@]}"; do
    p=$(echo "$a" | sed -E 's/\(.*\)//; s/:any//; s/[[:space:]]//g')
    if grep -qxF "$p" "$w/installed"; then ok=1; fi
  done
  [ "$ok" = 1 ] || fail "Depends '$d' is not an installed package"
done
for lib in libc6 libstdc++6 libyaml-cpp0.7 libzmq5 libsqlite3-0 libsodium23 libucx0; do
  [[ ",$depends" == *", $lib"* || ",$depends" == *",$lib"* ]] || fail "Depends lacks $lib: $depends"
done
echo "ok: Depends: $depends"

dpkg-deb -c "$deb" | awk '{print $6}' | sed 's|^\./||' >"$w/contents"
for f in "${expect_runtime[@]}"; do
  grep -qxF "$f" "$w/contents" || fail "ringmaster deb lacks $f"
done
echo "ok: the ringmaster deb holds all ${#expect_runtime[@]} expected files"
if [ ${#expect_cuda[@]} -gt 0 ]; then
  cdeb="$w/out/ringmaster-cuda_${version}_${arch}.deb"
  [ -f "$cdeb" ] || fail "no ringmaster-cuda_${version}_${arch}.deb"
  [[ "$(field "$cdeb" Depends)" == *"ringmaster (= $version)"* ]] || fail "ringmaster-cuda Depends: $(field "$cdeb" Depends)"
  # The listing once, then each name in it (a `| grep -q` pipeline under pipefail fails when grep
  # stops reading early and the writer gets SIGPIPE).
  cuda_files=$(dpkg-deb -c "$cdeb" | awk '{print $6}' | sed 's|^\./||')
  for f in "${expect_cuda[@]}"; do
    grep -qxF "$f" <<<"$cuda_files" || fail "ringmaster-cuda deb lacks $f"
  done
  echo "ok: the ringmaster-cuda deb holds all ${#expect_cuda[@]} expected files"
fi

if command -v lintian >/dev/null; then
  # Errors fail the test; warnings are listed in docs/operator-guide.md ("The Debian package").
  lintian --fail-on error "$w"/out/*.deb \
    >"$w/lintian.log" 2>&1 || { cat "$w/lintian.log"; fail "lintian reports errors"; }
  echo "ok: lintian: no errors ($(grep -c '^W:' "$w/lintian.log" || true) warnings)"
else
  echo "lintian not installed: skipped"
fi

# A fresh root with an empty dpkg database, as a container image would start. --unpack, not -i:
# configuring would run the postinst (ldconfig) chrooted into a root that has no shell;
# --force-depends: the libraries are the host's (checked above against the installed packages).
root="$w/root"
mkdir -p "$root/var/lib/dpkg/info" "$root/var/lib/dpkg/updates"
: >"$root/var/lib/dpkg/status"
dpkg --root="$root" --force-not-root --force-depends --log=/dev/null --unpack "$deb" \
  >"$w/dpkg.log" 2>&1 || { cat "$w/dpkg.log"; fail "dpkg --root --unpack failed"; }
dpkg --root="$root" -s ringmaster | grep -q "^Status: install ok unpacked" \
  || fail "dpkg does not list ringmaster as unpacked in $root"
[ "$(dpkg --root="$root" -L ringmaster | grep -c '^/usr/bin/ring')" = 4 ] \
  || fail "dpkg -L ringmaster does not list the four programs"
echo "ok: dpkg unpacked the package into a fresh root"

ring_check_no_build_paths "$root" "$(cd "$build" && pwd -P)"
ring_run_installed "$root/usr/bin" "$root/usr/share/ringmaster/examples" "$w/run" \
  "$(cd "$build" && pwd -P)" "$(cd "$src" && pwd -P)"
