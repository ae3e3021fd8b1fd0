// Runs the kestrel binary (test_data.h's kestrel_binary()) for the CLI tests.
#pragma once

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "../test_data.h"

namespace kestrel::test {

struct CmdResult {
  int status = -1;  // exit status, -1 if it did not exit normally
  std::string out;  // stdout, and stderr too with with_stderr
};

inline CmdResult run_kestrel(const std::string& args, bool with_stderr) {
  const std::string cmd = kestrel_binary() + " " + args + (with_stderr ? " 2>&1" : " 2>/dev/null");
  CmdResult r;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  const int st = pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

}  // namespace kestrel::test
