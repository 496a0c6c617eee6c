#!/usr/bin/env bash
# Installs the Debian packages ringmaster needs. Installs only what is missing; runs
# `apt-get update` at most once. Idempotent.
#
#   scripts/install-deps.sh            # everything: build, tests, benchmarks, fuzzing, packaging,
#                                      # the local Slurm cluster, the PyTorch reference
#   scripts/install-deps.sh --demo     # only what scripts/demo.sh needs: the compilers and the
#                                      # libraries ringmaster links (no database server, no Slurm,
#                                      # no munge, no PyTorch, no test frameworks)
#   RING_DEPS_QUIET=0 scripts/install-deps.sh   # show apt output
#
# One package per line, so that lists merge cleanly.
set -euo pipefail

DEMO_PACKAGES=(
  # toolchain
  build-essential
  cmake
  ninja-build
  pkg-config
  # libraries the code links against
  libyaml-cpp-dev
  libcli11-dev
  libfmt-dev
  libspdlog-dev
  nlohmann-json3-dev
  libkainjow-mustache-dev
  libopenblas-dev
  libopenblas0-pthread
  libdnnl-dev
  libucx-dev
  libzmq3-dev
  cppzmq-dev
  libsodium-dev
  libsqlite3-dev
  libboost-dev
  libxxhash-dev
  libzstd-dev
  zlib1g-dev
  libhwloc-dev
  libsentencepiece-dev
  libpcre2-dev
)

FULL_PACKAGES=(
  git
  ucx-utils
  sqlite3
  # tests and benchmarks
  libgtest-dev
  libgmock-dev
  libbenchmark-dev
  python3
  python3-numpy
  python3-torch
  python3-yaml
  # ring-coord's web endpoint tests: a Prometheus server scraping /metrics (and promtool), and a
  # headless browser opening the dashboard
  prometheus
  chromium
  # SentencePiece: spm_train and the Python reference for the tokenizer tests and bench
  sentencepiece
  python3-sentencepiece
  # tokenizer.json parity tests: Hugging Face's pure-JS tokenizers under node (npm, below;
  # Debian's nodejs has npm as its own package, NodeSource's nodejs conflicts with it)
  nodejs
  # fuzzing (libFuzzer through clang)
  clang
  libclang-rt-14-dev
  libomp-14-dev
  # the function-length check (cmake/check_function_length.sh)
  universal-ctags
  # man pages, the Debian package and its checks (tests/install)
  help2man
  dpkg-dev
  file
  fakeroot
  lintian
  # local Slurm cluster (slurm/), SPANK plugin
  slurm-wlm
  slurmctld
  slurmd
  slurm-client
  libslurm-dev
  munge
  libmunge-dev
  # optional slurmdbd accounting for the local cluster (slurm/cluster.sh --with-dbd)
  slurmdbd
  slurm-wlm-mysql-plugin
  mariadb-server
  mariadb-client
  # process tools used by tests (pkill/pgrep, ps)
  procps
  psmisc
  util-linux
)

case "${1:-}" in
  --demo) PACKAGES=("${DEMO_PACKAGES[@]}") ;;
  "") PACKAGES=("${DEMO_PACKAGES[@]}" "${FULL_PACKAGES[@]}") ;;
  *) echo "install-deps: unknown argument '$1' (use --demo, or nothing for everything)" >&2; exit 2 ;;
esac

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

# The reference of the tokenizer.json parity tests (tests/worker/bpe_tokenizer_test.cc):
# @huggingface/tokenizers from the npm registry, pinned, into a fixed cache outside the tree
# (RING_NPM_CACHE; the test reads RING_HF_TOKENIZERS_JS when it is elsewhere). Not for --demo.
RING_NPM_CACHE=${RING_NPM_CACHE:-/var/cache/ringmaster/npm}
RING_HF_TOKENIZERS=@huggingface/tokenizers@0.2.0
install_npm_reference() {
  [ "${1:-}" = "--demo" ] && return 0
  [ -f "$RING_NPM_CACHE/node_modules/@huggingface/tokenizers/dist/tokenizers.mjs" ] && return 0
  if ! command -v npm >/dev/null 2>&1 && \
     ! ${SUDO:-} apt-get -qq install -y --no-install-recommends npm >/dev/null 2>&1; then
    echo "install-deps: npm missing; the tokenizer.json parity tests will skip" >&2
    return 0
  fi
  local sudo_npm=""
  mkdir -p "$RING_NPM_CACHE" 2>/dev/null || sudo_npm="${SUDO:-sudo}"
  echo "install-deps: npm install $RING_HF_TOKENIZERS into $RING_NPM_CACHE"
  $sudo_npm mkdir -p "$RING_NPM_CACHE"
  if ! $sudo_npm npm install --no-audit --no-fund --prefix "$RING_NPM_CACHE" "$RING_HF_TOKENIZERS" \
      >/dev/null 2>&1; then
    echo "install-deps: npm install $RING_HF_TOKENIZERS failed; the parity tests will skip" >&2
  fi
}

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#PACKAGES[@]} packages present"
  install_npm_reference "${1:-}"
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then SUDO="sudo"; else
    echo "install-deps: missing packages (${missing[*]}) and not root; install them or run as root" >&2
    exit 1
  fi
fi

echo "install-deps: installing ${#missing[@]} package(s): ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
quiet=(-qq)
[ "${RING_DEPS_QUIET:-1}" = "0" ] && quiet=()
log=$(mktemp /tmp/ring-install-deps.XXXXXX.log)
if ! { $SUDO apt-get "${quiet[@]}" update && \
       $SUDO apt-get "${quiet[@]}" install -y --no-install-recommends "${missing[@]}"; } >"$log" 2>&1; then
  echo "install-deps: apt-get failed; last lines of $log:" >&2
  tail -n 30 "$log" >&2
  exit 1
fi
rm -f "$log"
install_npm_reference "${1:-}"
# The Debian slurm packages start their services on install; the project runs its own cluster
# (slurm/) with its own configuration, so stop the distribution's units if they were started.
if [ "${1:-}" != "--demo" ] && command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
  $SUDO systemctl disable --now slurmctld slurmd >/dev/null 2>&1 || true
fi
echo "install-deps: done"
