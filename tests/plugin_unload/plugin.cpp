// A plugin that counts from a few threads and from its caller's thread. The
// loader (unload_test.cpp) dlclose's it afterwards. Built twice: linking
// libpercpu.a (percpu_test_plugin) and linking a shared percpu
// (percpu_test_plugin_shared), where the counter's inline sections are still
// this plugin's code and descriptors.
#include <thread>
#include <vector>

#include "percpu/counter.hpp"
#include "percpu/cpu.hpp"

namespace {
percpu::counter g_plugin_counter;
}

extern "C" __attribute__((visibility("default"))) long plugin_count(int threads, int adds) {
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([adds] {
      for (int i = 0; i < adds; ++i) g_plugin_counter.increment();
    });
  }
  for (auto& w : workers) w.join();
  // The caller's thread last, with nothing that blocks afterwards: its rseq
  // area (glibc's, or the one percpu registers in this plugin's TLS) still
  // points at this plugin's critical-section descriptor when the plugin
  // returns, until the kernel next looks at it.
  for (int i = 0; i < adds; ++i) g_plugin_counter.increment();
  return g_plugin_counter.load();
}
