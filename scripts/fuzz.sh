#!/usr/bin/env bash
# Fuzzes ringmaster's parsers with libFuzzer (clang, ASan + UBSan), one target after the other.
#
#   scripts/fuzz.sh                           # every target, 300 s in all
#   scripts/fuzz.sh --seconds 40 --seed 1     # a short, repeatable run (scripts/test.sh does this)
#   scripts/fuzz.sh --target checkpoint --seconds 120
#
# Targets (tests/fuzz/targets.h, docs/testing.md "Fuzzing"): spec, protocol, worker_control,
# checkpoint, shm, safetensors, http, hf_config. --seconds is the total, split evenly between the targets run.
# Each target starts from tests/fuzz/corpus/<target>/ (spec: also configs/); new interesting
# inputs go to build-fuzz/corpus/<target> (not committed). A crash leaves crash-* in
# build-fuzz/<target>/: add it to tests/fuzz/corpus/<target>/ once fixed, so fuzz_replay_test
# keeps it fixed.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=300
seed=0   # 0: libFuzzer picks one (exploration); CI passes a fixed one, so a run is repeatable
all_targets="spec protocol worker_control checkpoint shm safetensors http hf_config"
targets=""
while [ $# -gt 0 ]; do
  case "$1" in
    --seconds) seconds="$2"; shift 2 ;;
    --seed) seed="$2"; shift 2 ;;
    --target) targets="$targets $2"; shift 2 ;;
    *) echo "usage: $0 [--seconds N] [--seed N] [--target NAME]..." >&2; exit 2 ;;
  esac
done
targets="${targets# }"
targets="${targets:-$all_targets}"
for t in $targets; do
  case " $all_targets " in *" $t "*) ;; *) echo "fuzz: unknown target '$t' (one of: $all_targets)" >&2; exit 2 ;; esac
done
set -- $targets
per=$(( seconds / $# ))
[ "$per" -ge 1 ] || per=1

./scripts/install-deps.sh
flags="-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined -g -O1"
if [ ! -f build-fuzz/build.ninja ]; then
  CC=clang CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DRING_FUZZ=ON -DRING_WITH_CUDA=OFF -DRING_BUILD_BENCH=OFF \
    -DCMAKE_C_FLAGS="$flags" -DCMAKE_CXX_FLAGS="$flags" >/dev/null
fi
ninja -C build-fuzz -j"${RING_JOBS:-2}" $(for t in $targets; do echo "${t}_fuzz"; done) >/dev/null

failed=""
for t in $targets; do
  work=build-fuzz/$t
  mkdir -p "$work" build-fuzz/corpus/$t "$work/seeds"
  rm -f "$work"/seeds/*
  cp -t "$work/seeds" tests/fuzz/corpus/$t/* 2>/dev/null || true
  [ "$t" = spec ] && find configs -type f -exec cp -t "$work/seeds" {} +
  echo "fuzz: $t for ${per}s"
  # Runs inside its directory so crash-*/timeout-* land there.
  if ! (cd "$work" && UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
        ../tests/fuzz/${t}_fuzz -max_total_time="$per" -seed="$seed" -max_len=4096 -timeout=30 \
        -rss_limit_mb=2048 -print_final_stats=1 ../corpus/$t seeds >fuzz.log 2>&1); then
    tail -n 40 "$work/fuzz.log"
    echo "fuzz: $t FAILED (see $work/fuzz.log and $work/crash-*)" >&2
    failed="$failed $t"
    continue
  fi
  grep -E "stat::number_of_executed_units|stat::peak_rss_mb" "$work/fuzz.log" | sed "s/^/fuzz: $t: /"
done
if [ -n "$failed" ]; then
  echo "fuzz: FAILED:$failed" >&2
  exit 1
fi
echo "fuzz: no finding in ${seconds}s ($targets)"
