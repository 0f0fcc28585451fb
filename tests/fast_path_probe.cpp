// Compiled with the project's flags and disassembled by check_fast_path.sh:
// each probe is what a user's call site of the inline function becomes.
#include "percpu/cpu.hpp"

extern "C" int percpu_probe_cpu_id() { return percpu::cpu_id(); }
extern "C" int percpu_probe_node_id() { return percpu::node_id(); }
extern "C" int percpu_probe_concurrency_id() { return percpu::concurrency_id(); }
