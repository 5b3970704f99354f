#!/usr/bin/env bash
# Installs the distribution packages kplan builds and tests with (Debian 12,
# Ubuntu 24.04). Nothing is downloaded outside the package manager. The CUDA
# toolkit (with NCCL) is optional: when /usr/local/cuda exists the GPU code
# is built too.
set -euo pipefail
packages=(
  build-essential cmake ninja-build pkg-config git ccache
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler libcli11-dev
  libabsl-dev libspdlog-dev libssl-dev nlohmann-json3-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  python3 python3-grpcio python3-protobuf python3-numpy python3-yaml
  python3-venv python3-setuptools python3-wheel  # the kplan Python package, installed in a venv
  python3-jsonpatch  # tests/deploy renders the kustomize overlays with it
  prometheus-cpp-dev patchelf openssl
  clang  # scripts/sanitize.sh and the fuzz targets (its libFuzzer runtime below)
  clang-format  # scripts/format.sh --check in scripts/test.sh
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# The sanitizer and libFuzzer runtimes of the distribution's clang
# (libclang-rt-14-dev on Debian 12, -18- on Ubuntu 24.04).
clang_major=$(clang -dumpversion 2>/dev/null | cut -d. -f1)
if [ -n "$clang_major" ]; then
  p=libclang-rt-$clang_major-dev
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
fi
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all packages present"
  exit 0
fi
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
echo "install-deps: installing ${missing[*]}"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
# clang was just installed: its runtime too.
if [ -z "$clang_major" ] && command -v clang > /dev/null; then
  clang_major=$(clang -dumpversion | cut -d. -f1)
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends \
    "libclang-rt-$clang_major-dev"
fi
