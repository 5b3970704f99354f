#!/usr/bin/env bash
# Regenerates the kplan package's committed stubs from proto/ with the
# distribution's protoc and grpc_python_plugin (the versions python3-protobuf
# and python3-grpcio run; Debian's python3-grpc-tools bundles a protoc too old
# for proto3 `optional`). Run after any change under proto/; the
# python_stubs_test ctest fails while they differ.
#   client/python/gen_stubs.sh [OUT_DIR]   (default: client/python/kplan)
# Layout: kplan/v1/*_pb2.py(i) and service_pb2_grpc.py as the protos name them;
# google.rpc's status and error details and grpc.health.v1 under kplan/_vendor/
# (Debian ships neither googleapis-common-protos nor grpcio-health-checking;
# kplan prefers them when installed). The vendored files are compiled from a
# copy at their package path, so nothing here creates a top-level `grpc` or
# `google.rpc` package.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:-$root/client/python/kplan}
plugin=$(command -v grpc_python_plugin)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

gen() {  # gen PROTO_ROOT FILE... -> $work/gen
  local from=$1
  shift
  (cd "$from" && protoc -I. --python_out="$work/gen" --pyi_out="$work/gen" \
    --grpc_python_out="$work/gen" --plugin=protoc-gen-grpc_python="$plugin" "$@")
}
mkdir -p "$work/gen" "$work/vendor/kplan/_vendor/google_rpc" "$work/vendor/kplan/_vendor/health"
gen "$root/proto" kplan/v1/config.proto kplan/v1/plan.proto kplan/v1/service.proto
cp "$root/proto/google/rpc/status.proto" "$root/proto/google/rpc/error_details.proto" \
  "$work/vendor/kplan/_vendor/google_rpc/"
cp "$root/proto/grpc/health/v1/health.proto" "$work/vendor/kplan/_vendor/health/"
gen "$work/vendor" kplan/_vendor/google_rpc/status.proto kplan/_vendor/google_rpc/error_details.proto \
  kplan/_vendor/health/health.proto
# Only services get a _grpc module worth keeping.
find "$work/gen" -name '*_pb2_grpc.py' ! -name service_pb2_grpc.py ! -name health_pb2_grpc.py -delete

for d in v1 _vendor _vendor/google_rpc _vendor/health; do
  mkdir -p "$out/$d"
  rm -f "$out/$d"/*_pb2.py "$out/$d"/*_pb2.pyi "$out/$d"/*_pb2_grpc.py
  cp "$work/gen/kplan/$d"/*_pb2* "$out/$d/" 2>/dev/null || true
  [ -f "$out/$d/__init__.py" ] || : >"$out/$d/__init__.py"
done
