#!/usr/bin/env bash
# Downloads Debian packages from any suite with a private apt configuration,
# so the machine's own sources, lists and caches stay as they are.
#
#   scripts/lanes/vm/fetch.sh CACHE kernel ARCH SUITE   -> prints the path of the kernel image
#   scripts/lanes/vm/fetch.sh CACHE libc6 ARCH SUITE    -> prints a directory with that glibc's
#                                                          lib/ (ld.so, libc.so.6, libm.so.6...)
#   scripts/lanes/vm/fetch.sh CACHE busybox ARCH SUITE  -> prints the path of busybox-static's binary
#
# CACHE is a directory in the build tree. Its apt/ holds the configuration,
# package lists and downloaded .debs; a package already there is never
# fetched again, so a fresh machine downloads each one once. The lists are
# fetched once too (delete CACHE/apt/lists to refresh them). Every suite is
# [trusted=yes]: the machine's keyring may lack the newer suites' keys, and
# the lane only unpacks these packages into a scratch tree.
#
# ARCH is amd64 or arm64; SUITE one of bullseye bookworm trixie sid experimental.
# For a kernel it follows linux-image-cloud-ARCH of that suite down to the
# package that holds the image: linux-image-VERSION-cloud-ARCH-unsigned up to
# 6.x, linux-binary-VERSION-cloud-ARCH from 7.x (where linux-image-... is a
# meta package and the image sits at usr/lib/modules/VERSION/vmlinuz).
set -euo pipefail

CACHE=$1 WHAT=$2 ARCH=$3 SUITE=$4
mkdir -p "$CACHE" && CACHE=$(cd "$CACHE" && pwd)  # apt resolves relative Dir:: paths elsewhere
APT=$CACHE/apt
mkdir -p "$APT/lists/partial" "$APT/cache/archives/partial" "$APT/debs" "$APT/prefs"
if [[ ! -s $APT/sources.list ]]; then
  for s in bullseye bookworm trixie sid experimental; do
    echo "deb [arch=amd64,arm64 trusted=yes] http://deb.debian.org/debian $s main"
  done >"$APT/sources.list"
fi
opts=(-q -o "Dir::Etc::sourcelist=$APT/sources.list" -o Dir::Etc::sourceparts=-
      -o "Dir::State::Lists=$APT/lists" -o "Dir::Cache=$APT/cache"
      -o "Dir::Cache::pkgcache=$APT/cache/pkgcache.bin" -o "Dir::Cache::srcpkgcache=$APT/cache/srcpkgcache.bin"
      -o "Dir::Etc::preferencesparts=$APT/prefs" -o APT::Architectures::=amd64
      -o APT::Architectures::=arm64 -o Acquire::Languages=none -o APT::Sandbox::User=root)

# Several lanes may call this at once: one apt at a time on this cache.
exec 9>"$APT/lock"
flock 9
if ! ls "$APT"/lists/*_Packages* >/dev/null 2>&1; then
  echo "fetch: apt-get update (private lists in $APT/lists)" >&2
  apt-get "${opts[@]}" update >"$APT/update.log" 2>&1 || { cat "$APT/update.log" >&2; exit 1; }
fi

# The version of PACKAGE that SUITE serves (for ARCH).
version_in_suite() {  # package
  apt-cache "${opts[@]}" madison "$1:$ARCH" 2>/dev/null |
    awk -F'|' -v s="$SUITE" '$3 ~ (" "s"/") {gsub(/ /,"",$2); print $2; exit}'
}
# Downloads PACKAGE=VERSION once; prints the .deb's path.
download() {  # package version
  # apt names files with the epoch's colon escaped.
  local deb=$APT/debs/$1_${2//:/%3a}_$ARCH.deb
  if [[ ! -s $deb ]]; then
    echo "fetch: downloading $1:$ARCH=$2" >&2
    (cd "$APT/debs" && apt-get "${opts[@]}" download "$1:$ARCH=$2" >&2)
    [[ -s $deb ]] || { echo "fetch: apt-get download left no $deb" >&2; exit 1; }
  fi
  echo "$deb"
}
depends_on() {  # package version regex
  apt-cache "${opts[@]}" depends "$1:$ARCH=$2" 2>/dev/null |
    sed -n 's/^ *Depends: \([^:]*\)\(:.*\)\?$/\1/p' | grep -E "$3" | head -n1
}

case $WHAT in
  kernel)
    meta=linux-image-cloud-$ARCH
    v=$(version_in_suite "$meta")
    [[ -n $v ]] || { echo "fetch: $SUITE has no $meta for $ARCH" >&2; exit 1; }
    image=$(depends_on "$meta" "$v" "^linux-image-[0-9]")
    [[ -n $image ]] || { echo "fetch: $meta=$v depends on no linux-image-*" >&2; exit 1; }
    iv=$(version_in_suite "$image")
    binary=$(depends_on "$image" "$iv" "^linux-binary-[0-9]" || true)
    if [[ -n $binary ]]; then
      pkg=$binary
    elif apt-cache "${opts[@]}" show "$image-unsigned:$ARCH=$iv" >/dev/null 2>&1; then
      pkg=$image-unsigned
    else
      pkg=$image
    fi
    deb=$(download "$pkg" "$iv")
    out=$CACHE/kernel/$ARCH-$SUITE
    if [[ ! -s $out/image || $(cat "$out/package" 2>/dev/null) != "$pkg $iv" ]]; then
      rm -rf "$out" && mkdir -p "$out/x"
      dpkg-deb -x "$deb" "$out/x"
      vmlinuz=$(find "$out/x" \( -path '*/boot/vmlinuz-*' -o -path '*/usr/lib/modules/*/vmlinuz' \) | head -n1)
      [[ -s $vmlinuz ]] || { echo "fetch: no vmlinuz in $deb" >&2; exit 1; }
      # qemu-system-aarch64 boots an uncompressed arm64 Image only.
      if gzip -t "$vmlinuz" 2>/dev/null; then gunzip -c "$vmlinuz" >"$out/image"; else cp "$vmlinuz" "$out/image"; fi
      echo "${pkg} ${iv}" >"$out/package"
      rm -rf "$out/x"
    fi
    echo "$out/image"
    ;;
  libc6)
    v=$(version_in_suite libc6)
    [[ -n $v ]] || { echo "fetch: $SUITE has no libc6 for $ARCH" >&2; exit 1; }
    deb=$(download libc6 "$v")
    out=$CACHE/glibc/$ARCH-$SUITE
    if [[ ! -s $out/version || $(cat "$out/version") != "$v" ]]; then
      rm -rf "$out" && mkdir -p "$out/x" "$out/lib"
      dpkg-deb -x "$deb" "$out/x"
      # The loader and the libraries, wherever this release keeps them
      # (lib/ARCH-linux-gnu, usr/lib/ARCH-linux-gnu, lib64).
      find "$out/x" \( -name 'ld-linux-*.so.*' -o -name 'libc.so.6' -o -name 'libm.so.6' \
                      -o -name 'libpthread.so.0' -o -name 'libdl.so.2' -o -name 'librt.so.1' \) \
        \( -type f -o -type l \) -exec cp -L {} "$out/lib/" \;
      ls "$out"/lib/ld-linux-* >/dev/null || { echo "fetch: no dynamic loader in $deb" >&2; exit 1; }
      echo "$v" >"$out/version"
      rm -rf "$out/x"
    fi
    echo "$out"
    ;;
  busybox)
    v=$(version_in_suite busybox-static)
    [[ -n $v ]] || { echo "fetch: $SUITE has no busybox-static for $ARCH" >&2; exit 1; }
    deb=$(download busybox-static "$v")
    out=$CACHE/busybox/$ARCH-$SUITE
    if [[ ! -s $out/busybox || $(cat "$out/version" 2>/dev/null) != "$v" ]]; then
      rm -rf "$out" && mkdir -p "$out/x"
      dpkg-deb -x "$deb" "$out/x"
      find "$out/x" -name busybox -type f -perm -u+x -exec cp {} "$out/busybox" \;
      [[ -s $out/busybox ]] || { echo "fetch: no busybox in $deb" >&2; exit 1; }
      echo "$v" >"$out/version"
      rm -rf "$out/x"
    fi
    echo "$out/busybox"
    ;;
  *) echo "fetch: unknown kind '$WHAT' (kernel, libc6 or busybox)" >&2; exit 2 ;;
esac
