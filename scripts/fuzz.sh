#!/usr/bin/env bash
# Fuzzes the job spec parser with libFuzzer (clang, ASan + UBSan).
#
#   scripts/fuzz.sh                 # 300 s
#   scripts/fuzz.sh --seconds 30 --seed 1   # a short, repeatable run (scripts/test.sh does this)
#
# The corpus starts from configs/ and tests/fuzz/corpus/; new interesting inputs go to
# build-fuzz/corpus (not committed). A crash leaves crash-* in build-fuzz/: add it to
# tests/fuzz/corpus/ once fixed, so fuzz_replay_test keeps it fixed.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=300
seed=0   # 0: libFuzzer picks one (exploration); CI passes a fixed one, so a run is repeatable
while [ $# -gt 0 ]; do
  case "$1" in
    --seconds) seconds="$2"; shift 2 ;;
    --seed) seed="$2"; shift 2 ;;
    *) echo "usage: $0 [--seconds N] [--seed N]" >&2; exit 2 ;;
  esac
done
./scripts/install-deps.sh
flags="-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined -g -O1"
if [ ! -f build-fuzz/build.ninja ]; then
  CC=clang CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DRING_FUZZ=ON -DRING_WITH_CUDA=OFF -DRING_BUILD_BENCH=OFF \
    -DCMAKE_C_FLAGS="$flags" -DCMAKE_CXX_FLAGS="$flags" >/dev/null
fi
ninja -C build-fuzz -j2 spec_fuzz >/dev/null
mkdir -p build-fuzz/corpus build-fuzz/seeds
find configs tests/fuzz/corpus -type f -exec cp -t build-fuzz/seeds {} + 2>/dev/null || true
cd build-fuzz
echo "fuzz: spec parser for ${seconds}s"
UBSAN_OPTIONS=halt_on_error=1 ./tests/fuzz/spec_fuzz -max_total_time="$seconds" -seed="$seed" -max_len=4096 \
  -timeout=30 -rss_limit_mb=2048 -print_final_stats=1 corpus seeds 2>fuzz.log || {
  tail -n 40 fuzz.log
  echo "fuzz: FAILED (see build-fuzz/fuzz.log and build-fuzz/crash-*)" >&2
  exit 1
}
grep -E "stat::number_of_executed_units|stat::peak_rss_mb" fuzz.log | sed 's/^/fuzz: /'
echo "fuzz: no crash in ${seconds}s"
