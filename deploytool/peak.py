"""This machine's FP32 peak, measured: the denominator of "% of peak" in `deploytool profile --peak`
and the tuned benchmark. A VM's /proc/cpuinfo may give the base clock while the cores boost higher
(the Zen 5 VM: 2.6 GHz listed, 3.7-4.0 GHz held under AVX-512: 235-254 GFLOP/s a thread), so a nominal threads x clock x
FLOP/cycle can sit far below what kernels reach; a loop of independent FMAs at the target's vector
width, on the threads the model runs with, measures the peak those kernels can reach."""

from __future__ import annotations

from pathlib import Path

_PEAK_C = r"""
#include <immintrin.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#if WIDE
typedef __m512 V;
#define LANES 16
#define FMA _mm512_fmadd_ps
#define SET _mm512_set1_ps
#define SUM _mm512_reduce_add_ps
#else
typedef __m256 V;
#define LANES 8
#define FMA _mm256_fmadd_ps
#define SET _mm256_set1_ps
static float SUM(V v) { float f[8]; _mm256_storeu_ps(f, v); return f[0] + f[7]; }
#endif
static long iters;
static volatile float sink[256];
static void *work(void *arg) {  /* 12 independent FMA chains: more than latency x pipes (4 x 2) */
    long id = (long)arg;
    V b = SET(0.9999f), c = SET(1e-4f);
    V a0 = SET(id), a1 = SET(1), a2 = SET(2), a3 = SET(3), a4 = SET(4), a5 = SET(5), a6 = SET(6),
      a7 = SET(7), a8 = SET(8), a9 = SET(9), a10 = SET(10), a11 = SET(11);
    for (long i = 0; i < iters; i++) {
        a0 = FMA(a0, b, c); a1 = FMA(a1, b, c); a2 = FMA(a2, b, c); a3 = FMA(a3, b, c);
        a4 = FMA(a4, b, c); a5 = FMA(a5, b, c); a6 = FMA(a6, b, c); a7 = FMA(a7, b, c);
        a8 = FMA(a8, b, c); a9 = FMA(a9, b, c); a10 = FMA(a10, b, c); a11 = FMA(a11, b, c);
        __asm__ volatile("" : "+x"(a0), "+x"(a1), "+x"(a2), "+x"(a3), "+x"(a4), "+x"(a5));
    }
    sink[id & 255] = SUM(a0) + SUM(a1) + SUM(a2) + SUM(a3) + SUM(a4) + SUM(a5) + SUM(a6) + SUM(a7)
                     + SUM(a8) + SUM(a9) + SUM(a10) + SUM(a11);
    return 0;
}
int main(int argc, char **argv) {
    int n = atoi(argv[1]);
    iters = atol(argv[2]);
    pthread_t t[256];
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (long i = 0; i < n; i++) pthread_create(&t[i], 0, work, (void *)i);
    for (int i = 0; i < n; i++) pthread_join(t[i], 0);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double s = (t1.tv_sec - t0.tv_sec) + 1e-9 * (t1.tv_nsec - t0.tv_nsec);
    printf("%.3f\n", 2.0 * 12 * LANES * iters * n / s / 1e9);
    return 0;
}
"""


def measured_peak_gflops(threads: int, avx512: bool, seconds: float = 0.3, runs: int = 5) -> float | None:
    """This machine's FP32 peak as a loop of independent FMAs measures it: ``threads`` threads,
    the target's vector width (AVX-512 or AVX2), the clock the cores hold under that load (a VM's
    /proc/cpuinfo may give the base clock while the cores boost higher). The best of ``runs`` runs
    of about ``seconds`` each; None where it can't be built or run here (no gcc, not x86, or the
    ISA missing)."""
    import platform
    import shutil
    import subprocess
    import tempfile

    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None or platform.machine() not in ("x86_64", "AMD64"):
        return None
    try:
        flags = Path("/proc/cpuinfo").read_text().split("flags", 1)[1].split("\n", 1)[0].split()
    except (OSError, IndexError):
        return None
    if not {"avx2", "fma"} <= set(flags) or (avx512 and "avx512f" not in flags):
        return None
    with tempfile.TemporaryDirectory(prefix="deploytool-peak-") as d:
        src, exe = Path(d) / "peak.c", Path(d) / "peak"
        src.write_text(_PEAK_C)
        isa = ["-mavx512f", "-mfma", "-DWIDE=1"] if avx512 else ["-mavx2", "-mfma", "-DWIDE=0"]
        if subprocess.run([cc, "-O2", *isa, str(src), "-o", str(exe), "-lpthread"], capture_output=True).returncode:
            return None

        def run(iters):
            r = subprocess.run([str(exe), str(threads), str(iters)], capture_output=True, text=True, timeout=60)
            return float(r.stdout) if r.returncode == 0 else None

        probe = run(1 << 20)  # ~12M FMAs per thread: a few ms
        if not probe:
            return None
        # iterations for about `seconds`: 24 x lanes FLOP per iteration and thread
        iters = max(1 << 20, int(seconds * probe * 1e9 / (threads * 24 * (16 if avx512 else 8))))
        best = max((x for x in (run(iters) for _ in range(runs)) if x), default=None)
    return best
