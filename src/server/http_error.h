// The one place an error's kind becomes an HTTP status and TGI's error_type.
#pragma once

#include <string>

#include "core/error.h"

namespace kestrel::server {

struct HttpStatus {
  int status;              // 4xx for a client's mistake, 503 while shutting down, 500 else
  const char* error_type;  // TGI's error_type: "validation", "overloaded", ...
};

HttpStatus http_status(ErrorKind kind);

// A ValidationError's message for the client: TGI's "Input validation error: " before a 422's.
std::string validation_message(const ValidationError& e);

}  // namespace kestrel::server
