#!/bin/bash
# run.sh: the subproject lane. Takes percpu into a parent project
# (tests/subproject: it calls include(CTest), has a test and a cpu_test
# target of its own) three ways, by docs/adopting.md's own CMake blocks:
# add_subdirectory, FetchContent from a local clone, and find_package after
# the doc's install commands (then the doc's pkg-config command). Each time:
#   - the parent's `ctest -N` lists the parent's tests and nothing else;
#   - the parent's targets are its own plus percpu's library, `percpu`;
#   - the parent's CMAKE_BUILD_TYPE (CMakeCache.txt) is what it was given:
#     none for add_subdirectory, Debug for the others;
#   - nothing percpu's tests, benchmarks or tools need was looked for (no
#     GoogleTest, Benchmark, TBB, liburcu, jemalloc, tcmalloc, aarch64
#     compiler, CLI11, nlohmann-json, Python in the parent's cache);
#   - the parent builds, its tests pass and its program prints "ok".
# Then, as controls that the checks can see percpu's things when they are
# there: the parent configured with -DPERCPU_BUILD_TESTS=ON lists percpu's
# tests under their usual names and percpu_cpu_test beside its own cpu_test,
# and has looked for GoogleTest. And percpu configured with a missing
# nlohmann-json, then a missing CLI11, fails naming the Debian package and
# -DPERCPU_BUILD_TOOLS=OFF.
#
#   tests/subproject/run.sh WORK_DIR [SOURCE_DIR]
#
# SOURCE_DIR (default: this checkout) is copied, tracked and untracked-but-
# not-ignored files as they are now, into WORK_DIR/percpu, made a git
# repository (branch main) for FetchContent: a fresh clone of the tree.
set -euo pipefail

failures=0

say() { echo "subproject: $*"; }
fail() { echo "subproject: FAILED: $*" >&2; failures=$((failures + 1)); }
die() { echo "subproject: $*" >&2; exit 1; }

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
work=${1:?usage: run.sh WORK_DIR [SOURCE_DIR]}
src=$(cd "${2:-$here/../..}" && pwd)
doc=$src/docs/adopting.md
jobs=${PERCPU_SUBPROJECT_JOBS:-2}
mkdir -p "$work" && work=$(cd "$work" && pwd)
case "$src/" in "$work"/*) die "WORK_DIR $work holds the source tree; give a scratch directory" ;; esac
rm -rf "${work:?}"/* && cd "$work"

# The fenced block that follows "<!-- lane subproject: NAME -->" in FILE.
block() {  # file name
  awk -v marker="<!-- lane subproject: $2 -->" '
    $0 == marker { found = 1; next }
    found == 1 && /^```/ { found = 2; next }
    found == 2 && /^```/ { exit }
    found == 2 { print }' "$1"
}
recipe() {  # name: the doc's block, with the scratch locations put in
  local text
  text=$(block "$doc" "$1")
  [[ -n $text ]] || die "docs/adopting.md has no block marked '<!-- lane subproject: $1 -->'"
  printf '%s\n' "$text" | sed -e "s|/opt/percpu|$work/prefix|g" -e "s|/path/to/percpu|$work/percpu|g"
}

# --- A fresh copy of the tree, as a clone would have it -------------------
say "copying $src to $work/percpu"
(cd "$src" && git ls-files -z --cached --others --exclude-standard) |
  (cd "$src" && while IFS= read -r -d '' f; do [[ -f $f ]] && printf '%s\0' "$f"; done) |
  (cd "$src" && tar --null -T - -cf -) | (mkdir -p "$work/percpu" && tar -xf - -C "$work/percpu")
(cd "$work/percpu" && git init -q -b main && git add -A &&
  git -c user.name=lane -c user.email=lane@localhost commit -q -m "subproject lane copy") ||
  die "cannot make the copy a git repository"

# --- The doc's install commands, then find_package and pkg-config --------
say "docs/adopting.md install commands, in the copy:"
recipe install | sed 's/^/    /'
(cd "$work/percpu" && bash -euo pipefail -c "$(recipe install)") >"$work/install.log" 2>&1 ||
  { tail -30 "$work/install.log"; die "the doc's install commands failed (log: $work/install.log)"; }
# The README shows the same commands.
while IFS= read -r line; do
  grep -qxF "$line" "$src/README.md" || fail "README.md does not show docs/adopting.md's command: $line"
done < <(block "$doc" install)

# The percpu caches a parent must not gain: each is set by looking for
# something only percpu's tests, benchmarks or tools use.
probes='^(GTest_DIR|GTEST_[A-Z_]*|benchmark_DIR|CLI11_DIR|nlohmann_json_DIR|Python3_EXECUTABLE|PERCPU_(TBB|URCU|JEMALLOC|TCMALLOC|AARCH64|OBJDUMP|CLI11|HAVE_GLIBC_RSEQ)[A-Z_]*)(:|$)'
cache_value() {  # build dir, variable
  sed -n "s/^$2:[A-Z]*=//p" "$1/CMakeCache.txt"
}

parent() {  # way, build type ("" for none), recipe name, extra cmake arguments...
  local way=$1 type=$2 name=$3 dir=$work/parent-$1
  shift 3
  say "--- $way (CMAKE_BUILD_TYPE=${type:-none})"
  mkdir -p "$dir"
  cp "$here/CMakeLists.txt" "$here/app.cpp" "$here/cpu_test.cpp" "$dir/"
  recipe "$name" >"$dir/recipe.cmake"
  sed 's/^/    /' "$dir/recipe.cmake"
  if [[ $way == add_subdirectory* ]]; then
    mkdir -p "$dir/third_party" && ln -s "$work/percpu" "$dir/third_party/percpu"
  fi
  local args=(-DPARENT_RECIPE="$dir/recipe.cmake")
  [[ -n $type ]] && args+=(-DCMAKE_BUILD_TYPE="$type")
  cmake -S "$dir" -B "$dir/build" -G Ninja "${args[@]}" "$@" >"$dir/configure.log" 2>&1 ||
    { tail -30 "$dir/configure.log"; fail "$way: the parent does not configure"; return 1; }
}

check_parent() {  # way, build type
  local way=$1 type=$2 dir=$work/parent-$1/build got extra before=$failures
  got=$(cache_value "$dir" CMAKE_BUILD_TYPE)
  [[ $got == "$type" ]] && say "build type: '${got}', as given" ||
    fail "$way: the parent's CMAKE_BUILD_TYPE is '$got', it was given '$type'"
  [[ $(cache_value "$dir" BUILD_TESTING) == ON ]] || fail "$way: the parent's BUILD_TESTING is no longer ON"
  extra=$(grep -Eo "$probes" "$dir/CMakeCache.txt" | tr -d : | sort -u | tr '\n' ' ' || true)
  [[ -z $extra ]] && say "looked for nothing of percpu's tests, benchmarks or tools" ||
    fail "$way: the parent's cache holds what percpu looked for: $extra"
  # The parent's own directory has app, cpu_test and include(CTest)'s
  # dashboard targets; every other directory is percpu's and may hold only
  # the library.
  local mine theirs
  mine=$(awk -F'|' '$1 == "parent" { print $2 }' "$dir/targets.txt" | sort | tr '\n' ' ')
  theirs=$(awk -F'|' '$1 != "parent" { print $2 }' "$dir/targets.txt" | sort | tr '\n' ' ')
  extra=$(tr ' ' '\n' <<<"$mine" | grep -vxE 'app|cpu_test|(Experimental|Nightly|Continuous)[A-Za-z]*|' | tr '\n' ' ' || true)
  [[ -z $extra ]] || fail "$way: the parent's directory holds targets it did not make: $extra"
  [[ $theirs == "" || $theirs == "percpu " ]] && say "percpu's targets: ${theirs:-none (imported percpu::percpu)}" ||
    fail "$way: targets beyond percpu's library: $theirs"
  local tests
  tests=$(ctest --test-dir "$dir" -N | sed -n 's/^ *Test *#[0-9]*: //p' | sort | tr '\n' ' ')
  [[ $tests == "parent.app parent.cpu_test " ]] && say "ctest -N: $tests" ||
    fail "$way: the parent's ctest -N lists '$tests', not only parent.app parent.cpu_test"
  # With percpu's tests in it, the build would take minutes: not worth it
  # once the checks above have failed.
  [[ $failures -eq $before ]] || { say "$way: not built, the checks above failed"; return; }
  cmake --build "$dir" -j "$jobs" >"$dir/build.log" 2>&1 ||
    { tail -30 "$dir/build.log"; fail "$way: the parent does not build"; return; }
  ctest --test-dir "$dir" --output-on-failure >"$dir/ctest.log" 2>&1 ||
    { cat "$dir/ctest.log"; fail "$way: the parent's tests fail"; }
  local out
  out=$("$dir/app") && [[ $out == *": ok" ]] && say "$out" || fail "$way: the program printed '$out'"
  # The parent installs only its own app: percpu's install rules are behind
  # PERCPU_INSTALL, OFF inside another project.
  local installed
  rm -rf "$dir/installed"
  cmake --install "$dir" --prefix "$dir/installed" >"$dir/install.log" 2>&1 ||
    { tail -30 "$dir/install.log"; fail "$way: the parent's install fails"; return; }
  installed=$(cd "$dir/installed" && find . -type f -o -type l | sort | tr '\n' ' ')
  [[ $installed == "./bin/app " ]] && say "the parent's install: $installed" ||
    fail "$way: the parent's install holds more than its app: $installed"
}

parent add_subdirectory "" add_subdirectory && check_parent add_subdirectory ""
parent fetchcontent Debug FetchContent && check_parent fetchcontent Debug
parent find_package Debug find_package -DCMAKE_PREFIX_PATH="$work/prefix" &&
  check_parent find_package Debug

say "--- pkg-config, the doc's command"
mkdir -p "$work/pkg-config" && cp "$here/app.cpp" "$work/pkg-config/"
recipe pkg-config | sed 's/^/    /'
if (cd "$work/pkg-config" && bash -euo pipefail -c "$(recipe pkg-config)") >"$work/pkg-config.log" 2>&1; then
  out=$("$work/pkg-config/a.out") && [[ $out == *": ok" ]] && say "$out" ||
    fail "pkg-config: the program printed '$out'"
else
  cat "$work/pkg-config.log"; fail "pkg-config: the doc's command failed"
fi

# --- Controls: what the checks above would see ----------------------------
say "--- control: add_subdirectory with -DPERCPU_BUILD_TESTS=ON (configure only)"
before=$failures
if parent add_subdirectory-tests Debug add_subdirectory -DPERCPU_BUILD_TESTS=ON; then
  dir=$work/parent-add_subdirectory-tests/build
  tests=$(ctest --test-dir "$dir" -N | sed -n 's/^ *Test *#[0-9]*: //p')
  for t in parent.app cpu_test cpu_test.own counter_test.fallback rseq_sections_check; do
    grep -qx "$t" <<<"$tests" || fail "tests on: ctest -N does not list $t"
  done
  for t in cpu_test percpu_cpu_test percpu_seccomp_exec; do
    grep -q "|$t\$" "$dir/targets.txt" || fail "tests on: no target $t"
  done
  grep -qE "$probes" "$dir/CMakeCache.txt" || fail "tests on: the cache shows no look-up (GoogleTest)"
  [[ $failures -eq $before ]] && say "tests on: $(wc -l <<<"$tests") tests, cpu_test and percpu_cpu_test side by side"
fi

missing() {  # what, cmake arguments that hide it...
  local what=$1 dir=$work/missing-$1
  shift
  if cmake -S "$work/percpu" -B "$dir" -G Ninja -DBUILD_TESTING=OFF "$@" >"$dir.log" 2>&1; then
    fail "percpu configured without $what"
  elif ! grep -q "apt-get install" "$dir.log" || ! grep -q -- "-DPERCPU_BUILD_TOOLS=OFF" "$dir.log"; then
    tail -20 "$dir.log"; fail "without $what, the configure error names no package or no -DPERCPU_BUILD_TOOLS=OFF"
  else
    say "without $what: $(grep -o 'apt-get install [a-z0-9-]*' "$dir.log" | head -1), or -DPERCPU_BUILD_TOOLS=OFF"
  fi
}
say "--- control: percpu with its tools and a missing dependency"
missing nlohmann-json -DCMAKE_DISABLE_FIND_PACKAGE_nlohmann_json=ON
cli11=$(find /usr/include /usr/local/include -path '*/CLI/CLI.hpp' -print -quit 2>/dev/null || true)
missing CLI11 -DCMAKE_DISABLE_FIND_PACKAGE_CLI11=ON ${cli11:+-DCMAKE_IGNORE_PATH=$(dirname "$(dirname "$cli11")")}

if [[ $failures -eq 0 ]]; then
  say "all checks passed"
else
  die "$failures check(s) failed; logs in $work"
fi
