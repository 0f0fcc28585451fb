# One small helper that registers percpu's libraries, tests and benchmarks,
# so every target gets the same warnings, include paths and seams.
#
# Target names: every target but the library is named percpu_NAME (NAME as
# it is when it already starts with "percpu"), so that percpu built inside
# another project (add_subdirectory, FetchContent) with its tests on never
# takes a name the parent uses, such as cpu_test. The file it builds keeps
# the plain NAME (OUTPUT_NAME), and so does its ctest test: the lanes find
# binaries and tests by those names (mutants' Build: lines name binaries and
# scripts/mutants.sh applies the same rule).
#   percpu_target(out NAME)          out = the target of binary NAME
#   percpu_add_executable(NAME src...)
#   percpu_add_library(NAME STATIC|SHARED|MODULE|OBJECT src...)
#       add_executable / add_library of target percpu_target(NAME), whose
#       file is still called NAME; use the target name for target_*() calls.
#   The functions below take binary names (NAME, TARGET, check_sections'
#   arguments) and map them themselves.
#
#   percpu_cc_library(NAME name SRCS ... [DEPS ...])
#   percpu_cc_test(NAME name SRCS ... [DEPS ...] [LABELS ...] [ENV ...] [ARGS ...] [TIMEOUT s] [C])
#       binary `name` (target percpu_target(name)) and its ctest test `name`
#   percpu_cc_benchmark(NAME name SRCS ... [DEPS ...])
#   percpu_add_mode_tests(TARGET t [ARGS ...] [TIMEOUT s] [LABELS ...])
#       registers t three more times, once per rseq mode, each asserting the
#       mode it ran in (owner, backend, percpu::sections_status()): t.glibc
#       (glibc owns rseq), t.own (percpu registers,
#       GLIBC_TUNABLES=glibc.pthread.rseq=0) and t.fallback (rseq fails with
#       ENOSYS under a seccomp filter).
#   percpu_add_no_membarrier_tests(TARGET t [ARGS ...] [TIMEOUT s] [LABELS ...])
#       registers t.no_membarrier where glibc registers rseq
#       (PERCPU_HAVE_GLIBC_RSEQ): t under tests/seccomp_exec --membarrier
#       ENOSYS, asserting glibc's rseq and sections on: a host with rseq but
#       without membarrier's RSEQ fence (Linux 4.18-5.9, no CONFIG_MEMBARRIER,
#       a sandbox refusing membarrier), where the structures keep away from
#       other CPUs' slots. Labels: the .glibc variant's and no-membarrier.
#   percpu_add_emulated_tests(TARGET t [LABELS ...] [GTEST_EXCLUDE case...])
#       registers t.emulated and t.emulated_rdpid: t under
#       PERCPU_X86_64_EMULATOR -cpu max (an emulated CPU with RDPID, no rseq),
#       unforced and with PERCPU_BACKEND=rdpid, both demanding the rdpid
#       backend: the RDPID backend's coverage on hosts whose CPU lacks it.
#       And t.emulated_no_rdpid and t.emulated_no_rdpid_forced, under
#       -cpu qemu64 (neither RDPID nor RDTSCP), unforced and with
#       PERCPU_BACKEND=rdpid: a host without RDPID on any machine, whose
#       vDSO getcpu (qemu-user's own) answers CPU 0 on every CPU, so each
#       must end on what the host offers, the system call where more than
#       CPU 0 is allowed.
#   percpu_check_sections(target...)
#       the targets hold rseq critical sections: tests/rseq_sections_check
#       verifies their tables (every binary of the build that has any).
#   percpu_add_test(NAME name COMMAND ... [LABELS ...] [ENV ...] [TIMEOUT s]
#                   [MODE glibc|own|fallback|eperm|forced] [SKIP_RETURN_CODE n])
#       registers a test that is not one gtest binary run plainly (a script,
#       a program under a wrapper, a variant with its own environment).
#
# Every test goes through percpu_add_test, which gives it ctest labels. The
# lanes (CMakePresets.json, scripts/test.sh) choose tests by these labels,
# never by name:
#   core, structures, tools, preload, examples, consumer
#                   what the test covers (valgrind runs core and structures;
#                   the seams lane the structures)
#   mode            a variant that imposes an rseq mode or a backend; with
#   mode-glibc      glibc owns rseq
#   mode-own        glibc's rseq off, percpu registers
#   mode-fallback   rseq refused with ENOSYS by seccomp
#   mode-eperm      rseq refused with EPERM by seccomp
#   forced-backend  PERCPU_BACKEND forces a fallback backend
#   needs-rseq      cannot pass without the kernel's rseq (mode-glibc and
#                   mode-own variants, tests bringing their own registrant);
#                   lanes that take rseq away leave these out
#   no-membarrier   membarrier(2) refused with ENOSYS by seccomp, glibc owning
#                   rseq (also mode, mode-glibc and needs-rseq): the
#                   structures' documented behaviour without the RSEQ fence;
#                   lanes that take rseq away or impose another mode leave
#                   these out by those labels
#   foreign-rseq    another library registers rseq first: the test sets up
#                   its mode itself, so lanes that impose one leave it out
#   asm-shape       checks the instructions of optimised code, which
#                   instrumented builds do not produce
#   static          a statically linked program
#   emulated        runs under an emulated CPU (PERCPU_X86_64_EMULATOR);
#                   instrumented lanes leave it out

set(PERCPU_WARNINGS -Wall -Wextra)
# qemu-x86_64 (qemu 8 or later) for the emulated variants; scripts/test.sh
# fetches Debian trixie's. Empty: the variants are not registered.
set(PERCPU_X86_64_EMULATOR "" CACHE FILEPATH
    "qemu-x86_64 whose -cpu max has RDPID, for the *.emulated_rdpid test variants")
# Per-test time limit, in seconds; slow launchers (valgrind) raise it.
set(PERCPU_TEST_TIMEOUT 300 CACHE STRING "ctest TIMEOUT of each percpu test")
if(PERCPU_WERROR)
  list(APPEND PERCPU_WARNINGS -Werror)
endif()

function(percpu_target out name)
  if(name MATCHES "^percpu([_-]|$)")
    set(${out} ${name} PARENT_SCOPE)
  else()
    set(${out} percpu_${name} PARENT_SCOPE)
  endif()
endfunction()

function(percpu_add_executable name)
  percpu_target(_target ${name})
  add_executable(${_target} ${ARGN})
  if(NOT _target STREQUAL name)
    set_target_properties(${_target} PROPERTIES OUTPUT_NAME ${name})
  endif()
endfunction()

function(percpu_add_library name kind)
  percpu_target(_target ${name})
  add_library(${_target} ${kind} ${ARGN})
  if(NOT _target STREQUAL name AND NOT kind STREQUAL "OBJECT")
    set_target_properties(${_target} PROPERTIES OUTPUT_NAME ${name})
  endif()
endfunction()

# The command that runs test binary `target`: through PERCPU_TEST_LAUNCHER
# (valgrind, say) when set; otherwise by target name, so that a cross build's
# CMAKE_CROSSCOMPILING_EMULATOR applies.
function(percpu_test_command out name)
  percpu_target(target ${name})
  if(PERCPU_TEST_LAUNCHER)
    set(${out} ${PERCPU_TEST_LAUNCHER} $<TARGET_FILE:${target}> PARENT_SCOPE)
  else()
    set(${out} ${target} PARENT_SCOPE)
  endif()
endfunction()

# A misspelt or undocumented argument stops the configure instead of being
# dropped, so the usage above and what the parsers accept cannot drift apart.
function(_percpu_no_unparsed caller unparsed)
  if(unparsed)
    message(FATAL_ERROR "${caller}: unknown arguments: ${unparsed}")
  endif()
endfunction()

function(_percpu_common target)
  target_compile_options(${target} PRIVATE ${PERCPU_WARNINGS})
  target_include_directories(${target} PRIVATE ${PROJECT_SOURCE_DIR})
  if(PERCPU_INJECT_DELAYS)
    target_compile_definitions(${target} PRIVATE PERCPU_INJECT_DELAYS=1)
  endif()
  if(PERCPU_COMPARE_TWICE)
    target_compile_definitions(${target} PRIVATE PERCPU_COMPARE_TWICE=1)
  endif()
  if(PERCPU_KEEP_ASSERTS)
    target_compile_options(${target} PRIVATE -UNDEBUG)
  endif()
endfunction()

function(percpu_cc_library)
  cmake_parse_arguments(L "" "NAME" "SRCS;DEPS" ${ARGN})
  _percpu_no_unparsed(percpu_cc_library "${L_UNPARSED_ARGUMENTS}")
  add_library(${L_NAME} ${L_SRCS})
  add_library(percpu::${L_NAME} ALIAS ${L_NAME})
  _percpu_common(${L_NAME})
  target_include_directories(${L_NAME} PUBLIC
    $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}>
    $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
  # The seams change what the headers' inline code does, so users of the
  # library must see them as well.
  if(PERCPU_INJECT_DELAYS)
    target_compile_definitions(${L_NAME} PUBLIC PERCPU_INJECT_DELAYS=1)
  endif()
  if(PERCPU_COMPARE_TWICE)
    target_compile_definitions(${L_NAME} PUBLIC PERCPU_COMPARE_TWICE=1)
  endif()
  target_link_libraries(${L_NAME} PUBLIC ${L_DEPS})
endfunction()

function(percpu_add_test)
  cmake_parse_arguments(A "" "NAME;TIMEOUT;MODE;SKIP_RETURN_CODE" "COMMAND;LABELS;ENV" ${ARGN})
  _percpu_no_unparsed(percpu_add_test "${A_UNPARSED_ARGUMENTS}")
  if(NOT A_TIMEOUT)
    set(A_TIMEOUT ${PERCPU_TEST_TIMEOUT})
  endif()
  set(_labels ${A_LABELS})
  if(A_MODE STREQUAL "glibc" OR A_MODE STREQUAL "own")
    list(APPEND _labels mode mode-${A_MODE} needs-rseq)
  elseif(A_MODE STREQUAL "fallback" OR A_MODE STREQUAL "eperm")
    list(APPEND _labels mode mode-${A_MODE})
  elseif(A_MODE STREQUAL "forced")
    list(APPEND _labels mode forced-backend)
  elseif(A_MODE)
    message(FATAL_ERROR "percpu_add_test(${A_NAME}): unknown MODE ${A_MODE}")
  endif()
  list(REMOVE_DUPLICATES _labels)
  add_test(NAME ${A_NAME} COMMAND ${A_COMMAND})
  set_tests_properties(${A_NAME} PROPERTIES TIMEOUT ${A_TIMEOUT} LABELS "${_labels}")
  if(A_ENV)
    set_tests_properties(${A_NAME} PROPERTIES ENVIRONMENT "${A_ENV}")
  endif()
  if(DEFINED A_SKIP_RETURN_CODE)
    set_tests_properties(${A_NAME} PROPERTIES SKIP_RETURN_CODE ${A_SKIP_RETURN_CODE})
  endif()
endfunction()

function(percpu_add_emulated_tests)
  cmake_parse_arguments(E "" "TARGET" "LABELS;GTEST_EXCLUDE" ${ARGN})
  _percpu_no_unparsed(percpu_add_emulated_tests "${E_UNPARSED_ARGUMENTS}")
  percpu_target(_target ${E_TARGET})
  set(_filter)
  if(E_GTEST_EXCLUDE)
    list(JOIN E_GTEST_EXCLUDE ":" _exclude)
    set(_filter "GTEST_FILTER=-${_exclude}")
  endif()
  set(_command ${PERCPU_X86_64_EMULATOR} -cpu max $<TARGET_FILE:${_target}>)
  # qemu-user answers rseq with ENOSYS: the fallback serves every thread.
  # Unforced, it must be RDPID, the fastest the emulated CPU offers.
  percpu_add_test(NAME ${E_TARGET}.emulated COMMAND ${_command} MODE fallback
    LABELS ${E_LABELS} emulated
    ENV PERCPU_EXPECT_OWNER=none PERCPU_EXPECT_BACKEND=rdpid PERCPU_EXPECT_SECTIONS=no_rseq ${_filter})
  percpu_add_test(NAME ${E_TARGET}.emulated_rdpid COMMAND ${_command} MODE forced
    LABELS ${E_LABELS} emulated
    ENV PERCPU_BACKEND=rdpid PERCPU_EXPECT_BACKEND=rdpid PERCPU_EXPECT_SECTIONS=fallback_forced
        ${_filter})
  set(_command ${PERCPU_X86_64_EMULATOR} -cpu qemu64 $<TARGET_FILE:${_target}>)
  percpu_add_test(NAME ${E_TARGET}.emulated_no_rdpid COMMAND ${_command} MODE fallback
    LABELS ${E_LABELS} emulated
    ENV PERCPU_EXPECT_OWNER=none PERCPU_EXPECT_SECTIONS=no_rseq ${_filter})
  percpu_add_test(NAME ${E_TARGET}.emulated_no_rdpid_forced COMMAND ${_command} MODE forced
    LABELS ${E_LABELS} emulated
    ENV PERCPU_BACKEND=rdpid PERCPU_EXPECT_BACKEND=forced PERCPU_EXPECT_SECTIONS=fallback_forced
        ${_filter})
endfunction()

function(percpu_check_sections)
  foreach(_name ${ARGN})
    percpu_target(_target ${_name})
    set_property(GLOBAL APPEND PROPERTY PERCPU_SECTION_BINARIES ${_target})
  endforeach()
endfunction()

function(percpu_cc_test)
  cmake_parse_arguments(T "C" "NAME;TIMEOUT" "SRCS;DEPS;LABELS;ENV;ARGS" ${ARGN})
  list(TRANSFORM T_DEPS REPLACE "^percpu$" percpu_with_internals)  # see percpu/CMakeLists.txt
  _percpu_no_unparsed(percpu_cc_test "${T_UNPARSED_ARGUMENTS}")
  percpu_target(_target ${T_NAME})
  percpu_add_executable(${T_NAME} ${T_SRCS})
  _percpu_common(${_target})
  if(T_C)
    target_link_libraries(${_target} PRIVATE ${T_DEPS})
  else()
    if(NOT TARGET GTest::gtest)  # cross builds make it from source (top CMakeLists.txt)
      find_package(GTest REQUIRED)
    endif()
    target_sources(${_target} PRIVATE ${PROJECT_SOURCE_DIR}/tests/support/expect_mode.cpp)
    target_link_libraries(${_target} PRIVATE ${T_DEPS} GTest::gtest GTest::gtest_main)
  endif()
  percpu_test_command(_command ${T_NAME})
  percpu_add_test(NAME ${T_NAME} COMMAND ${_command} ${T_ARGS} LABELS ${T_LABELS}
    ENV ${T_ENV} TIMEOUT ${T_TIMEOUT})
endfunction()

function(percpu_cc_benchmark)
  cmake_parse_arguments(B "" "NAME" "SRCS;DEPS" ${ARGN})
  list(TRANSFORM B_DEPS REPLACE "^percpu$" percpu_with_internals)
  _percpu_no_unparsed(percpu_cc_benchmark "${B_UNPARSED_ARGUMENTS}")
  find_package(benchmark REQUIRED)
  percpu_target(_target ${B_NAME})
  percpu_add_executable(${B_NAME} ${B_SRCS})
  _percpu_common(${_target})
  target_link_libraries(${_target} PRIVATE ${B_DEPS} benchmark::benchmark benchmark::benchmark_main)
endfunction()

function(percpu_add_mode_tests)
  cmake_parse_arguments(M "" "TARGET;TIMEOUT" "ARGS;LABELS" ${ARGN})
  _percpu_no_unparsed(percpu_add_mode_tests "${M_UNPARSED_ARGUMENTS}")
  percpu_test_command(_command ${M_TARGET})
  if(PERCPU_HAVE_GLIBC_RSEQ)
    percpu_add_test(NAME ${M_TARGET}.glibc COMMAND ${_command} ${M_ARGS} MODE glibc
      LABELS ${M_LABELS} TIMEOUT ${M_TIMEOUT}
      ENV PERCPU_EXPECT_OWNER=glibc PERCPU_EXPECT_BACKEND=rseq PERCPU_EXPECT_SECTIONS=on)
  endif()
  percpu_add_test(NAME ${M_TARGET}.own COMMAND ${_command} ${M_ARGS} MODE own
    LABELS ${M_LABELS} TIMEOUT ${M_TIMEOUT}
    ENV GLIBC_TUNABLES=glibc.pthread.rseq=0 PERCPU_EXPECT_OWNER=percpu PERCPU_EXPECT_BACKEND=rseq
        PERCPU_EXPECT_SECTIONS=on)
  percpu_test_command(_seccomp seccomp_exec)
  percpu_target(_target ${M_TARGET})
  percpu_add_test(NAME ${M_TARGET}.fallback
    COMMAND ${_seccomp} ENOSYS $<TARGET_FILE:${_target}> ${M_ARGS} MODE fallback
    LABELS ${M_LABELS} TIMEOUT ${M_TIMEOUT} ENV PERCPU_EXPECT_OWNER=none
    PERCPU_EXPECT_SECTIONS=no_rseq)
endfunction()

function(percpu_add_no_membarrier_tests)
  cmake_parse_arguments(N "" "TARGET;TIMEOUT" "ARGS;LABELS" ${ARGN})
  _percpu_no_unparsed(percpu_add_no_membarrier_tests "${N_UNPARSED_ARGUMENTS}")
  if(NOT PERCPU_HAVE_GLIBC_RSEQ)
    return()
  endif()
  percpu_test_command(_seccomp seccomp_exec)
  percpu_target(_target ${N_TARGET})
  percpu_add_test(NAME ${N_TARGET}.no_membarrier
    COMMAND ${_seccomp} --membarrier ENOSYS $<TARGET_FILE:${_target}> ${N_ARGS} MODE glibc
    LABELS ${N_LABELS} no-membarrier TIMEOUT ${N_TIMEOUT}
    ENV PERCPU_EXPECT_OWNER=glibc PERCPU_EXPECT_BACKEND=rseq PERCPU_EXPECT_SECTIONS=on)
endfunction()
