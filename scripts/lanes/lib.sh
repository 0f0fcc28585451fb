# Sourced by the lane scripts in this directory, after they set REPO and LANE.

say() { echo "[$LANE] $*"; }
die() { echo "[$LANE] FAILED: $*" >&2; exit 1; }

# Installs the Debian packages named that are missing (as root), or says
# which to install.
need_packages() {
  local p missing=()
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  ((${#missing[@]})) || return 0
  [[ $(id -u) -eq 0 ]] || die "missing packages; run: apt-get install -y ${missing[*]}"
  say "installing ${missing[*]}"
  apt-get update -q >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
}

# --- The VM lanes (aarch64-system, kernels) ------------------------------
# Kernels, glibcs and busybox come from Debian through fetch.sh's private apt
# configuration, into one cache that every build directory shares (VM_CACHE
# points a worktree at another checkout's cache instead of downloading again).
VM_CACHE=${VM_CACHE:-$REPO/build/kernels-cache}
# fetch.sh warns about a suite whose index cannot be had and fails only for a
# package wanted from it, saying which (suite, arch, package).
fetch() {  # kernel|libc6|busybox ARCH SUITE[,SUITE...] -> path (see fetch.sh)
  "$REPO/scripts/lanes/vm/fetch.sh" "$VM_CACHE" "$@" || die "cannot fetch $1 for $2 from $3 (fetch.sh said why above)"
}
debarch() { [[ $1 == x86_64 ]] && echo amd64 || echo arm64; }

# An initramfs tree at ROOT for ARCH: Debian's static busybox and the lanes'
# /init (vm/init.sh); the lane adds its programs and /lane/runs.
vm_root() {  # ROOT ARCH
  rm -rf "$1"
  mkdir -p "$1/bin" "$1/lane"
  # Any suite's static busybox runs /init: bookworm's, or trixie's when
  # bookworm's index cannot be had.
  cp "$(fetch busybox "$(debarch "$2")" bookworm,trixie)" "$1/bin/busybox"
  cp "$REPO/scripts/lanes/vm/init.sh" "$1/init"
  chmod +x "$1/init" "$1/bin/busybox"
}
vm_pack() {  # ROOT OUT.cpio.gz
  (cd "$1" && find . | LC_ALL=C sort | cpio -o -H newc --quiet -R 0:0 | gzip -1) >"$2"
}

# Boots KERNEL with INITRD on two CPUs and prints the serial console; the
# rest of the arguments join the kernel command line. Returns qemu's status,
# or timeout's when qemu took longer than LIMIT seconds.
vm_boot() {  # ARCH KERNEL INITRD LIMIT [KERNEL_ARG...]
  local arch=$1 kernel=$2 initrd=$3 limit=$4 qemu console
  shift 4
  if [[ $arch == aarch64 ]]; then
    qemu=(qemu-system-aarch64 -M virt -cpu "${VM_AARCH64_CPU:-max}") console=ttyAMA0
  else
    qemu=(qemu-system-x86_64 -accel tcg -cpu max -M pc) console=ttyS0
  fi
  # -nic none: the VMs need no network, and qemu's default NIC wants an
  # option ROM (efi-virtio.rom, efi-e1000.rom) from ipxe-qemu, which an
  # install without recommends lacks ("failed to find romfile").
  timeout --kill-after=10 "$limit" "${qemu[@]}" -smp 2 -m 1024 -display none -no-reboot \
    -nic none -monitor none -serial stdio -kernel "$kernel" -initrd "$initrd" \
    -append "console=$console panic=-1 loglevel=4 rdinit=/init TAG=$LANE $*" </dev/null 2>&1 |
    tr -d '\r'
  return "${PIPESTATUS[0]}"
}
