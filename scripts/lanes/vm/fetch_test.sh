#!/usr/bin/env bash
# The vm-fetch lane: scripts/lanes/vm/fetch.sh against broken suites, offline.
#
#   scripts/lanes/vm/fetch_test.sh [SCRATCH]   (default build/lanes/vm-fetch)
#
# Builds tiny fake .debs (busybox-static, libc6, a cloud kernel and its meta
# package) into local file:// repositories and points fetch.sh at four suites:
#   alpha  healthy: everything, and a Translation-en index;
#   half   healthy Packages, but a truncated Contents-amd64.gz in its Release
#          (a mirror mid-sync, as a fresh clone once met in trixie);
#   beta   its Packages.gz is truncated (over file:// apt says "Hash Sum
#          mismatch", over http "File has unexpected size");
#   gamma  unreachable (http://127.0.0.1:1).
# The "machine's" apt configuration (APT_CONFIG) adds apt-file's Contents
# target and English translations, as a host's /etc/apt/apt.conf.d may.
# It checks that fetch.sh reads none of that configuration (no Contents or
# Translation file is fetched, so half's sync state does not matter), serves
# what alpha and half serve while warning about beta and gamma by name, fails
# naming the suite, arch and package when a package is wanted only from a
# broken suite, falls back to a second suite when asked to, and fetches a
# suite's index again once its mirror is whole.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)
T=${1:-$REPO/build/lanes/vm-fetch}
case $T in /*) ;; *) T=$PWD/$T ;; esac
FETCH=$REPO/scripts/lanes/vm/fetch.sh
rm -rf "$T" && mkdir -p "$T"
failures=0
ok() { echo "[vm-fetch] ok: $*"; }
bad() { echo "[vm-fetch] FAILED: $*" >&2; failures=$((failures + 1)); }

# --- Fake packages -------------------------------------------------------
deb() {  # name version arch depends, then PATH=CONTENT...
  local name=$1 version=$2 arch=$3 depends=$4 d=$T/src/$1_$2_$3 f
  shift 4
  mkdir -p "$d/DEBIAN"
  {
    echo "Package: $name"; echo "Version: $version"; echo "Architecture: $arch"
    echo "Maintainer: percpu tests <nobody@example.invalid>"
    [[ -n $depends ]] && echo "Depends: $depends"
    echo "Description: fake $name for fetch_test.sh"
  } >"$d/DEBIAN/control"
  for f in "$@"; do
    mkdir -p "$(dirname "$d/${f%%=*}")"
    printf '%s\n' "${f#*=}" >"$d/${f%%=*}"
    chmod 755 "$d/${f%%=*}"
  done
  mkdir -p "$T/pool"
  dpkg-deb -Zgzip --root-owner-group --build "$d" "$T/pool/${name}_${version}_$arch.deb" >/dev/null
}
deb busybox-static 1:1.35.0-4 amd64 "" bin/busybox="busybox of alpha"
deb busybox-static 1:1.36.1-9 amd64 "" bin/busybox="busybox of half"
deb libc6 2.36-9 amd64 "" lib/x86_64-linux-gnu/ld-linux-x86-64.so.2="loader of alpha" \
  lib/x86_64-linux-gnu/libc.so.6="libc of alpha"
deb libc6 2.41-12 amd64 "" lib/x86_64-linux-gnu/ld-linux-x86-64.so.2="loader of beta" \
  lib/x86_64-linux-gnu/libc.so.6="libc of beta"
deb linux-image-6.1.0-40-cloud-amd64-unsigned 6.1.153-1 amd64 "" \
  boot/vmlinuz-6.1.0-40-cloud-amd64="kernel of alpha"
deb linux-image-6.1.0-40-cloud-amd64 6.1.153-1 amd64 "" boot/README="signed placeholder"
deb linux-image-cloud-amd64 6.1.153-1 amd64 "linux-image-6.1.0-40-cloud-amd64 (= 6.1.153-1)"
deb percpu-placeholder 1 arm64 "" usr/share/doc/percpu-placeholder/README="an arm64 index is never empty"

# --- Repositories: one per suite, each with its own dists/SUITE ------------
stanza() {  # deb -> its Packages stanza (Filename relative to the repository)
  dpkg-deb -f "$1"
  echo "Filename: pool/$(basename "$1")"
  echo "Size: $(stat -c %s "$1")"
  echo "SHA256: $(sha256sum "$1" | cut -d' ' -f1)"
  echo
}
repo() {  # suite, then the .debs of binary-amd64 (binary-arm64 has a placeholder)
  local suite=$1 r=$T/repo-$1 d f
  shift
  d=$r/dists/$suite
  mkdir -p "$d/main/binary-amd64" "$d/main/binary-arm64" "$d/main/i18n" "$r/pool"
  for f in "$@"; do cp "$T/pool/$f" "$r/pool/"; stanza "$r/pool/$f"; done >"$d/main/binary-amd64/Packages"
  cp "$T/pool/percpu-placeholder_1_arm64.deb" "$r/pool/"
  stanza "$r/pool/percpu-placeholder_1_arm64.deb" >"$d/main/binary-arm64/Packages"
  printf 'Package: busybox-static\nDescription-md5: 0\nDescription-en: fake\n\n' >"$d/main/i18n/Translation-en"
  printf 'bin/busybox\tutils/busybox-static\n' >"$d/main/Contents-amd64"
  gzip -9n "$d"/main/binary-*/Packages "$d/main/i18n/Translation-en" "$d/main/Contents-amd64"
}
release() {  # suite: its Release, listing every file now in dists/SUITE
  local suite=$1 d=$T/repo-$1/dists/$1 f
  {
    echo "Origin: percpu-test"; echo "Suite: $suite"; echo "Codename: $suite"
    echo "Date: $(LC_ALL=C date -u -R)"; echo "Architectures: amd64 arm64"; echo "Components: main"
    echo "SHA256:"
    # Each index compressed, and (as Debian's Release does) its uncompressed
    # form, which apt looks for to know the index exists.
    (cd "$d" && find main -type f -name '*.gz' | LC_ALL=C sort | while read -r f; do
      printf ' %s %s %s\n' "$(sha256sum <"$f" | cut -d' ' -f1)" "$(stat -c %s "$f")" "$f"
      printf ' %s %s %s\n' "$(gunzip -c "$f" | sha256sum | cut -d' ' -f1)" "$(gunzip -c "$f" | wc -c)" "${f%.gz}"
    done)
  } >"$d/Release"
}
truncate_half() { local s; s=$(stat -c %s "$1"); head -c $((s / 2)) "$1" >"$1.cut" && mv "$1.cut" "$1"; }
repo alpha busybox-static_1:1.35.0-4_amd64.deb libc6_2.36-9_amd64.deb linux-image-cloud-amd64_6.1.153-1_amd64.deb \
  linux-image-6.1.0-40-cloud-amd64_6.1.153-1_amd64.deb linux-image-6.1.0-40-cloud-amd64-unsigned_6.1.153-1_amd64.deb
repo half busybox-static_1:1.36.1-9_amd64.deb
repo beta libc6_2.41-12_amd64.deb
for s in alpha half beta; do release "$s"; done
truncate_half "$T/repo-half/dists/half/main/Contents-amd64.gz"
cp "$T/repo-beta/dists/beta/main/binary-amd64/Packages.gz" "$T/beta-Packages.gz.whole"
truncate_half "$T/repo-beta/dists/beta/main/binary-amd64/Packages.gz"
{
  for s in alpha half beta; do echo "deb [arch=amd64,arm64 trusted=yes] file:$T/repo-$s $s main"; done
  echo "deb [arch=amd64,arm64 trusted=yes] http://127.0.0.1:1/debian gamma main"
} >"$T/sources.list"

# The machine's configuration, as APT_CONFIG and its parts directory: what
# apt-file and a translation setting would add.
mkdir -p "$T/host/apt.conf.d"
cat >"$T/host/apt.conf" <<EOF
Dir::Etc::parts "$T/host/apt.conf.d";
EOF
cat >"$T/host/apt.conf.d/50apt-file.conf" <<'EOF'
Acquire::IndexTargets::deb::Contents-deb {
  MetaKey "$(COMPONENT)/Contents-$(ARCHITECTURE)";
  ShortDescription "Contents-$(ARCHITECTURE)";
  Description "$(RELEASE)/$(COMPONENT) $(ARCHITECTURE) Contents (deb)";
};
EOF
echo 'Acquire::Languages { "en"; };' >"$T/host/apt.conf.d/60languages"
export APT_CONFIG=$T/host/apt.conf

export VM_FETCH_SOURCES=$T/sources.list VM_FETCH_RETRIES=1 VM_FETCH_UPDATE_ATTEMPTS=2 VM_FETCH_RETRY_DELAY=0
CACHE=$T/cache
# Also where fetch.sh keeps its sources (what an older fetch.sh read instead
# of VM_FETCH_SOURCES), so this test can be run against one.
mkdir -p "$CACHE/apt" && cp "$T/sources.list" "$CACHE/apt/sources.list"
# Runs fetch.sh; sets rc, out (its stdout) and err (its stderr, also kept in a log).
n=0
fetch() {
  n=$((n + 1))
  rc=0
  out=$("$FETCH" "$CACHE" "$@" 2>"$T/fetch-$n.err") || rc=$?
  err=$(cat "$T/fetch-$n.err")
  echo "[vm-fetch] fetch.sh $* -> exit $rc ($T/fetch-$n.err)"
}
has() { grep -qF -- "$1" <<<"$err"; }
show_err() { sed 's/^/[vm-fetch]     | /' <<<"$err" >&2; }

# 1. The first call updates: alpha serves, beta and gamma are warnings by name.
fetch busybox amd64 alpha
if ((rc == 0)) && [[ $(cat "$out" 2>/dev/null) == "busybox of alpha" ]]; then ok "busybox from alpha despite broken beta and gamma"
else bad "busybox amd64 alpha: exit $rc, output '$out'"; show_err; fi
for s in beta gamma; do
  if has "warning: no package index of $s for amd64 arm64"; then ok "the update warned about $s"; else bad "no warning naming $s"; show_err; fi
done
for s in alpha half; do
  if has "no package index of $s"; then bad "a warning about healthy $s"; show_err; else ok "no warning about $s"; fi
done
if has "beta/main/binary-amd64/Packages.gz  Hash Sum mismatch"; then ok "the warning quotes apt's error about beta's truncated index"
else bad "the warning does not say what apt said about beta"; show_err; fi

# 2. Only Packages indexes: the machine's Contents and Translation targets are not read.
others=$(find "$CACHE/apt/lists" -maxdepth 1 -type f \( -name '*Contents*' -o -name '*Translation*' -o -iname '*dep11*' \) -printf '%f ')
if [[ -z $others ]]; then ok "no Contents, Translation or DEP-11 file in the lists"
else bad "the private configuration fetched $others"; fi

# The parts directories apt reads under fetch.sh's configuration are its own, and empty
# (not /etc/apt's, which this test cannot plant anything in).
for key in Dir::Etc::parts Dir::Etc::sourceparts Dir::Etc::preferencesparts; do
  dir=$(APT_CONFIG=$CACHE/apt/apt.conf apt-config shell D "$key/d" | sed "s/^D='\(.*\)'$/\1/")
  if [[ $dir == "$CACHE/apt/"* && -d $dir && -z $(ls -A "$dir") ]]; then ok "$key is fetch.sh's own, empty"
  else bad "$key is '$dir'"; fi
done

# 3. A kernel through the meta package, a glibc, and half's busybox (its Contents is truncated).
fetch kernel amd64 alpha
if ((rc == 0)) && [[ $(cat "$out" 2>/dev/null) == "kernel of alpha" ]]; then ok "kernel from alpha"
else bad "kernel amd64 alpha: exit $rc, output '$out'"; show_err; fi
fetch libc6 amd64 alpha
if ((rc == 0)) && [[ $(cat "$out/lib/ld-linux-x86-64.so.2" 2>/dev/null) == "loader of alpha" ]]; then ok "glibc from alpha"
else bad "libc6 amd64 alpha: exit $rc, output '$out'"; show_err; fi
fetch busybox amd64 half
if ((rc == 0)) && [[ $(cat "$out" 2>/dev/null) == "busybox of half" ]]; then ok "busybox from half, whose Contents file is truncated"
else bad "busybox amd64 half: exit $rc, output '$out'"; show_err; fi

# 4. Wanted from a broken suite only: a failure naming suite, arch and package.
fetch libc6 amd64 beta
if ((rc != 0)) && has "cannot get libc6 (amd64) from beta" && has "FAILED"; then ok "libc6 from truncated beta fails by name"
else bad "libc6 amd64 beta: exit $rc, output '$out'"; show_err; fi
fetch kernel arm64 gamma
if ((rc != 0)) && has "cannot get linux-image-cloud-arm64 (arm64) from gamma" && has "127.0.0.1:1"; then
  ok "a kernel from unreachable gamma fails by name"
else bad "kernel arm64 gamma: exit $rc, output '$out'"; show_err; fi
fetch libc6 arm64 alpha
if ((rc != 0)) && has "alpha has no libc6 for arm64"; then ok "a package missing from a whole index says so"
else bad "libc6 arm64 alpha: exit $rc, output '$out'"; show_err; fi

# 5. A second suite serves what the first cannot, with a warning.
fetch busybox amd64 beta,alpha
if ((rc == 0)) && [[ $(cat "$out" 2>/dev/null) == "busybox of alpha" ]] && has "comes from alpha instead of beta"; then
  ok "busybox falls back from beta to alpha, with a warning"
else bad "busybox amd64 beta,alpha: exit $rc, output '$out'"; show_err; fi

# 6. Once beta's mirror is whole again, the next call wanting beta fetches its index.
cp "$T/beta-Packages.gz.whole" "$T/repo-beta/dists/beta/main/binary-amd64/Packages.gz"
fetch libc6 amd64 beta
if ((rc == 0)) && [[ $(cat "$out/lib/ld-linux-x86-64.so.2" 2>/dev/null) == "loader of beta" ]]; then ok "libc6 from beta once its index is whole"
else bad "libc6 amd64 beta after the repair: exit $rc, output '$out'"; show_err; fi

if ((failures)); then echo "[vm-fetch] $failures checks FAILED" >&2; exit 1; fi
echo "[vm-fetch] all checks passed"
