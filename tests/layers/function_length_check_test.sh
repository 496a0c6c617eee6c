#!/usr/bin/env bash
# cmake/check_function_length.sh over a made-up tree with a limit of 10 lines: a short function
# passes, a long one not listed fails naming file, function and length, a long listed one passes,
# and a listed one that is short (or gone) fails asking for its line to be removed.
#   function_length_check_test.sh CHECK_SCRIPT
set -euo pipefail
check=$1
w=$(mktemp -d /tmp/ring-fnlen.XXXXXX)
trap 'rm -rf "$w"' EXIT
mkdir -p "$w/cmake" "$w/common" "$w/tests"
cp "$check" "$w/cmake/"
echo "common:" >"$w/cmake/layers.txt"
body() { for ((i = 0; i < $1; i++)); do echo "  x += $i;"; done; }
{
  echo "int short_one(int x) {"; body 3; echo "  return x;"; echo "}"
  echo "int long_unlisted(int x) {"; body 12; echo "  return x;"; echo "}"
  echo "int long_listed(int x) {"; body 12; echo "  return x;"; echo "}"
  echo "int listed_but_short(int x) {"; body 2; echo "  return x;"; echo "}"
} >"$w/common/a.cc"
{ echo "int in_tests_long(int x) {"; body 30; echo "  return x;"; echo "}"; } >"$w/tests/t.cc"
printf '%s\n' "# comment" "common/a.cc long_listed split" "common/a.cc listed_but_short split" \
  >"$w/cmake/long_functions.txt"
set +e
out=$(bash "$w/cmake/check_function_length.sh" "$w" 10 2>&1)
rc=$?
set -e
fail() { echo "FAIL: $*"; echo "$out"; exit 1; }
[ $rc -eq 1 ] || fail "expected exit 1, got $rc"
grep -q "common/a.cc: long_unlisted is 15 lines, over the limit of 10: split it" <<<"$out" || fail "long_unlisted not named"
grep -q "common/a.cc: listed_but_short is no longer over 10 lines" <<<"$out" || fail "listed_but_short not named"
! grep -q "long_listed is\|short_one\|in_tests_long" <<<"$out" || fail "an allowed function was named"
# Without the stale line, the tree passes.
printf '%s\n' "common/a.cc long_listed split" "common/a.cc long_unlisted split" >"$w/cmake/long_functions.txt"
out=$(bash "$w/cmake/check_function_length.sh" "$w" 10 2>&1) || fail "a tree within its list failed"
echo "function_length_check_test: ok"
