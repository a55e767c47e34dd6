# cython: language_level=3
"""``pow`` over arrays: glibc's vector ``pow`` (libmvec, 4 doubles per call) on CPUs with AVX2 and FMA, libm's
scalar ``pow`` elsewhere. Every priority the buffer stores and every weight it returns goes through
``vpow``/``vpow1``, so within one machine a value is the same whichever call computed it; libmvec's pow is
within 4 ulp of libm's (1 ulp on the values tested). Built with libmvec when ``setup.py`` finds it
(``PAL_HAVE_LIBMVEC``); the choice is made once, at the first call, from the running CPU."""

from libc.stdint cimport int64_t


cdef extern from *:
    """
    #include <math.h>
    #if defined(PAL_HAVE_LIBMVEC) && defined(__x86_64__) && defined(__GNUC__)
    #include <immintrin.h>
    __m256d _ZGVdN4vv_pow(__m256d, __m256d);
    static int pal_vpow_avx2 = -1;
    __attribute__((target("avx2,fma"))) static void pal_vpow4(const double* x, double* y, int64_t n, double a) {
        __m256d va = _mm256_set1_pd(a);
        int64_t i = 0;
        for (; i + 4 <= n; i += 4)
            _mm256_storeu_pd(y + i, _ZGVdN4vv_pow(_mm256_loadu_pd(x + i), va));
        if (i < n) {                               /* the tail, padded with ones */
            double in[4] = {1.0, 1.0, 1.0, 1.0}, out[4];
            for (int64_t j = i; j < n; j++) in[j - i] = x[j];
            _mm256_storeu_pd(out, _ZGVdN4vv_pow(_mm256_loadu_pd(in), va));
            for (int64_t j = i; j < n; j++) y[j] = out[j - i];
        }
    }
    static int pal_vpow_vector(void) {
        if (pal_vpow_avx2 < 0)
            pal_vpow_avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
        return pal_vpow_avx2;
    }
    #else
    static void pal_vpow4(const double* x, double* y, int64_t n, double a) { (void)x; (void)y; (void)n; (void)a; }
    static int pal_vpow_vector(void) { return 0; }
    #endif
    /* y[i] = x[i] ** a (y may be x) */
    static inline void pal_vpow(const double* x, double* y, int64_t n, double a) {
        if (pal_vpow_vector()) { pal_vpow4(x, y, n, a); return; }
        for (int64_t i = 0; i < n; i++) y[i] = pow(x[i], a);
    }
    static inline double pal_vpow1(double x, double a) {
        double y;
        pal_vpow(&x, &y, 1, a);
        return y;
    }
    """
    void vpow "pal_vpow"(const double* x, double* y, int64_t n, double a) noexcept nogil
    double vpow1 "pal_vpow1"(double x, double a) noexcept nogil
