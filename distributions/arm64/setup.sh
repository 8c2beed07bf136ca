#!/usr/bin/env bash
# An aarch64 Python and the agent's aarch64 dependencies, run under QEMU user-mode emulation: the agent on Arm64 proven
# without Arm hardware (tests/e2e/test_arm64_agent.py). Debian's qemu-user-static and arm64 packages, PyPI's aarch64
# wheels; nothing is installed into the host's Python.
#
#   bash distributions/arm64/setup.sh [OUT_DIR] [AGENT_WHEEL]      (as root; .ci/run runs it)
#
# OUT_DIR (default var/arm64) gets root/ (an arm64 sysroot: Debian's python3.11 and the libraries it and the wheels link
# against), wheelhouse/ (the agent wheel's dependencies for manylinux aarch64; kiln-contract, pure Python, comes from the
# agent wheel's folder and is not kept) and .ready when both are complete.
# Each step is skipped when its result is already there, so a second run takes a second.
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT="${1:-var/arm64}"
WHEEL="${2:-$(ls dist/kiln_agent-*.whl 2>/dev/null | tail -1)}"
PYTHON="${KILN_PYTHON:-.venv/bin/python}"
[[ -x "$PYTHON" ]] || PYTHON="$(command -v python3)"
export DEBIAN_FRONTEND=noninteractive
# Debian's arm64 python3.11 and what it, numpy and onnxruntime load (libstdc++, libgcc_s); nothing else runs in it.
PACKAGES="libc6 libgcc-s1 libstdc++6 gcc-12-base libexpat1 zlib1g libffi8 libssl3 libbz2-1.0 liblzma5 libsqlite3-0 libuuid1
  libncursesw6 libtinfo6 libreadline8 libcrypt1 libnsl2 libtirpc3 libgssapi-krb5-2 libk5crypto3 libkeyutils1 libkrb5-3
  libkrb5support0 libcom-err2 libdb5.3 libzstd1 python3.11-minimal libpython3.11-minimal libpython3.11-stdlib"

log() { printf '[arm64] %s\n' "$*"; }

if [[ -z "$WHEEL" || ! -f "$WHEEL" ]]; then
  echo "no agent wheel: build it first (make wheels), or pass its path" >&2
  exit 2
fi
mkdir -p "$OUT/debs" "$OUT/root" "$OUT/wheelhouse"

if ! command -v qemu-aarch64-static >/dev/null 2>&1; then
  log "installing qemu-user-static"
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends qemu-user-static >/dev/null
fi

if [[ ! -x "$OUT/root/usr/bin/python3.11" ]]; then
  if ! dpkg --print-foreign-architectures | grep -qx arm64; then
    log "adding the arm64 architecture to apt (packages are only downloaded, never installed)"
    dpkg --add-architecture arm64
    apt-get update -qq
  fi
  log "downloading Debian's arm64 python3.11"
  (cd "$OUT/debs" && apt-get download -qq $(for package in $PACKAGES; do echo "$package:arm64"; done) 2>&1 | grep -v "^W: Download is performed unsandboxed" || true)
  for deb in "$OUT"/debs/*.deb; do dpkg-deb -x "$deb" "$OUT/root"; done
fi

# QEMU opens a path under -L's prefix first when it exists there. Under QEMU 7 an emulated process would otherwise read
# the x86 host's /proc/cpuinfo, which ONNX Runtime's CPU probe (cpuinfo) cannot parse and crashes on; an Arm-format one
# with one entry per host CPU (as QEMU 8 emulates itself) lets it start. ISA features come from HWCAP, not this file.
mkdir -p "$OUT/root/proc"
: > "$OUT/root/proc/cpuinfo"
for cpu in $(seq 0 $(($(nproc) - 1))); do
  printf 'processor\t: %s\nBogoMIPS\t: 50.00\nFeatures\t: fp asimd\nCPU architecture: 8\n\n' "$cpu" >> "$OUT/root/proc/cpuinfo"
done

if [[ ! -f "$OUT/wheelhouse/.for-$(basename "$WHEEL")" ]]; then
  log "downloading the agent's dependencies for manylinux aarch64"
  "$PYTHON" -m pip download -q -d "$OUT/wheelhouse" --only-binary=:all: --python-version 3.11 --implementation cp --abi cp311 \
    --platform manylinux_2_28_aarch64 --platform manylinux_2_27_aarch64 --platform manylinux_2_17_aarch64 --platform manylinux2014_aarch64 \
    --find-links "$(dirname "$WHEEL")" "$WHEEL" 2>&1 | grep -v "is ignored: it is neither a file nor a directory" || true
  rm -f "$OUT"/wheelhouse/kiln_*.whl "$OUT"/wheelhouse/.for-*
  ls "$OUT"/wheelhouse/onnxruntime-*aarch64*.whl >/dev/null
  touch "$OUT/wheelhouse/.for-$(basename "$WHEEL")"
fi

qemu-aarch64-static -L "$OUT/root" "$OUT/root/usr/bin/python3.11" -c 'import platform; assert platform.machine() == "aarch64"'
touch "$OUT/.ready"
log "ready: $OUT (qemu-aarch64-static -L $OUT/root $OUT/root/usr/bin/python3.11)"
