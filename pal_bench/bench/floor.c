/* The hardware floor of a prioritized sample+update: the same tree operations as PAL's buffer, in plain C,
   with nothing else around them (no Python call, no locks, no min tree, no weights, no output arrays).

   K = 16 sum tree over N float64 leaves, every level stored as groups of 16 siblings (two cache lines), parents
   recomputed from their children. One "sample" draws B stratified targets (ascending), descends them level by
   level (each level's child groups prefetched first, then PAL's branch-free step: quad sums, then the child
   within the quad), and gathers the B rows (ROW bytes each) of the leaves found; one "update" writes B new leaf values and
   recomputes each touched parent once, level by level. Each call draws new targets, so caches hold what they
   would in a loop of learner steps.

   Usage: floor N B ROUNDS  ->  one JSON line: median ns per sample (descent + gather) and per update.
   Built and run by ``python -m pal_bench.bench.floor``. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define K 16
#define ROW 80
#define MAXL 16

static int n_levels;
static int64_t size[MAXL], off[MAXL];
static double *sums;
static char *records;

static uint64_t rng = 88172645463325252ull;
static inline double uniform(void) {
    rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
    return (rng >> 11) * (1.0 / 9007199254740992.0);
}

static double now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e9 + ts.tv_nsec;
}

static void build(int64_t n) {
    /* level n_levels-1 = leaves; each level padded to whole groups of K */
    int64_t s = n, lv[MAXL];
    int L = 0;
    lv[L++] = s;
    while (s > 1) { s = (s + K - 1) / K; lv[L++] = s; }
    n_levels = L;
    int64_t total = 0;
    for (int l = 0; l < L; l++) {
        size[l] = lv[L - 1 - l];
        off[l] = total;
        total += (size[l] + K - 1) / K * K;
    }
    sums = aligned_alloc(64, (size_t)total * 8 + 64);
    memset(sums, 0, (size_t)total * 8);
    records = aligned_alloc(64, (size_t)n * ROW);
    memset(records, 1, (size_t)n * ROW);
    for (int64_t i = 0; i < n; i++) sums[off[L - 1] + i] = 0.1 + uniform();
    for (int l = L - 2; l >= 0; l--)
        for (int64_t j = 0; j < size[l]; j++) {
            double t = 0;
            for (int k = 0; k < K; k++) t += sums[off[l + 1] + j * K + k];
            sums[off[l] + j] = t;
        }
}

static void sample(int B, double *x, int64_t *leaf, char *out) {
    double total = sums[off[0]];
    for (int b = 0; b < B; b++) { x[b] = (b + uniform()) * (total / B); leaf[b] = 0; }
    for (int l = 0; l < n_levels - 1; l++) {
        const double *base = sums + off[l + 1];
        for (int b = 0; b < B; b++) {
            __builtin_prefetch(base + leaf[b] * K);
            __builtin_prefetch(base + leaf[b] * K + 8);
        }
        for (int b = 0; b < B; b++) {
            /* branch-free, in quads (as PAL's tree core): the quad is the count of running quad sums <= t,
               then the child within the quad the same way; short dependency chains, so targets overlap */
            const double *c = base + leaf[b] * K;
            double t = x[b];
            double q0 = (c[0] + c[1]) + (c[2] + c[3]), q1 = (c[4] + c[5]) + (c[6] + c[7]);
            double q2 = (c[8] + c[9]) + (c[10] + c[11]), q3 = (c[12] + c[13]) + (c[14] + c[15]);
            double r1 = q0, r2 = q0 + q1, r3 = r2 + q2;
            int quad = (t >= r1) + (t >= r2) + (t >= r3);
            double before_q[4] = {0, r1, r2, r3};
            t -= before_q[quad];
            const double *cq = c + 4 * quad;
            double p1 = cq[0], p2 = p1 + cq[1], p3 = p2 + cq[2];
            int k = (t >= p1) + (t >= p2) + (t >= p3);
            double before[4] = {0, p1, p2, p3};
            x[b] = t - before[k];
            leaf[b] = leaf[b] * K + 4 * quad + k;
            (void)q3;
        }
    }
    for (int b = 0; b < B; b++) {
        __builtin_prefetch(records + leaf[b] * ROW);
        __builtin_prefetch(records + leaf[b] * ROW + 64);
    }
    for (int b = 0; b < B; b++) memcpy(out + b * ROW, records + leaf[b] * ROW, ROW);
}

static void update(int B, const int64_t *leaf, int64_t *node) {
    int L = n_levels;
    for (int b = 0; b < B; b++) { sums[off[L - 1] + leaf[b]] = 0.1 + uniform(); node[b] = leaf[b]; }
    int m = B;
    for (int l = L - 2; l >= 0; l--) {
        int w = 0;
        int64_t last = -1;
        for (int b = 0; b < m; b++) {
            int64_t p = node[b] / K;
            if (p == last) continue;                /* sorted: a parent seen twice is seen in a row */
            last = p;
            const double *c = sums + off[l + 1] + p * K;
            double s0 = 0, s1 = 0;
            for (int k = 0; k < K; k += 2) { s0 += c[k]; s1 += c[k + 1]; }
            sums[off[l] + p] = s0 + s1;
            node[w++] = p;
        }
        m = w;
    }
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    if (argc != 4) { fprintf(stderr, "usage: floor N B ROUNDS\n"); return 2; }
    int64_t n = atoll(argv[1]);
    int B = atoi(argv[2]), R = atoi(argv[3]);
    if (n < K || B < 1 || R < 1) { fprintf(stderr, "floor: need N >= 16, B >= 1, ROUNDS >= 1\n"); return 2; }
    build(n);
    double *x = malloc(B * sizeof(double)), *ts = malloc(R * sizeof(double)), *tu = malloc(R * sizeof(double));
    int64_t *leaf = malloc(B * sizeof(int64_t)), *node = malloc(B * sizeof(int64_t));
    char *out = malloc((size_t)B * ROW);
    /* the descent must find what a linear scan of the leaves finds (checked on a few targets, before timing) */
    uint64_t saved = rng;
    sample(B, x, leaf, out);
    rng = saved;
    double total = sums[off[0]];
    for (int b = 0; b < B; b += B / 8 + 1) {
        double target = 0;
        for (int i = 0; i <= b; i++) target = (i + uniform()) * (total / B);
        rng = saved;
        double run = 0;
        int64_t i = 0;
        while (i < n - 1 && run + sums[off[n_levels - 1] + i] <= target) run += sums[off[n_levels - 1] + i++];
        if (leaf[b] != i && !(leaf[b] == i + 1 || leaf[b] == i - 1)) {   /* neighbours: rounding of the sums */
            fprintf(stderr, "floor: target %d found leaf %lld, a scan finds %lld\n", b, (long long)leaf[b], (long long)i);
            return 3;
        }
    }
    for (int r = 0; r < R / 10 + 1; r++) { sample(B, x, leaf, out); update(B, leaf, node); }   /* warm-up */
    for (int r = 0; r < R; r++) {
        double t0 = now_ns();
        sample(B, x, leaf, out);
        double t1 = now_ns();
        update(B, leaf, node);
        double t2 = now_ns();
        ts[r] = t1 - t0;
        tu[r] = t2 - t1;
    }
    qsort(ts, R, sizeof(double), cmp);
    qsort(tu, R, sizeof(double), cmp);
    double check = 0;
    for (int b = 0; b < B * ROW; b += 64) check += out[b];
    printf("{\"capacity\": %lld, \"batch\": %d, \"rounds\": %d, \"sample_ns\": %.1f, \"update_ns\": %.1f, "
           "\"check\": %.0f}\n", (long long)n, B, R, ts[R / 2], tu[R / 2], check);
    return 0;
}
