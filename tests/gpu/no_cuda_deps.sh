#!/usr/bin/env bash
# Checks the dynamic dependencies of built binaries:
#   --cpu FILE...   must need none of the CUDA driver, runtime, cuBLAS or NCCL (ldd, so also
#                   nothing pulled in indirectly): CPU-only machines run them.
#   --gpu FILE...   GPU libraries loaded on demand: may need libcudart/libcublas/libnccl, never
#                   libcuda.so (the driver; libcudart opens it itself when present).
# Exit 0 when every file passes; otherwise prints each offending file and dependency, exit 1.
set -u
mode=""
fail=0
for arg in "$@"; do
  case "$arg" in
    --cpu | --gpu) mode="$arg"; continue ;;
  esac
  if [[ -z "$mode" ]]; then
    echo "no_cuda_deps: give --cpu or --gpu before file names" >&2
    exit 2
  fi
  if [[ ! -e "$arg" ]]; then
    echo "no_cuda_deps: $arg: not built" >&2
    fail=1
    continue
  fi
  if [[ "$mode" == --cpu ]]; then
    bad=$(ldd "$arg" 2>&1 | grep -E 'libcuda\.so|libcudart|libcublas|libnccl|libcudnn' || true)
  else
    bad=$(readelf -d "$arg" | grep NEEDED | grep -E '\[libcuda\.so' || true)
  fi
  if [[ -n "$bad" ]]; then
    echo "no_cuda_deps: $arg ($mode) needs:" >&2
    echo "$bad" >&2
    fail=1
  else
    echo "ok $mode $arg"
  fi
done
exit $fail
