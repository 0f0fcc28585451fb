#!/usr/bin/env bash
# scripts/abi.sh: keeps libpercpu.so's ABI deliberate (docs/abi.md).
#
#   scripts/abi.sh exports LIB   fails unless LIB's dynamic symbols are all
#                                percpu's and its percpu::internal ones are all
#                                in abi/internal-exports.txt (ctest abi_exports
#                                runs this in every native build)
#   scripts/abi.sh check [LIB]   exports, then fails unless abidiff finds
#                                nothing removed or changed against the kept
#                                dump abi/libpercpu.abi (added functions are
#                                compatible within a minor version: listed,
#                                not failed)
#   scripts/abi.sh update [LIB]  rewrites abi/libpercpu.abi from LIB: at a
#                                release, or with a deliberate ABI change
#                                (which bumps the SONAME, see docs/abi.md)
#
# Without LIB both build the shared library first, in build/abi (Release with
# -g: abidiff compares types through the debug info). A LIB given must be
# built the same way, with g++ (the package lane's build is). Needs abidw and
# abidiff (Debian's abigail-tools; scripts/deps.sh abi).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
dump=$root/abi/libpercpu.abi
allowed=$root/abi/internal-exports.txt
mode=${1:-}
lib=${2:-}
case "$mode" in
  check|update) ;;
  exports) [[ -n $lib ]] || { echo "usage: scripts/abi.sh exports path/to/libpercpu.so" >&2; exit 2; } ;;
  *) echo "usage: scripts/abi.sh exports|check|update [path/to/libpercpu.so]" >&2; exit 2 ;;
esac

if [[ -z $lib ]]; then
  build=$root/build/abi
  mkdir -p "$build"
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS=-g \
    -DBUILD_SHARED_LIBS=ON -DBUILD_TESTING=OFF -DPERCPU_BUILD_TOOLS=OFF \
    -DPERCPU_BUILD_BENCHMARKS=OFF -DPERCPU_BUILD_EXAMPLES=OFF >"$build.configure.log" 2>&1 ||
    { cat "$build.configure.log"; exit 1; }
  cmake --build "$build" --target percpu -j "$(nproc)" >"$build.build.log" 2>&1 ||
    { tail -40 "$build.build.log"; exit 1; }
  lib=$build/percpu/libpercpu.so
fi
[[ -e $lib ]] || { echo "abi.sh: no library at $lib" >&2; exit 1; }
lib=$(readlink -f "$lib")

abidw_args=(--no-corpus-path --no-comp-dir-path --no-show-locs --drop-undefined-syms)

if [[ $mode == update ]]; then
  # Each translation unit is named by its source path, which is the build
  # machine's: keep only the part inside the repository.
  abidw "${abidw_args[@]}" "$lib" | sed -E "s#path='[^']*/percpu/#path='percpu/#" >"$dump"
  echo "abi.sh: wrote abi/libpercpu.abi from $(basename "$lib") ($(grep -c '<elf-symbol ' "$dump") ELF symbols)"
  exit 0
fi

status=0
symbols=$(nm -DC --defined-only "$lib" | sed -E 's/^[0-9a-f]+ [A-Za-z] //')
echo "abi.sh: $(printf '%s\n' "$symbols" | wc -l) defined dynamic symbols in $(basename "$lib")"
# Only percpu's own names (no std:: instantiation, no helper of some
# dependency), and of its internals only the allow-list.
foreign=$(printf '%s\n' "$symbols" | grep -Ev '^percpu_|percpu::' || true)
if [[ -n $foreign ]]; then
  echo "abi.sh: exports symbols that are not percpu's:" >&2
  printf '  %s\n' "$foreign" >&2
  status=1
fi
internal=$(printf '%s\n' "$symbols" |
  grep -E '^((typeinfo|typeinfo name|vtable|guard variable) for )?percpu::internal::' || true)
unlisted=$(printf '%s\n' "$internal" | grep -vxF -f <(grep -v '^#' "$allowed") || true)
if [[ -n $unlisted ]]; then
  echo "abi.sh: exports percpu::internal symbols not in abi/internal-exports.txt:" >&2
  printf '  %s\n' "$unlisted" >&2
  status=1
fi
echo "abi.sh: $(printf '%s\n' "$internal" | grep -c . || true) percpu::internal symbols, all on the allow-list: $([[ -z $unlisted ]] && echo yes || echo NO)"
[[ $mode == exports ]] && exit $status

# abidiff's status is a bit mask: 1 error, 2 usage, 4 ABI change, 8
# incompatible change. --no-added-syms leaves additions out of it.
set +e
abidiff --no-added-syms "$dump" "$lib" >"$lib.abidiff" 2>&1
rc=$?
set -e
if [[ $rc -ne 0 ]]; then
  cat "$lib.abidiff" >&2
  echo "abi.sh: abidiff against abi/libpercpu.abi: status $rc (something removed or changed;" \
       "if deliberate, bump the SONAME and run scripts/abi.sh update)" >&2
  status=1
else
  echo "abi.sh: abidiff against abi/libpercpu.abi: nothing removed or changed"
  abidiff "$dump" "$lib" >"$lib.abidiff" 2>&1 ||
    { echo "abi.sh: added since the dump (compatible; the dump is updated at the next release):";
      grep -E '^\s+\[A\]|^  \[A\]|Added' "$lib.abidiff" | sed 's/^/  /'; }
fi
exit $status
