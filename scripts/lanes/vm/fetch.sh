#!/usr/bin/env bash
# Downloads Debian packages from any suite with a private apt configuration,
# so the machine's own sources, lists and caches stay as they are.
#
#   scripts/lanes/vm/fetch.sh CACHE kernel ARCH SUITE   -> prints the path of the kernel image
#   scripts/lanes/vm/fetch.sh CACHE libc6 ARCH SUITE    -> prints a directory with that glibc's
#                                                          lib/ (ld.so, libc.so.6, libm.so.6...)
#   scripts/lanes/vm/fetch.sh CACHE busybox ARCH SUITE  -> prints the path of busybox-static's binary
#   scripts/lanes/vm/fetch.sh CACHE qemu-user ARCH SUITE -> prints the path of that suite's
#                                                          qemu-x86_64 (static-pie from trixie
#                                                          on: it runs on older hosts unpacked)
#
# SUITE may also be a comma-separated list (bookworm,trixie): the first that
# serves the package does, with a warning when it is not the first.
#
# CACHE is a directory in the build tree. Its apt/ holds the configuration,
# package lists and downloaded .debs; a package already there is never
# fetched again, so a fresh machine downloads each one once. The lists are
# fetched once too (delete CACHE/apt/lists to refresh them), and again when a
# package is wanted from a suite whose index is missing, or a download fails
# (the mirror may have moved on). Every suite is [trusted=yes]: the machine's
# keyring may lack the newer suites' keys, and the lane only unpacks these
# packages into a scratch tree.
#
# The configuration is apt's whole configuration (APT_CONFIG=CACHE/apt/apt.conf,
# with its own empty parts directories): nothing of the machine's
# /etc/apt/apt.conf.d (apt-file's Contents, appstream's DEP-11, ...) and only
# the Packages index of each suite and architecture. Failed downloads are
# retried (Acquire::Retries), and so is `apt-get update` while an index is
# missing. apt-get update exits 100 when any index failed, even when every
# other arrived (and apt drops every new index of a suite when one of its
# files fails, e.g. "File has unexpected size ... Mirror sync in progress?"):
# a suite whose index cannot be had is a warning that names it, and only a
# package that is wanted from it fails, naming the suite, arch and package.
#
# ARCH is amd64 or arm64; SUITE one of bullseye bookworm trixie sid experimental.
# For a kernel it follows linux-image-cloud-ARCH of that suite down to the
# package that holds the image: linux-image-VERSION-cloud-ARCH-unsigned up to
# 6.x, linux-binary-VERSION-cloud-ARCH from 7.x (where linux-image-... is a
# meta package and the image sits at usr/lib/modules/VERSION/vmlinuz).
#
# Settings (environment), mostly for scripts/lanes/vm/fetch_test.sh:
#   VM_FETCH_SOURCES         a sources.list to use instead of deb.debian.org's five suites
#   VM_FETCH_RETRIES         Acquire::Retries (default 5)
#   VM_FETCH_UPDATE_ATTEMPTS apt-get update runs while an index is missing (default 3)
#   VM_FETCH_RETRY_DELAY     seconds before the second of those runs, twice that before
#                            the third... (default 20: a mirror mid-sync gets a minute)
set -euo pipefail

CACHE=$1 WHAT=$2 ARCH=$3 SUITES=$4
case $WHAT in
  kernel) PACKAGE=linux-image-cloud-$ARCH ;;
  libc6) PACKAGE=libc6 ;;
  busybox) PACKAGE=busybox-static ;;
  qemu-user) PACKAGE=qemu-user ;;
  *) echo "fetch: unknown kind '$WHAT' (kernel, libc6, busybox or qemu-user)" >&2; exit 2 ;;
esac
ATTEMPTS=${VM_FETCH_UPDATE_ATTEMPTS:-3}
DELAY=${VM_FETCH_RETRY_DELAY:-20}
mkdir -p "$CACHE" && CACHE=$(cd "$CACHE" && pwd)  # apt resolves relative Dir:: paths elsewhere
APT=$CACHE/apt
ETC=$APT/etc
mkdir -p "$APT/lists/partial" "$APT/cache/archives/partial" "$APT/debs" \
  "$ETC/apt.conf.d" "$ETC/sources.list.d" "$ETC/preferences.d" "$APT/state"
[[ -e $APT/state/status ]] || : >"$APT/state/status"

# Several lanes may call this at once: one apt at a time on this cache.
exec 9>"$APT/lock"
flock 9

sources=$(if [[ -n ${VM_FETCH_SOURCES:-} ]]; then cat "$VM_FETCH_SOURCES"; else
  for s in bullseye bookworm trixie sid experimental; do
    echo "deb [arch=amd64,arm64 trusted=yes] http://deb.debian.org/debian $s main"
  done; fi)
if [[ $(cat "$APT/sources.list" 2>/dev/null) != "$sources" ]]; then
  echo "$sources" >"$APT/sources.list"
  rm -f "$APT/updated"
fi
# Read before any part or main file, and it moves both into $ETC, where
# nothing else is. The keyrings stay the machine's.
cat >"$APT/apt.conf" <<EOF
// Written by scripts/lanes/vm/fetch.sh, which runs apt with APT_CONFIG=this file.
Dir::Etc "$ETC/";
Dir::Etc::main "apt.conf";
Dir::Etc::parts "apt.conf.d";
Dir::Etc::sourcelist "$APT/sources.list";
Dir::Etc::sourceparts "sources.list.d";
Dir::Etc::preferences "preferences";
Dir::Etc::preferencesparts "preferences.d";
Dir::Etc::trusted "/etc/apt/trusted.gpg";
Dir::Etc::trustedparts "/etc/apt/trusted.gpg.d/";
// An empty dpkg status of its own: the machine's changes whenever a package
// is installed, and each change made every apt-cache call rebuild the cache
// of all ten indexes (~180 MB).
Dir::State "$APT/state/";
Dir::State::status "$APT/state/status";
Dir::State::Lists "$APT/lists/";
Dir::Cache "$APT/cache/";
Dir::Cache::pkgcache "$APT/cache/pkgcache.bin";
Dir::Cache::srcpkgcache "";
APT::Architectures { "amd64"; "arm64"; };
APT::Sandbox::User "root";
// Only the Packages indexes: no Translations, Contents or DEP-11.
Acquire::Languages "none";
Acquire::IndexTargets::deb::Translations::DefaultEnabled "false";
Acquire::PDiffs "false";
Acquire::GzipIndexes "true";
Acquire::Retries "${VM_FETCH_RETRIES:-5}";
Acquire::http::Timeout "60";
// A mirror or snapshot behind the archive serves packages just as well.
Acquire::Check-Valid-Until "false";
Acquire::Check-Date "false";
EOF
export APT_CONFIG=$APT/apt.conf
q=(-q)

# "SUITE/COMPONENT ARCH" for every index the sources promise; those apt has
# loaded; the promised ones it has not.
promised() {
  sed -e 's/#.*//' -e 's/\[[^]]*\]//' <<<"$sources" | awk '$1=="deb"{for(i=4;i<=NF;i++) print $3"/"$i}' |
    while read -r sc; do echo "$sc amd64"; echo "$sc arm64"; done
}
loaded() { apt-cache "${q[@]}" policy 2>/dev/null | sed -n 's/^ *-\?[0-9]\+ [^ ]\+ \([^ ]\+ [^ ]\+\) Packages$/\1/p'; }
missing() { comm -23 <(promised | sort -u) <(loaded | sort -u); }
# missing's answer, asked once per update (apt-cache policy is slow on a busy machine).
gone= gone_known=
has_index() {  # suite
  [[ -n $gone_known ]] || { gone=$(missing); gone_known=1; }
  ! grep -qxF "$1/main $ARCH" <<<"$gone"
}
# What apt said about SUITE in the last update.
apt_said() {  # suite
  awk -v s="$1" '/^(Err|E|W):/ && (index($0, "/dists/" s "/") || index($0, " " s " ")) {print "    " $0; p=1; next}
                 p && /^  / {print "    " $0; next} {p=0}' "$APT/update.log" | head -n 6
}
# apt-get update, run again (bounded) while an index is missing: any, or
# the one wanted ("SUITE/main ARCH").
refreshed=
update() {  # reason [wanted]
  local attempt rc
  refreshed=1
  for ((attempt = 1; ; attempt++)); do
    echo "fetch: apt-get update ($1; attempt $attempt of $ATTEMPTS; private lists in $APT/lists)" >&2
    rc=0
    apt-get "${q[@]}" update >"$APT/update.log" 2>&1 || rc=$?
    gone=$(missing)
    if [[ -n ${2:-} ]]; then grep -qxF "$2" <<<"$gone" || break; else [[ -z $gone ]] && break; fi
    ((attempt < ATTEMPTS)) || break
    echo "fetch: apt-get update exited $rc; missing: $(tr '\n' ' ' <<<"$gone"); again in $((DELAY * attempt))s" >&2
    sleep $((DELAY * attempt))
  done
  date -u >"$APT/updated"
  gone_known=1
  local s
  for s in $(sed -n 's,/.*,,p' <<<"$gone" | sort -u); do
    echo "fetch: warning: no package index of $s for $(awk -v s="$s" 'index($1, s "/") == 1 {print $2}' <<<"$gone" | xargs)" \
      "after $attempt attempts (apt-get update exited $rc); a package wanted from $s will fail," \
      "those from other suites are unaffected. apt said:" >&2
    apt_said "$s" >&2
  done
}
[[ -f $APT/updated ]] || update "first use of $APT"

# The version of PACKAGE that SUITE serves (for ARCH).
version_in() {  # suite package
  apt-cache "${q[@]}" madison "$2:$ARCH" 2>/dev/null |
    awk -F'|' -v s="$1" '$3 ~ (" "s"/") {gsub(/ /,"",$2); print $2; exit}'
}
# The first of PACKAGE's dependencies whose name matches REGEX. From its
# Depends field: apt-cache depends takes seconds of CPU here, show does not.
depends_on() {  # package version regex
  apt-cache "${q[@]}" show "$1:$ARCH=$2" 2>/dev/null | sed -n 's/^Depends: //p' | head -n1 |
    tr ',|' '\n\n' | sed 's/^ *//; s/[ (:].*//' | grep -E "$3" | head -n1
}
# Sets pkg and version: what to download of $WHAT from SUITE, or says why not.
resolve() {  # suite
  local s=$1 v image iv binary
  if ! has_index "$s"; then
    echo "fetch: cannot get $PACKAGE ($ARCH) from $s: its $ARCH package index could not be downloaded" \
      "(see $APT/update.log)" >&2
    apt_said "$s" >&2
    return 1
  fi
  v=$(version_in "$s" "$PACKAGE")
  [[ -n $v ]] || { echo "fetch: $s has no $PACKAGE for $ARCH" >&2; return 1; }
  pkg=$PACKAGE version=$v
  [[ $WHAT == kernel ]] || return 0
  image=$(depends_on "$PACKAGE" "$v" "^linux-image-[0-9]")
  [[ -n $image ]] || { echo "fetch: $s: $PACKAGE=$v ($ARCH) depends on no linux-image-*" >&2; return 1; }
  iv=$(version_in "$s" "$image")
  [[ -n $iv ]] || { echo "fetch: $s has no $image for $ARCH (which $PACKAGE=$v depends on)" >&2; return 1; }
  binary=$(depends_on "$image" "$iv" "^linux-binary-[0-9]" || true)
  if [[ -n $binary ]]; then
    pkg=$binary
  elif apt-cache "${q[@]}" show "$image-unsigned:$ARCH=$iv" >/dev/null 2>&1; then
    pkg=$image-unsigned
  else
    pkg=$image
  fi
  version=$iv
}
# Downloads pkg=version once; sets deb to the .deb's path.
download() {  # suite
  # apt names files with the epoch's colon escaped.
  deb=$APT/debs/${pkg}_${version//:/%3a}_$ARCH.deb
  [[ -s $deb ]] && return 0
  echo "fetch: downloading $pkg:$ARCH=$version from $1" >&2
  (cd "$APT/debs" && apt-get "${q[@]}" download "$pkg:$ARCH=$version" >&2) && [[ -s $deb ]] && return 0
  echo "fetch: cannot download $pkg:$ARCH=$version from $1" >&2
  return 1
}
# The first suite of SUITES that has the package: sets suite, pkg, version, deb.
get() {
  local s first=${SUITES%%,*}
  for s in ${SUITES//,/ }; do
    if ! has_index "$s" && [[ -z $refreshed ]]; then
      update "$s has no $ARCH index yet" "$s/main $ARCH"
    fi
    if resolve "$s"; then
      if ! download "$s" && [[ -z $refreshed ]]; then
        update "the download failed; the index may be out of date"
        resolve "$s" && download "$s" || continue
      elif [[ ! -s $deb ]]; then
        continue
      fi
      [[ $s == "$first" ]] || echo "fetch: warning: $PACKAGE ($ARCH) comes from $s instead of $first" >&2
      suite=$s
      return 0
    fi
  done
  echo "fetch: FAILED: no suite of '$SUITES' gives $PACKAGE for $ARCH (the reason is above)" >&2
  return 1
}
get

case $WHAT in
  kernel)
    out=$CACHE/kernel/$ARCH-$suite
    if [[ ! -s $out/image || $(cat "$out/package" 2>/dev/null) != "$pkg $version" ]]; then
      rm -rf "$out" && mkdir -p "$out/x"
      dpkg-deb -x "$deb" "$out/x"
      vmlinuz=$(find "$out/x" \( -path '*/boot/vmlinuz-*' -o -path '*/usr/lib/modules/*/vmlinuz' \) | head -n1)
      [[ -s $vmlinuz ]] || { echo "fetch: no vmlinuz in $deb" >&2; exit 1; }
      # qemu-system-aarch64 boots an uncompressed arm64 Image only.
      if gzip -t "$vmlinuz" 2>/dev/null; then gunzip -c "$vmlinuz" >"$out/image"; else cp "$vmlinuz" "$out/image"; fi
      echo "$pkg $version" >"$out/package"
      rm -rf "$out/x"
    fi
    echo "$out/image"
    ;;
  libc6)
    out=$CACHE/glibc/$ARCH-$suite
    if [[ ! -s $out/version || $(cat "$out/version") != "$version" ]]; then
      rm -rf "$out" && mkdir -p "$out/x" "$out/lib"
      dpkg-deb -x "$deb" "$out/x"
      # The loader and the libraries, wherever this release keeps them
      # (lib/ARCH-linux-gnu, usr/lib/ARCH-linux-gnu, lib64).
      find "$out/x" \( -name 'ld-linux-*.so.*' -o -name 'libc.so.6' -o -name 'libm.so.6' \
                      -o -name 'libpthread.so.0' -o -name 'libdl.so.2' -o -name 'librt.so.1' \) \
        \( -type f -o -type l \) -exec cp -L {} "$out/lib/" \;
      ls "$out"/lib/ld-linux-* >/dev/null || { echo "fetch: no dynamic loader in $deb" >&2; exit 1; }
      echo "$version" >"$out/version"
      rm -rf "$out/x"
    fi
    echo "$out"
    ;;
  busybox)
    out=$CACHE/busybox/$ARCH-$suite
    if [[ ! -s $out/busybox || $(cat "$out/version" 2>/dev/null) != "$version" ]]; then
      rm -rf "$out" && mkdir -p "$out/x"
      dpkg-deb -x "$deb" "$out/x"
      find "$out/x" -name busybox -type f -perm -u+x -exec cp {} "$out/busybox" \;
      [[ -s $out/busybox ]] || { echo "fetch: no busybox in $deb" >&2; exit 1; }
      echo "$version" >"$out/version"
      rm -rf "$out/x"
    fi
    echo "$out/busybox"
    ;;
  qemu-user)
    # Only the x86-64 emulator: the RDPID lane runs x86-64 tests on a CPU
    # model (-cpu max) that has the instruction the host may lack.
    out=$CACHE/qemu-user/$ARCH-$suite
    if [[ ! -s $out/qemu-x86_64 || $(cat "$out/version" 2>/dev/null) != "$version" ]]; then
      rm -rf "$out" && mkdir -p "$out/x"
      dpkg-deb -x "$deb" "$out/x"
      [[ -x $out/x/usr/bin/qemu-x86_64 ]] || { echo "fetch: no usr/bin/qemu-x86_64 in $deb" >&2; exit 1; }
      cp "$out/x/usr/bin/qemu-x86_64" "$out/qemu-x86_64"
      echo "$version" >"$out/version"
      rm -rf "$out/x"
    fi
    echo "$out/qemu-x86_64"
    ;;
esac
