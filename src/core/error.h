// Errors: one exception type carrying what went wrong and where. Library code
// throws; only the CLI and the server decide what an error means to a user.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace kestrel {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

namespace detail {
// Concatenates any streamable arguments into one message.
template <typename... Args>
std::string concat(const Args&... args) {
  std::ostringstream out;
  (out << ... << args);
  return out.str();
}
[[noreturn]] void throw_check(const char* cond, const char* file, int line, const std::string& msg);
}  // namespace detail

}  // namespace kestrel

// KESTREL_CHECK(cond, "tensor ", name, " has ", n, " rows") throws kestrel::Error
// with the message and the source location when cond is false.
#define KESTREL_CHECK(cond, ...)                                              \
  do {                                                                        \
    if (!(cond)) [[unlikely]]                                                 \
      ::kestrel::detail::throw_check(#cond, __FILE__, __LINE__,               \
                                     ::kestrel::detail::concat(__VA_ARGS__)); \
  } while (0)

// KESTREL_FAIL("...") throws unconditionally (for user-facing errors: no location).
#define KESTREL_FAIL(...) throw ::kestrel::Error(::kestrel::detail::concat(__VA_ARGS__))
