// Device memory owned through a Backend (host memory on the CPU backend), and a status check.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

#include "kernels/backend.h"
#include "worker/model/config.h"

namespace ring::model {

// Throws ModelError("<what>: <status>") unless s is kOk.
inline void check_status(kernels::Status s, const char* what) {
  if (s != kernels::Status::kOk) {
    throw ModelError(std::string(what) + " failed: " + kernels::status_string(s));
  }
}

// An array of T in backend memory. Grows only (resize to a smaller count keeps the memory), so
// buffers are allocated once per shape and reused across steps.
template <typename T>
class DeviceArray {
 public:
  DeviceArray() = default;
  DeviceArray(kernels::Backend* backend, int64_t count) { resize(backend, count); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  DeviceArray(DeviceArray&& o) noexcept { swap(o); }
  DeviceArray& operator=(DeviceArray&& o) noexcept {
    if (this != &o) {
      release();
      swap(o);
    }
    return *this;
  }
  ~DeviceArray() { release(); }

  void resize(kernels::Backend* backend, int64_t count) {
    backend_ = backend;
    if (count <= capacity_) {
      count_ = count;
      return;
    }
    release();
    void* p = nullptr;
    check_status(backend->alloc(static_cast<size_t>(count) * sizeof(T), &p), "alloc");
    backend_ = backend;
    data_ = static_cast<T*>(p);
    capacity_ = count_ = count;
  }
  void release() {
    if (data_ != nullptr && backend_ != nullptr) backend_->free(data_);
    data_ = nullptr;
    capacity_ = count_ = 0;
  }

  T* data() { return data_; }
  const T* data() const { return data_; }
  int64_t size() const { return count_; }
  size_t bytes() const { return static_cast<size_t>(count_) * sizeof(T); }

 private:
  void swap(DeviceArray& o) {
    std::swap(backend_, o.backend_);
    std::swap(data_, o.data_);
    std::swap(count_, o.count_);
    std::swap(capacity_, o.capacity_);
  }
  kernels::Backend* backend_ = nullptr;
  T* data_ = nullptr;
  int64_t count_ = 0;
  int64_t capacity_ = 0;
};

}  // namespace ring::model
