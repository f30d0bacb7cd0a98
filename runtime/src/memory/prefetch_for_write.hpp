// prefetch_for_write(): asks for a cache line in the exclusive state, ahead of a write.
#pragma once

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

namespace ferry::detail {

#if defined(__x86_64__) || defined(__i386__)
// PREFETCHW (CPUID 0x80000001 ECX bit 8). Without -mprfchw, GCC compiles a write prefetch
// to PREFETCHT0, a read: the line then arrives shared and the write still waits for
// ownership, which is slower than no prefetch at all.
inline const bool kHasPrefetchW = [] {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return __get_cpuid(0x80000001u, &eax, &ebx, &ecx, &edx) != 0 && (ecx & (1u << 8)) != 0;
}();
#endif

/// Starts taking ownership of the cache line holding `address` (invalidating copies in other
/// CPUs' caches) without waiting: a hint with no effect on what the program computes.
inline void prefetch_for_write(const void* address) noexcept {
#if defined(__x86_64__) || defined(__i386__)
  if (kHasPrefetchW) asm volatile("prefetchw %0" : : "m"(*static_cast<const char*>(address)));
#else
  __builtin_prefetch(address, 1, 3);
#endif
}

}  // namespace ferry::detail
