// The parent's own cpu_test: a target name percpu must leave to its parent.
#include <cstdio>

int main() {
  std::puts("parent cpu_test: ok");
  return 0;
}
