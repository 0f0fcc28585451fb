// Test helper: the files tests hand to a program they run and read back.
#pragma once

#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

namespace percpu {
namespace test {

// The whole file as bytes; empty when it cannot be read.
inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// A new empty file of this process's own under $TMPDIR (else /tmp), named
// after `stem`; the caller removes it.
inline std::string temp_path(const char* stem) {
  const char* dir = std::getenv("TMPDIR");
  std::string path = std::string(dir != nullptr ? dir : "/tmp") + "/" + stem + "XXXXXX";
  const int fd = mkstemp(&path[0]);
  if (fd >= 0) close(fd);
  return path;
}

}  // namespace test
}  // namespace percpu
