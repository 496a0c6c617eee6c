#!/usr/bin/env bash
# GPU check, for a short GPU lease: builds only the CUDA backend, the gpu tests and the
# GPU benchmark for the local GPU (all cores), runs the gpu tests, then the benchmark, which
# prints attention forward/backward TFLOP/s against cuBLAS bf16 GEMM TFLOP/s and the offload
# path's device-to-host GB/s against plain cudaMemcpy, all measured in the same run. Also checks
# that no CPU binary needs a CUDA library. Budget: under 6 minutes on one H200, build included.
#
#   ./scripts/gpu-check.sh            # build dir: build-gpu (RING_BUILD overrides)
#   RING_BENCH_ARGS="--len 8192" ./scripts/gpu-check.sh
#
# Exit status: 0 all passed; 1 a build, test or benchmark failed; 2 no GPU here.
set -euo pipefail
source "$(dirname "$0")/common.sh"
cd "$RING_ROOT"
build="${RING_BUILD_GPU:-$RING_ROOT/build-gpu}"
start=$(date +%s)

if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "gpu-check: no NVIDIA GPU or driver here (nvidia-smi -L failed); nothing to check" >&2
  exit 2
fi
nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv,noheader
export CUDACXX="${CUDACXX:-/usr/local/cuda/bin/nvcc}"
[ -x "$CUDACXX" ] || { echo "gpu-check: no nvcc at $CUDACXX (set CUDACXX)" >&2; exit 1; }

echo "== configure ($build, CUDA architectures of this GPU)"
gen=()
command -v ninja >/dev/null 2>&1 && gen=(-G Ninja)
if [ ! -f "$build/CMakeCache.txt" ]; then
  cmake -S . -B "$build" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DRING_WITH_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=native -DRING_BUILD_TESTS=ON -DRING_BUILD_BENCH=ON \
    >"$build.configure.log" 2>&1 || { cat "$build.configure.log"; exit 1; }
fi
jobs=$(nproc)
targets=(ring_kernels_cuda cuda_backend_test full_shard_gpu_test generate_cuda_test cuda_bench ops_test)
if grep -q "ring_transport_nccl" "$build/CMakeFiles/TargetDirectories.txt" 2>/dev/null; then
  targets+=(ring_transport_nccl nccl_transport_test)
fi
echo "== build (-j$jobs): ${targets[*]}"
cmake --build "$build" -j "$jobs" --target "${targets[@]}"
echo "== build done in $(( $(date +%s) - start )) s"

echo "== gpu tests"
rc=0
(cd "$RING_ROOT" && timeout 180 "$build/tests/gpu/cuda_backend_test" --gtest_color=no) || rc=1
(cd "$RING_ROOT" && timeout 60 "$build/tests/gpu/full_shard_gpu_test" --gtest_color=no) || rc=1
(cd "$RING_ROOT" && timeout 120 "$build/tests/gpu/generate_cuda_test" --gtest_color=no) || rc=1
if [ -x "$build/tests/gpu/nccl_transport_test" ]; then
  (cd "$RING_ROOT" && timeout 60 "$build/tests/gpu/nccl_transport_test" --gtest_color=no) || rc=1
fi
echo "== CPU binaries need no CUDA library"
bins=("$build/tests/gpu/cuda_backend_test" "$build/tests/gpu/full_shard_gpu_test"
      "$build/tests/gpu/generate_cuda_test" "$build/tests/kernels/ops_test" "$build/bench/cuda_bench")
gpu_libs=("$build/lib/libring_kernels_cuda.so")
[ -f "$build/plugins/libring_transport_nccl.so" ] && gpu_libs+=("$build/plugins/libring_transport_nccl.so")
tests/gpu/no_cuda_deps.sh --cpu "${bins[@]}" --gpu "${gpu_libs[@]}" || rc=1

echo "== benchmark"
# shellcheck disable=SC2086
timeout 120 "$build/bench/cuda_bench" ${RING_BENCH_ARGS:-} || rc=1
echo "== gpu-check finished in $(( $(date +%s) - start )) s (status $rc)"
exit $rc
