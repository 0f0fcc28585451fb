// Compiled with the project's flags and disassembled by check_fast_path.sh:
// each probe is what a user's call site of the inline function becomes.
#include "percpu/cpu.hpp"

extern "C" int percpu_probe_cpu_id() { return percpu::cpu_id(); }
extern "C" int percpu_probe_node_id() { return percpu::node_id(); }
extern "C" int percpu_probe_concurrency_id() { return percpu::concurrency_id(); }

// The structures' hot add: what a user's counter.add(1) and per_cpu<T>'s add
// become (tests/check_add_path.sh).
#include "percpu/counter.hpp"
#include "percpu/per_cpu.hpp"

namespace {
struct probe_stats {
  long requests;
  long bytes;
};
}  // namespace

extern "C" void percpu_probe_counter_add(percpu::counter* c) { c->add(1); }
extern "C" void percpu_probe_per_cpu_add(percpu::per_cpu<probe_stats>* s) {
  s->add(&probe_stats::bytes, 512L);
}
