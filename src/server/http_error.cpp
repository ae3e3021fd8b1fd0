// Error kind -> HTTP status and error_type, for every reply the server makes.
#include "server/http_error.h"

namespace kestrel::server {

HttpStatus http_status(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::kInvalidArgument:
      return {422, "validation"};
    case ErrorKind::kMalformed:
      return {400, "bad_request"};
    case ErrorKind::kNotFound:
      return {404, "not_found"};
    case ErrorKind::kMethodNotAllowed:
      return {405, "method_not_allowed"};
    case ErrorKind::kUnauthenticated:
      return {401, "authentication"};
    case ErrorKind::kForbidden:
      return {403, "forbidden"};
    case ErrorKind::kTooLarge:
      return {413, "validation"};
    case ErrorKind::kHeadersTooLarge:
      return {431, "bad_request"};
    case ErrorKind::kUnsupportedMediaType:
      return {415, "bad_request"};
    case ErrorKind::kConflict:
      return {409, "conflict"};
    case ErrorKind::kOverloaded:
      return {429, "overloaded"};
    case ErrorKind::kUnavailable:
      return {503, "unavailable"};
    case ErrorKind::kInternal:
      return {500, "internal"};
  }
  return {500, "internal"};
}

std::string validation_message(const ValidationError& e) {
  if (e.kind() != ErrorKind::kInvalidArgument) return e.what();
  return std::string("Input validation error: ") + e.what();
}

}  // namespace kestrel::server
