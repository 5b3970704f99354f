// ResolveKernelConfig from the wire: bytes -> v1::ResolveKernelConfigRequest
// -> rpc::ResolveKernelConfig with a fixed local platform (an H200 with no
// kernel libraries but kplan), as the server and `kplan resolve --offline`
// call it.
#include <cstddef>
#include <cstdint>

#include "kplan/v1/service.pb.h"
#include "resolve/platform/platform.h"
#include "resolve/proto/resolve.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kplan;
  static const Platform* local = [] {
    auto* p = new Platform;
    p->kind = PlatformKind::kCuda;
    p->capability = DeviceCapability{9, 0};
    p->device_name = "NVIDIA H200";
    p->libraries = {"kplan"};
    return p;
  }();
  v1::ResolveKernelConfigRequest request;
  if (!request.ParseFromArray(data, static_cast<int>(size))) return 0;
  (void)rpc::ResolveKernelConfig(request, *local);
  return 0;
}
