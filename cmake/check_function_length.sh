#!/usr/bin/env bash
# No product function is longer than LIMIT lines (default 200), except those named in
# cmake/long_functions.txt; one named there that is no longer too long fails too, so the list only
# shrinks. Product code: the top-level parts of cmake/layers.txt (not tests/ or bench/). Function
# extents come from Universal Ctags (its `end` field).
#   check_function_length.sh SOURCE_DIR [LIMIT]
set -euo pipefail
root=$1 limit=${2:-200}
cd "$root"
command -v ctags >/dev/null && ctags --version 2>/dev/null | grep -q "Universal Ctags" ||
  { echo "check_function_length: Universal Ctags is needed (apt-get install universal-ctags)" >&2; exit 2; }
parts=$(grep -E '^[a-z_]+:' cmake/layers.txt | cut -d: -f1)
# "LINES FILE FUNCTION" for every function over the limit; unnamed lambdas as "(lambda)".
long=$(ctags -R --languages=C++,C --kinds-C++=f --kinds-C=f --fields=+ne -x \
         --_xformat="%{end} %{line} %F %N" $parts 2>/dev/null |
       awk -v lim="$limit" '$1 != "-" && $1 - $2 + 1 > lim {
         name = $4; if (name ~ /^__anon/) name = "(lambda)"; print $1 - $2 + 1, $3, name }' |
       sort -u -k2,3)
allowed=$(grep -vE '^\s*(#|$)' cmake/long_functions.txt | awk '{print $1, $2}')
status=0
while read -r n file fn; do
  [ -z "$n" ] && continue
  if ! grep -qxF "$file $fn" <<<"$allowed"; then
    echo "$file: $fn is $n lines, over the limit of $limit: split it (cmake/long_functions.txt lists the only exceptions)"
    status=1
  fi
done <<<"$long"
while read -r file fn; do
  [ -z "$file" ] && continue
  if ! awk '{print $2, $3}' <<<"$long" | grep -qxF "$file $fn"; then
    echo "$file: $fn is no longer over $limit lines (or is gone): remove its line from cmake/long_functions.txt"
    status=1
  fi
done <<<"$allowed"
[ $status -eq 0 ] && echo "check_function_length: no function over $limit lines but the $(wc -l <<<"$allowed") listed"
exit $status
