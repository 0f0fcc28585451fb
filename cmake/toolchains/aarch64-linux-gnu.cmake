# Cross toolchain for aarch64 Linux with Debian's g++-aarch64-linux-gnu.
#
#   cmake -S . -B build-aarch64 \
#     -DCMAKE_TOOLCHAIN_FILE=cmake/toolchains/aarch64-linux-gnu.cmake
#
# Runs nothing by itself: set CMAKE_CROSSCOMPILING_EMULATOR (for example
# "qemu-aarch64;-L;/usr/aarch64-linux-gnu") to run the tests under qemu-user,
# or link static (-DCMAKE_EXE_LINKER_FLAGS=-static) and boot them in
# qemu-system-aarch64 (scripts/lanes/aarch64-system.sh).
#
# When cross-compiling with tests on, the top CMakeLists.txt builds GoogleTest
# from source (PERCPU_GTEST_SOURCE_DIR, /usr/src/googletest by default), since
# the host's libgtest is x86-64.

set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)

set(PERCPU_CROSS_TRIPLE aarch64-linux-gnu)
set(CMAKE_C_COMPILER ${PERCPU_CROSS_TRIPLE}-gcc)
set(CMAKE_CXX_COMPILER ${PERCPU_CROSS_TRIPLE}-g++)

# Debian's multiarch cross files live in /usr/aarch64-linux-gnu.
set(CMAKE_FIND_ROOT_PATH /usr/${PERCPU_CROSS_TRIPLE})
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)
