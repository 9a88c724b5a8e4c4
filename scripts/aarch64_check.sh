#!/usr/bin/env bash
# The golden trajectories on aarch64, under emulation (docs/PORTABILITY.md, "aarch64").
# Debian's qemu-user-static runs an arm64 Debian userland in a chroot with torch's aarch64
# wheel (a CUDA build: only its CPU runtime runs here). Run as root on a Debian/Ubuntu x86
# host:
#   scripts/aarch64_check.sh setup      # qemu, debootstrap, python3 + venv, torch, numpy, ...
#   scripts/aarch64_check.sh run [ARGS] # copies this checkout in, builds the C extension,
#                                       # runs scripts/portability_check.py --inside ARGS
# ROOT (default /tmp/arm64) is the chroot; TORCH (default 2.13.0) the torch release.
# Emulation is 10-50x slower than the host: run it under nohup with a log.
set -euo pipefail
ROOT=${ROOT:-/tmp/arm64}
TORCH=${TORCH:-2.13.0}
HERE=$(cd "$(dirname "$0")/.." && pwd)
DEPS="numpy pyarrow tokenizers tiktoken zstandard fsspec click safetensors tqdm cryptography setuptools wheel"

# arm64 binaries run through qemu: debootstrap checks this before it unpacks anything (on
# a fresh host without it: "E: Unable to execute target architecture").
binfmt() {
  mountpoint -q /proc/sys/fs/binfmt_misc || mount binfmt_misc -t binfmt_misc /proc/sys/fs/binfmt_misc
  update-binfmts --enable qemu-aarch64 >/dev/null 2>&1 || true
}

mounts() {
  binfmt
  mountpoint -q "$ROOT/proc" || mount -t proc proc "$ROOT/proc"
  mountpoint -q "$ROOT/dev" || mount --bind /dev "$ROOT/dev"
  # No sysfs: with the host's x86 /sys mounted, a demo run segfaulted under qemu (torch's
  # oneDNN reads ARM CPU registers from it); without it cpuinfo only warns.
  ! mountpoint -q "$ROOT/sys" || umount "$ROOT/sys"
  cp /etc/resolv.conf "$ROOT/etc/resolv.conf"
  # The host's CA bundle as the chroot's (it may hold a proxy's CA that Debian's lacks;
  # pip's truststore reads the system bundle, not PIP_CERT).
  [ -f /etc/ssl/certs/ca-certificates.crt ] && mkdir -p "$ROOT/etc/ssl/certs" &&
    cp /etc/ssl/certs/ca-certificates.crt "$ROOT/etc/ssl/certs/host-ca.crt" || true
}

case ${1:-} in
  setup)
    DEBIAN_FRONTEND=noninteractive apt-get install -y qemu-user-static binfmt-support debootstrap
    binfmt
    [ -x "$ROOT/usr/bin/apt-get" ] ||
      debootstrap --arch=arm64 --variant=minbase bookworm "$ROOT" http://deb.debian.org/debian
    mounts
    chroot "$ROOT" /usr/bin/env DEBIAN_FRONTEND=noninteractive bash -c \
      "apt-get update && apt-get install -y python3 python3-venv python3-dev gcc ca-certificates"
    cp "$ROOT/etc/ssl/certs/host-ca.crt" "$ROOT/etc/ssl/certs/ca-certificates.crt"
    chroot "$ROOT" bash -c "[ -x /venv/bin/python ] || python3 -m venv /venv"
    # torch's aarch64 wheel on PyPI is a CUDA build whose import loads the CUDA libraries
    # (nvidia-* wheels, ~3 GB): pip under emulation needs an hour to unpack them, so the
    # host's pip downloads every wheel for aarch64 / CPython 3.11 and unpacks them into the
    # chroot's venv at native speed (a wheel is a zip: unpacking is the same on any host).
    PLAT=""
    for t in manylinux_2_28 manylinux_2_27 manylinux_2_26 manylinux_2_25 manylinux_2_24 \
             manylinux_2_18 manylinux_2_17 manylinux2014 linux; do
      PLAT="$PLAT --platform ${t}_aarch64"; done
    HOSTPIP="env -u PIP_FIND_LINKS pip --isolated --cert /etc/ssl/certs/ca-certificates.crt"
    mkdir -p "$ROOT/wheels"
    $HOSTPIP download -q $PLAT --python-version 3.11 --implementation cp --only-binary=:all: \
      -d "$ROOT/wheels" "torch==$TORCH" $DEPS
    $HOSTPIP install -q --no-deps $PLAT --python-version 3.11 --implementation cp \
      --only-binary=:all: --upgrade --target "$ROOT/venv/lib/python3.11/site-packages" \
      "$ROOT"/wheels/*.whl
    chroot "$ROOT" /venv/bin/python -c \
      "import platform, torch, numpy; print(platform.machine(), torch.__version__, numpy.__version__)"
    ;;
  run)
    shift
    mounts
    rm -rf "$ROOT/open1b"; mkdir -p "$ROOT/open1b"
    (cd "$HERE" && git ls-files -z | xargs -0 tar cf - | tar xf - -C "$ROOT/open1b")
    chroot "$ROOT" bash -c "cd /open1b && /venv/bin/python setup.py -q build_ext --inplace"
    chroot "$ROOT" /usr/bin/env PYTHONPATH=/open1b bash -c \
      "cd /open1b && /venv/bin/python scripts/portability_check.py --inside $*"
    ;;
  *) sed -n '2,10p' "$0"; exit 2 ;;
esac
