/* The memory-bandwidth floor of a replay buffer with big rows: what copying B random rows out of N costs with
   nothing around it (no Python, no lock, no tree, no weights, one preallocated destination), and the machine's
   plain copy bandwidth (a STREAM-like memcpy of a buffer far larger than the caches).

   Built as a shared library by ``pal_bench.bench.gather_floor`` with the C compiler that builds the extension,
   and called through ctypes (about 1 µs a call: nothing beside a gather of B rows of kilobytes). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* out[b] = records[idx[b]] for b < B, rows of row_bytes each */
void pal_gather_rows(const char *records, int64_t row_bytes, const int64_t *idx, int64_t B, char *out) {
    for (int64_t b = 0; b < B; b++)
        memcpy(out + b * row_bytes, records + idx[b] * row_bytes, (size_t)row_bytes);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* best-of-``rounds`` bandwidth in bytes per second of memcpy over ``bytes`` (read + write counted once, as
   STREAM's Copy counts 2 x bytes moved: both are returned as bytes copied per second); -1 if out of memory */
double pal_copy_bandwidth(int64_t bytes, int rounds) {
    char *a = malloc((size_t)bytes), *b = malloc((size_t)bytes);
    if (!a || !b) { free(a); free(b); return -1.0; }
    memset(a, 1, (size_t)bytes);
    memset(b, 2, (size_t)bytes);
    double best = 1e30;
    for (int r = 0; r < rounds; r++) {
        double t0 = now_s();
        memcpy(b, a, (size_t)bytes);
        double t = now_s() - t0;
        if (t < best) best = t;
        a[r % bytes] = b[(r * 7919) % bytes];     /* keep the copies observable */
    }
    free(a); free(b);
    return (double)bytes / best;
}
