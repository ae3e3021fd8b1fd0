// Out-of-line part of KESTREL_CHECK, so that the macro stays small at every use.
#include "core/error.h"

#include <cstring>

namespace kestrel {

const char* error_kind_name(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::kInternal:
      return "internal";
    case ErrorKind::kInvalidArgument:
      return "invalid_argument";
    case ErrorKind::kMalformed:
      return "malformed";
    case ErrorKind::kNotFound:
      return "not_found";
    case ErrorKind::kMethodNotAllowed:
      return "method_not_allowed";
    case ErrorKind::kUnauthenticated:
      return "unauthenticated";
    case ErrorKind::kForbidden:
      return "forbidden";
    case ErrorKind::kTooLarge:
      return "too_large";
    case ErrorKind::kHeadersTooLarge:
      return "headers_too_large";
    case ErrorKind::kUnsupportedMediaType:
      return "unsupported_media_type";
    case ErrorKind::kOverloaded:
      return "overloaded";
    case ErrorKind::kConflict:
      return "conflict";
    case ErrorKind::kUnavailable:
      return "unavailable";
  }
  return "internal";
}

namespace detail {

void throw_check(const char* cond, const char* file, int line, const std::string& msg) {
  const char* base = std::strrchr(file, '/');
  std::ostringstream out;
  out << msg << " (check `" << cond << "` failed at " << (base ? base + 1 : file) << ":" << line
      << ")";
  throw Error(out.str());
}

}  // namespace detail
}  // namespace kestrel
