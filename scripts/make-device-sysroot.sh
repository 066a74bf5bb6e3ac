#!/usr/bin/env bash
# Collects the libraries and headers kernelcraft needs that the offline GPU machine (the H200, see
# docs/GPU_MACHINE.md) does not have, into one folder to copy there with the checkout.
#
# Run on a networked Debian 12 machine, from the checkout root:
#   scripts/make-device-sysroot.sh [DEST]          DEST defaults to .device-deps (git-ignored)
#
# What goes in: Debian's RocksDB 7.8 (headers, shared library and its gflags/snappy runtime),
# nlohmann/json, curl's headers, GoogleTest, libelf, capstone and libsodium (headers and shared
# libraries: the CPU binary check and bundle hashing/signing) and libseccomp (header and runtime:
# the evaluation sandbox dlopens libseccomp.so.2, found through LD_LIBRARY_PATH). What is left out
# on purpose: libcurl's runtime (the GPU machine's own libcurl.so.4 is used; Debian's needs
# libraries that machine lacks), the static librocksdb.a (large, unused), and docs/man pages. lz4,
# zstd, zlib and bz2 come from the GPU machine itself.
#
# On the GPU machine scripts/device_run.sh uses DEST as it is: it adds
# DEST/usr/lib/x86_64-linux-gnu to LD_LIBRARY_PATH and passes -DCMAKE_PREFIX_PATH=DEST/usr to CMake.
set -euo pipefail

DEST=${1:-.device-deps}
PACKAGES=(librocksdb-dev librocksdb7.8 libgflags2.2 libsnappy1v5 nlohmann-json3-dev
          libcurl4-openssl-dev libgtest-dev libelf-dev libelf1 libcapstone-dev libcapstone4
          libsodium-dev libsodium23 libseccomp-dev libseccomp2)

die() { echo "make-device-sysroot: $*" >&2; exit 1; }
command -v apt-get >/dev/null && command -v dpkg >/dev/null || die "needs a Debian machine (apt-get, dpkg)"

# apt-get download needs package lists; fetch them only when there are none yet.
if [ -z "$(find /var/lib/apt/lists -maxdepth 1 -name '*_Packages*' -print -quit 2>/dev/null)" ]; then
  apt-get update -qq || die "apt-get update failed (no network, or not root?)"
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
( cd "$work" && apt-get download -q "${PACKAGES[@]}" ) >"$work/download.log" 2>&1 ||
  { cat "$work/download.log" >&2; die "apt-get download failed"; }

rm -rf "$DEST"
mkdir -p "$DEST"
for deb in "$work"/*.deb; do
  dpkg-deb -x "$deb" "$DEST"
done

libdir=$DEST/usr/lib/x86_64-linux-gnu
rm -f "$libdir"/libcurl.so* "$libdir"/libcurl.a "$libdir"/librocksdb.a
rm -rf "$DEST/usr/share/doc" "$DEST/usr/share/man"

[ -f "$DEST/usr/include/rocksdb/db.h" ] || die "rocksdb headers missing from $DEST"
[ -f "$DEST/usr/include/nlohmann/json.hpp" ] || die "nlohmann/json missing from $DEST"
for h in gelf.h capstone/capstone.h sodium.h seccomp.h; do
  [ -f "$DEST/usr/include/$h" ] || die "$h missing from $DEST"
done
echo "$DEST: $(du -sh "$DEST" | cut -f1) ($(ls "$work"/*.deb | wc -l) packages)"
