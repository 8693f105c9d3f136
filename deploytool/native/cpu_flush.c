/* Cache flush between cold CPU timings (deploytool/cpuflush.py). TVM's cache_flush_cpu_non_first_arg
 * evicts with CLFLUSH, which Intel's server cores run at ~145 ns a line (measured on a Xeon Emerald
 * Rapids VM: 360 ms for a 151 MB weight, 20 ms for 9 MB). CLFLUSHOPT evicts the same lines, unordered
 * among themselves, at ~2.4 ns a line there (6 ms and 0.5 ms); the SFENCE orders them before the
 * timed call. */
#include <stddef.h>
#include <stdint.h>
#include <immintrin.h>

__attribute__((target("clflushopt"))) void deploytool_flush(void *const *ptrs, const size_t *nbytes, int n) {
  for (int k = 0; k < n; ++k) {
    const char *p = (const char *)((uintptr_t)ptrs[k] & ~(uintptr_t)63);
    const char *end = (const char *)ptrs[k] + nbytes[k];
    for (; p < end; p += 64) _mm_clflushopt(p);
  }
  _mm_sfence();
}
