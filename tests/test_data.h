// Where the test fixtures live: $KESTREL_TEST_DATA when set (test binaries copied to another
// machine), else the source tree's tests/data as compiled in.
#pragma once

#include <cstdlib>
#include <string>

namespace kestrel::test {

inline std::string test_data_dir() {
  const char* env = std::getenv("KESTREL_TEST_DATA");
  return env && *env ? std::string(env) : std::string(KESTREL_TEST_DATA);
}

}  // namespace kestrel::test
