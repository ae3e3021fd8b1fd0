// Errors the HTTP layer maps to a status: HttpError carries its status and
// TGI's error_type; engine ValidationErrors become 422 "validation".
#pragma once

#include <string>

#include "core/error.h"

namespace kestrel::server {

class HttpError : public Error {
 public:
  HttpError(int status, std::string error_type, const std::string& message)
      : Error(message), status_(status), error_type_(std::move(error_type)) {}
  int status() const { return status_; }
  const std::string& error_type() const { return error_type_; }

 private:
  int status_;
  std::string error_type_;
};

}  // namespace kestrel::server
