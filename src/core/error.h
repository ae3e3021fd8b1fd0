// Errors: one exception type carrying what went wrong, where, and of what kind.
// Library code throws with the kind it knows (a request that breaks a rule, a
// name that is not there, a server that is shutting down); only the CLI and the
// server decide what a kind means to a user (the server: src/server/http_error.h).
#pragma once

#include <cstdint>
#include <sstream>
#include <stdexcept>
#include <string>

namespace kestrel {

// What kind of failure an Error is. The server maps each to one HTTP status in one place.
enum class ErrorKind : uint8_t {
  kInternal,              // a fault of the server or its files (500)
  kInvalidArgument,       // a request (field, id, size) that breaks a rule (422)
  kMalformed,             // bytes that do not parse as what they must be (400)
  kNotFound,              // a name (route, adapter) that is not there (404)
  kMethodNotAllowed,      // a route asked with the wrong method (405)
  kUnauthenticated,       // no or a wrong API key (401)
  kForbidden,             // a request the server's policy refuses (Host, Origin) (403)
  kTooLarge,              // a request body beyond its bound (413)
  kHeadersTooLarge,       // request headers beyond their bound (431)
  kUnsupportedMediaType,  // a POST body that is not application/json (415)
  kConflict,              // a name already taken (an adapter loaded under it) (409)
  kOverloaded,            // too much in flight now; retry later (429)
  kUnavailable,           // shutting down, engine stopped, a load that timed out (503)
};

// "internal", "invalid_argument", ...: for logs and tests.
const char* error_kind_name(ErrorKind kind);

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message, ErrorKind kind = ErrorKind::kInternal)
      : std::runtime_error(message), kind_(kind) {}
  explicit Error(const char* message, ErrorKind kind = ErrorKind::kInternal)
      : std::runtime_error(message), kind_(kind) {}
  ErrorKind kind() const { return kind_; }

 private:
  ErrorKind kind_;
};

// A request the engine or the server cannot serve as asked (a bad parameter, a prompt too long):
// the client's mistake, never the server's. Names the request field at fault.
class ValidationError : public Error {
 public:
  ValidationError(std::string field, const std::string& message,
                  ErrorKind kind = ErrorKind::kInvalidArgument)
      : Error(message, kind), field_(std::move(field)) {}
  const std::string& field() const { return field_; }

 private:
  std::string field_;
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
// KESTREL_FAIL_AS(ErrorKind::kNotFound, "...") throws an Error of that kind.
#define KESTREL_FAIL_AS(kind, ...) \
  throw ::kestrel::Error(::kestrel::detail::concat(__VA_ARGS__), kind)
