# percpu's install rules and its Debian packages, included by the top
# CMakeLists.txt when PERCPU_INSTALL is on (the default only when percpu is
# the top-level project).
#
# Every file belongs to one install component, and each component is one
# Debian package (cpack -G DEB in a shared build, see docs/abi.md):
#   runtime  libpercpu<SOVERSION>   libpercpu.so.<SOVERSION>, the preload
#                                   libpercpu_getcpu.so and its man page,
#                                   LICENSE
#   dev      libpercpu-dev          headers, libpercpu.so (the link), the
#                                   static libpercpu.a (PERCPU_ALSO_STATIC),
#                                   CMake package, pkg-config file, the docs
#   tools    percpu-tools           percpu-bench and its man page
# `cmake --install` without --component installs all three.

include(CMakePackageConfigHelpers)

# The library. In a shared build: the versioned file for the runtime
# package, the unversioned link for -dev.
if(BUILD_SHARED_LIBS)
  install(TARGETS percpu EXPORT percpuTargets
          LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT runtime NAMELINK_COMPONENT dev)
  if(PERCPU_ALSO_STATIC)
    install(TARGETS percpu_static EXPORT percpuTargets
            ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT dev)
  endif()
else()
  install(TARGETS percpu EXPORT percpuTargets
          ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT dev)
endif()

# Headers: every public header and the internal ones they include. The
# internal headers no public header includes declare only what the library
# keeps hidden, so they are not installed (the package lane's consumer build
# proves the installed set is complete).
install(DIRECTORY ${PROJECT_SOURCE_DIR}/percpu/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/percpu
        COMPONENT dev
        FILES_MATCHING PATTERN "*.hpp" PATTERN "*.h"
        PATTERN "*_test*" EXCLUDE PATTERN "*_benchmark*" EXCLUDE
        PATTERN "internal/environment.hpp" EXCLUDE PATTERN "internal/fallback.hpp" EXCLUDE
        PATTERN "internal/futex.hpp" EXCLUDE PATTERN "internal/sysfs.hpp" EXCLUDE
        PATTERN "internal/vdso.hpp" EXCLUDE)

# CMake package. Its compatibility says what the SONAME says (set in
# percpu/CMakeLists.txt): SOVERSION MAJOR.MINOR (0.x) is SameMinorVersion,
# SOVERSION MAJOR is SameMajorVersion.
get_target_property(_percpu_soversion percpu SOVERSION)
if(_percpu_soversion MATCHES "\\.")
  set(_percpu_compatibility SameMinorVersion)
else()
  set(_percpu_compatibility SameMajorVersion)
endif()
install(EXPORT percpuTargets NAMESPACE percpu:: FILE percpuTargets.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/percpu COMPONENT dev)
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/percpuConfig.cmake.in
  ${PROJECT_BINARY_DIR}/percpuConfig.cmake
  INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/percpu)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/percpuConfigVersion.cmake
  COMPATIBILITY ${_percpu_compatibility})
install(FILES ${PROJECT_BINARY_DIR}/percpuConfig.cmake
              ${PROJECT_BINARY_DIR}/percpuConfigVersion.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/percpu COMPONENT dev)

# pkg-config. What a static libpercpu.a needs (it is C++, so C programs need
# the C++ runtime) is Libs.private, for `pkg-config --static`. A build that
# installs only the static library puts it in Libs as well, since plain
# `pkg-config --libs` must then link too.
set(PERCPU_PC_LIBS_PRIVATE "-lstdc++ -lpthread -ldl")
if(BUILD_SHARED_LIBS)
  set(PERCPU_PC_LIBS "")
else()
  set(PERCPU_PC_LIBS " ${PERCPU_PC_LIBS_PRIVATE}")
endif()
configure_file(${PROJECT_SOURCE_DIR}/cmake/percpu.pc.in ${PROJECT_BINARY_DIR}/percpu.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/percpu.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig
        COMPONENT dev)

# Licence and documentation (share/doc/percpu).
install(FILES ${PROJECT_SOURCE_DIR}/LICENSE DESTINATION ${CMAKE_INSTALL_DOCDIR} COMPONENT runtime)
install(FILES ${PROJECT_SOURCE_DIR}/README.md ${PROJECT_SOURCE_DIR}/docs/abi.md
              ${PROJECT_SOURCE_DIR}/docs/adopting.md ${PROJECT_SOURCE_DIR}/docs/compatibility.md
              ${PROJECT_SOURCE_DIR}/docs/results.md
        DESTINATION ${CMAKE_INSTALL_DOCDIR} COMPONENT dev)

# The tools: the preload goes with the runtime library, percpu-bench in its own package.
if(TARGET percpu_getcpu)
  install(TARGETS percpu_getcpu LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT runtime)
  install(FILES ${PROJECT_SOURCE_DIR}/preload/libpercpu_getcpu.8
          DESTINATION ${CMAKE_INSTALL_MANDIR}/man8 COMPONENT runtime)
endif()
if(TARGET percpu-bench)
  install(TARGETS percpu-bench RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT tools)
  install(FILES ${PROJECT_SOURCE_DIR}/tools/percpu-bench.1
          DESTINATION ${CMAKE_INSTALL_MANDIR}/man1 COMPONENT tools)
endif()

# ---- CPack: one Debian package per component -------------------------------
set(CPACK_PACKAGE_NAME percpu)
set(CPACK_PACKAGE_VENDOR "The percpu authors")
set(CPACK_PACKAGE_CONTACT "The percpu authors <percpu@invalid>")
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
# No CPACK_PACKAGE_DESCRIPTION_SUMMARY: each package's description below
# starts with its own summary line.
set(CPACK_RESOURCE_FILE_LICENSE ${PROJECT_SOURCE_DIR}/LICENSE)
set(CPACK_PACKAGE_DIRECTORY ${PROJECT_BINARY_DIR}/packages)
# The files go where CMAKE_INSTALL_PREFIX says, which percpu.pc names too:
# configure a package build with -DCMAKE_INSTALL_PREFIX=/usr.
set(CPACK_PACKAGING_INSTALL_PREFIX ${CMAKE_INSTALL_PREFIX})
set(CPACK_STRIP_FILES ON)
set(CPACK_GENERATOR DEB)
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_COMPONENTS_ALL runtime dev tools)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_RELEASE 1)
set(CPACK_DEBIAN_PACKAGE_SECTION libs)
set(CPACK_DEBIAN_PACKAGE_HOMEPAGE "https://github.com/percpu/percpu")
# dpkg-shlibdeps computes what the binaries need from the system (libc6,
# libstdc++6, libgcc-s1); -dev's dependency on the runtime package is written
# out, at the exact version. percpu-bench links percpu's objects statically
# (it measures internals the shared library does not export), so the tools
# package needs no libpercpu.
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
# The runtime package's shlibs file (and the ldconfig trigger) lets other
# packages' dpkg-shlibdeps find it: ">=" since a later 0.2.x only adds.
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS ON)
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS_POLICY ">=")
set(_percpu_deb_version "${PROJECT_VERSION}-${CPACK_DEBIAN_PACKAGE_RELEASE}")
set(_percpu_runtime_package "libpercpu${_percpu_soversion}")

set(CPACK_DEBIAN_RUNTIME_PACKAGE_NAME ${_percpu_runtime_package})
set(CPACK_COMPONENT_RUNTIME_DESCRIPTION
  "the current CPU in one load, and per-CPU data structures on rseq
percpu: the shared library libpercpu.so.${_percpu_soversion}, and libpercpu_getcpu.so,
which answers glibc's sched_getcpu() and getcpu() through percpu in programs
that cannot be rebuilt (LD_PRELOAD).")

set(CPACK_DEBIAN_DEV_PACKAGE_NAME libpercpu-dev)
set(CPACK_DEBIAN_DEV_PACKAGE_SECTION libdevel)
set(CPACK_DEBIAN_DEV_PACKAGE_DEPENDS "${_percpu_runtime_package} (= ${_percpu_deb_version})")
set(CPACK_COMPONENT_DEV_DESCRIPTION
  "percpu development files: headers, static library, CMake and pkg-config
percpu's headers, libpercpu.so and the static libpercpu.a, the CMake package
(find_package(percpu)) and the pkg-config file, and the documentation.")

set(CPACK_DEBIAN_TOOLS_PACKAGE_NAME percpu-tools)
set(CPACK_DEBIAN_TOOLS_PACKAGE_SECTION utils)
set(CPACK_COMPONENT_TOOLS_DESCRIPTION
  "percpu-bench: which way of asking for the current CPU is fastest here
percpu-bench reproduces the glibc rseq sched_getcpu() table and the arm64 get_cpu_id()
table on this machine, and measures percpu's structures against the
alternatives they replace.")
include(CPack)
