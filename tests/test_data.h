// What the tests read from outside themselves, so that their binaries run on another machine:
// the fixtures ($KESTREL_TEST_DATA when set, else the source tree's tests/data as compiled in)
// and the kestrel binary ($KESTREL_BINARY when set, else the one this build made).
#pragma once

#include <cstdlib>
#include <string>

namespace kestrel::test {

inline std::string test_data_dir() {
  const char* env = std::getenv("KESTREL_TEST_DATA");
  return env && *env ? std::string(env) : std::string(KESTREL_TEST_DATA);
}

#ifdef KESTREL_BINARY
inline std::string kestrel_binary() {
  const char* env = std::getenv("KESTREL_BINARY");
  return env && *env ? std::string(env) : std::string(KESTREL_BINARY);
}
#endif

}  // namespace kestrel::test
