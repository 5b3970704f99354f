#!/usr/bin/env bash
# Copies binaries and the non-system shared libraries they load (gRPC,
# protobuf, abseil, c-ares, re2, spdlog, fmt, ...) into one folder that runs on
# another machine: DEST/bin/* find DEST/lib through an $ORIGIN rpath. Used for
# the container's runtime stage and for runs on a lent GPU machine. Libraries
# that machine brings itself (glibc, libstdc++, the CUDA driver, cuBLAS, NCCL) stay
# out; the CUDA runtime of the build travels with the binaries.
# usage: scripts/bundle.sh DEST BINARY...
set -euo pipefail
dest=$1
shift
mkdir -p "$dest/bin" "$dest/lib"
skip='^(linux-vdso|libc\.|libm\.|libdl\.|librt\.|libpthread\.|ld-linux|libgcc_s\.|libstdc\+\+\.|libcuda\.|libcublas|libnccl\.|libnvidia)'
for bin in "$@"; do
  cp -f "$bin" "$dest/bin/"
  ldd "$bin" | awk '/=> \//{print $1" "$3}' | while read -r name path; do
    if ! [[ $name =~ $skip ]]; then cp -fL "$path" "$dest/lib/$name"; fi
  done
done
if command -v patchelf >/dev/null; then
  for f in "$dest"/bin/*; do patchelf --set-rpath '$ORIGIN/../lib' "$f"; done
else
  # Without patchelf the caller sets LD_LIBRARY_PATH=DEST/lib.
  echo "bundle: patchelf not found; run with LD_LIBRARY_PATH=$dest/lib" >&2
fi
