// Out-of-line part of KESTREL_CHECK, so that the macro stays small at every use.
#include "core/error.h"

#include <cstring>

namespace kestrel::detail {

void throw_check(const char* cond, const char* file, int line, const std::string& msg) {
  const char* base = std::strrchr(file, '/');
  std::ostringstream out;
  out << msg << " (check `" << cond << "` failed at " << (base ? base + 1 : file) << ":" << line
      << ")";
  throw Error(out.str());
}

}  // namespace kestrel::detail
