/* percpu/version.h: the version of the percpu headers, as C macros (also
 * included by percpu/percpu.h and percpu/cpu.hpp).
 *
 * The configure step checks these against project(VERSION) in the top
 * CMakeLists.txt and stops when they differ, so a release changes both.
 * The ABI promise that goes with a version is in docs/abi.md. */
#ifndef PERCPU_VERSION_H_
#define PERCPU_VERSION_H_

#define PERCPU_VERSION_MAJOR 0
#define PERCPU_VERSION_MINOR 2
#define PERCPU_VERSION_PATCH 0
#define PERCPU_VERSION_STRING "0.2.0"

/* MAJOR * 10000 + MINOR * 100 + PATCH: 0.1.0 is 100. For #if comparisons. */
#define PERCPU_VERSION \
  (PERCPU_VERSION_MAJOR * 10000 + PERCPU_VERSION_MINOR * 100 + PERCPU_VERSION_PATCH)

#endif /* PERCPU_VERSION_H_ */
