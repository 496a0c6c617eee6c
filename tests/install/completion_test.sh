#!/usr/bin/env bash
# Bash completion of ringctl (completion/ringctl.bash), driven the way bash drives it: COMP_WORDS
# and COMP_CWORD set, the registered function called, COMPREPLY read.
#   completion_test.sh RINGCTL COMPLETION_FILE
set -euo pipefail
ringctl=$1 completion=$2
fail() { echo "FAIL: $*" >&2; exit 1; }

w=$(mktemp -d /tmp/ring-completion-test.XXXXXX)
trap 'rm -rf "$w"' EXIT

# shellcheck source=/dev/null
source "$completion"
fn=$(complete -p ringctl | sed -E 's/.*-F ([^ ]+).*/\1/')
[ -n "$fn" ] || fail "the file registers no completion function for ringctl"

# complete WORD... : completes the last word; prints COMPREPLY one per line.
complete_words() {
  COMP_WORDS=("$@")
  COMP_CWORD=$(($# - 1))
  COMP_LINE="$*"
  COMP_POINT=${#COMP_LINE}
  COMPREPLY=()
  "$fn" "${COMP_WORDS[0]}" "${COMP_WORDS[COMP_CWORD]}" "${COMP_WORDS[COMP_CWORD - 1]}"
  printf '%s\n' "${COMPREPLY[@]}"
}
oneline() { tr '\n' ' ' <<<"$1"; }
expect_exactly() {  # expect_exactly "what" "got" "want..." (order-insensitive)
  local what=$1 got; got=$(sort <<<"$2" | grep -v '^$' || true); shift 2
  local want; want=$(printf '%s\n' "$@" | sort)
  [ "$got" = "$want" ] || fail "$what: got [$(oneline "$got")], want [$(oneline "$want")]"
  echo "ok: $what -> $(oneline "$got")"
}
has() { grep -qxF -- "$2" <<<"$1" || fail "$3: '$2' not offered (got: $(oneline "$1"))"; }
lacks() { ! grep -qxF -- "$2" <<<"$1" || fail "$3: '$2' offered"; }

# Subcommands: the ones `ringctl --help` lists that start with "st".
want=$("$ringctl" --help | awk 'tolower($0) ~ /^subcommands:/ {f=1; next} /^[^ ]/ {f=0} f && $1 ~ /^st/ {print $1}')
[ -n "$want" ] || fail "ringctl --help lists no subcommand starting with st"
# shellcheck disable=SC2086
expect_exactly "ringctl st<TAB>" "$(complete_words "$ringctl" st)" $want
has "$(complete_words "$ringctl" "")" validate "ringctl <TAB>"
has "$(complete_words "$ringctl" "")" run "ringctl <TAB>"

# A subcommand's flags: plan's own, not run's.
got=$(complete_words "$ringctl" plan --)
for f in --json --check --what-if --help; do has "$got" "$f" "ringctl plan --<TAB>"; done
lacks "$got" --steps "ringctl plan --<TAB>"
echo "ok: ringctl plan --<TAB> -> $(oneline "$got")"
got=$(complete_words "$ringctl" run --st)
expect_exactly "ringctl run --st<TAB>" "$got" --steps
# Global flags before the subcommand do not hide it.
got=$(complete_words "$ringctl" -h plan --wh)
expect_exactly "ringctl -h plan --wh<TAB>" "$got" --what-if

# Spec arguments: yaml files and directories only.
mkdir -p "$w/specs/sub"
touch "$w/specs/a.yaml" "$w/specs/b.yml" "$w/specs/notes.txt"
got=$(complete_words "$ringctl" validate "$w/specs/")
expect_exactly "ringctl validate DIR/<TAB>" "$got" "$w/specs/a.yaml" "$w/specs/b.yml" "$w/specs/sub"

# tokenize: its flags, the two dtypes, *.model files for --tokenizer.
got=$(complete_words "$ringctl" tokenize --)
for f in --tokenizer --dtype --output --threads; do has "$got" "$f" "ringctl tokenize --<TAB>"; done
expect_exactly "ringctl tokenize --dtype <TAB>" "$(complete_words "$ringctl" tokenize --dtype "")" \
  uint16 uint32
touch "$w/specs/tok.model"
expect_exactly "ringctl tokenize --tokenizer DIR/t<TAB>" \
  "$(complete_words "$ringctl" tokenize --tokenizer "$w/specs/t")" "$w/specs/tok.model"

# Job ids come from `ringctl status`: a stand-in ringctl prints a status table.
cat >"$w/ringctl" <<EOS
#!/bin/sh
case "\$1" in
  status) printf 'JOBID  NAME  USER  STATE\n    7  tiny  ada   running\n   12  big   ada   failed\n' ;;
  *) exec "$ringctl" "\$@" ;;
esac
EOS
chmod +x "$w/ringctl"
expect_exactly "ringctl cancel <TAB>" "$(complete_words "$w/ringctl" cancel "")" 7 12
expect_exactly "ringctl logs 1<TAB>" "$(complete_words "$w/ringctl" logs 1)" 12
echo "all completion checks passed"
