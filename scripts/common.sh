# Shared by scripts/*.sh: build configuration. Source it; do not run it.
RING_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
RING_BUILD="${RING_BUILD:-$RING_ROOT/build}"
RING_JOBS="${RING_JOBS:-2}"

# Configures (once) and builds everything in $RING_BUILD. CUDA code is compiled when nvcc is
# present (/usr/local/cuda), never run here; nothing links the CUDA driver. Arguments are cache
# options (-DNAME=VALUE): used at the first configure, and applied to an existing build only when
# RING_RECONFIGURE=1 (test.sh turns the tests on in a build the demo configured without them).
ring_build() {
  if [ -z "${CUDACXX:-}" ] && [ -x /usr/local/cuda/bin/nvcc ]; then
    export CUDACXX=/usr/local/cuda/bin/nvcc
  fi
  if [ ! -f "$RING_BUILD/build.ninja" ]; then
    echo "== configure ($RING_BUILD)"
    cmake -S "$RING_ROOT" -B "$RING_BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release "$@" \
      >"$RING_BUILD.configure.log" 2>&1 || { cat "$RING_BUILD.configure.log"; return 1; }
    grep "ringmaster:" "$RING_BUILD.configure.log" || true
  elif [ $# -gt 0 ] && [ "${RING_RECONFIGURE:-0}" = 1 ]; then
    cmake -S "$RING_ROOT" -B "$RING_BUILD" "$@" >"$RING_BUILD.configure.log" 2>&1 || {
      cat "$RING_BUILD.configure.log"; return 1; }
  fi
  echo "== build (-j$RING_JOBS)"
  cmake --build "$RING_BUILD" -j "$RING_JOBS"
}
