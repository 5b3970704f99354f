// Guards the server's mappings of client shared memory against SIGBUS. A
// client may truncate its POSIX object at any time; touching a page past the
// object's new end then raises SIGBUS, which would end the whole server. A
// guarded mapping that faults is replaced, in the signal handler, by
// private zero pages over its whole range (as Wayland's wl_shm does) and
// marked lost: the faulting read sees zeros, writes go nowhere, and the
// owner (ShmRegion::CheckIntact, a channel's thread) sees it lost and stops
// using it. A SIGBUS outside every guarded mapping (or not a fault past an
// object's end: a machine check, a kill) goes to the handler that was
// installed before, or ends the process as it would have.
//
// Not covered: a mapping page-locked for the GPUs (cudaHostRegister) keeps
// its old pages for the GPU's copies, which therefore never fault; a
// client that truncates such an object and grows it again makes the GPU
// and the CPU see different memory from then on. That hurts only the
// client's own calls.
#pragma once

#include <cstddef>

namespace kplan {

// Guards [addr, addr + bytes) until ShmUnguard; installs the handler the
// first time. Returns the guard's slot, or -1 when all 1024 are taken (the
// registry then refuses the mapping: ShmRegistry::Register).
int ShmGuard(void* addr, size_t bytes);
// Before the mapping is unmapped; -1: nothing.
void ShmUnguard(int slot);
// Whether the mapping of guard `slot` faulted and was replaced (false for -1).
bool ShmMappingLost(int slot);

}  // namespace kplan
