// Entry points of a transport plugin are called through a C ABI: a C++ exception must not cross
// it (that is undefined behaviour, and in practice std::terminate or a crash in the caller).
// NoThrow<SetError, F>::call has F's signature, is noexcept, and turns any exception F lets out
// into RING_TRANSPORT_ERR_INTERNAL with the exception's text in last_error: the comm's when the
// first argument is a comm, otherwise the plugin's thread-local one (through SetError).
#pragma once

#include <exception>
#include <string>
#include <tuple>
#include <type_traits>

#include "plugins/transport/transport.h"

namespace ring::transport {

template <void (*SetError)(std::string), auto F>
struct NoThrow;

template <void (*SetError)(std::string), typename... A, ring_transport_status_t (*F)(A...)>
struct NoThrow<SetError, F> {
  static ring_transport_status_t call(A... a) noexcept {
    const char* what = "unknown exception";
    try {
      return F(a...);
    } catch (const std::exception& e) {
      what = e.what();
      return record(what, a...);
    } catch (...) {
      return record(what, a...);
    }
  }

 private:
  static ring_transport_status_t record(const char* what, A... a) noexcept {
    try {
      std::string m = std::string("internal error (exception inside the plugin): ") + what;
      if constexpr (sizeof...(A) > 0) {
        auto first = std::get<0>(std::forward_as_tuple(a...));
        if constexpr (std::is_same_v<decltype(first), ring_transport_comm_t*>) {
          if (first) {
            first->last_error = std::move(m);
            return RING_TRANSPORT_ERR_INTERNAL;
          }
        }
      }
      SetError(std::move(m));
    } catch (...) {
      // Out of memory while recording: the status alone still says what kind of failure.
    }
    return RING_TRANSPORT_ERR_INTERNAL;
  }
};

}  // namespace ring::transport
