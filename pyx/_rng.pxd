# cython: language_level=3
"""xoshiro256** (Blackman & Vigna), seeded through splitmix64: a small, fast generator whose
whole state (four uint64) can be saved and restored exactly. Callers serialise access."""

from libc.stdint cimport uint64_t


cdef struct Rng:
    uint64_t s[4]


cdef inline uint64_t _splitmix64(uint64_t* x) noexcept nogil:
    x[0] += <uint64_t>0x9E3779B97F4A7C15
    cdef uint64_t z = x[0]
    z = (z ^ (z >> 30)) * <uint64_t>0xBF58476D1CE4E5B9
    z = (z ^ (z >> 27)) * <uint64_t>0x94D049BB133111EB
    return z ^ (z >> 31)


cdef inline void rng_seed(Rng* r, uint64_t seed) noexcept nogil:
    cdef uint64_t x = seed
    cdef int i
    for i in range(4):
        r.s[i] = _splitmix64(&x)


cdef inline uint64_t _rotl(uint64_t x, int k) noexcept nogil:
    return (x << k) | (x >> (64 - k))


cdef inline uint64_t rng_next(Rng* r) noexcept nogil:
    cdef uint64_t result = _rotl(r.s[1] * 5, 7) * 9
    cdef uint64_t t = r.s[1] << 17
    r.s[2] ^= r.s[0]
    r.s[3] ^= r.s[1]
    r.s[1] ^= r.s[2]
    r.s[0] ^= r.s[3]
    r.s[2] ^= t
    r.s[3] = _rotl(r.s[3], 45)
    return result


cdef inline double rng_uniform(Rng* r) noexcept nogil:
    """Uniform double in [0, 1) with 53 random bits."""
    return <double>(rng_next(r) >> 11) * (1.0 / 9007199254740992.0)
