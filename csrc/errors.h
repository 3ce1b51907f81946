// How the shims hand a C++ exception to Rust: as a malloc'ed message (freed with ablate_free_error), never
// as an exception crossing the FFI boundary.
#pragma once
#include <c10/util/Exception.h>
#include <cstring>
#include <exception>

namespace ablate {
// c10's errors carry a C++ backtrace after the message; the message is what a researcher can act on.
inline char *error_of(const std::exception &e) {
  if (const auto *c10_error = dynamic_cast<const c10::Error *>(&e)) {
    return strdup(c10_error->what_without_backtrace());
  }
  return strdup(e.what());
}
} // namespace ablate
