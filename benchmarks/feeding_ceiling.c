/* The ceiling for the feeding benchmark, in C: how close can ANY gather of random windows come to
 * one contiguous copy of the same bytes on this machine?
 *
 * Both sides as plainly as C allows: each batch is a fresh malloc'd buffer (as NumPy's are), the
 * bound is one memcpy of batch-many bytes from a random offset, the windows are one memcpy each
 * (seq_len uint16 tokens from random starts), on 1 and on 2 threads. Rounds interleave the three;
 * prints JSON with the medians of GB/s and of the per-round ratios windows/bound.
 *
 *     cc -O2 -pthread -o ceiling feeding_ceiling.c && ./ceiling FILE DATA_OFFSET [MiB ...]
 *
 * benchmarks/feeding.py compiles and runs it on its own token file when a C compiler is there. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>

enum { SEQ = 1024, ROUNDS = 11 };
static const uint16_t *tok;
static size_t ntok;
static uint64_t state = 88172645463325252ULL;

static uint64_t rnd(void) { state ^= state << 13; state ^= state >> 7; state ^= state << 17; return state; }
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
static int by_value(const void *a, const void *b) { double x = *(const double *)a, y = *(const double *)b; return (x > y) - (x < y); }
static double median(double *xs) { qsort(xs, ROUNDS, sizeof *xs, by_value); return xs[ROUNDS / 2]; }

typedef struct { uint16_t *out; const int64_t *starts; int n; } job;
static void *copy_windows(void *arg) {
    job *j = arg;
    for (int i = 0; i < j->n; i++) memcpy(j->out + (size_t)i * SEQ, tok + j->starts[i], SEQ * 2);
    return NULL;
}

int main(int argc, char **argv) {
    if (argc < 3) { fprintf(stderr, "usage: %s FILE DATA_OFFSET [MiB ...]\n", argv[0]); return 2; }
    int fd = open(argv[1], O_RDONLY);
    struct stat sb;
    if (fd < 0 || fstat(fd, &sb)) { perror(argv[1]); return 1; }
    const char *map = mmap(NULL, sb.st_size, PROT_READ, MAP_SHARED, fd, 0);
    if (map == MAP_FAILED) { perror("mmap"); return 1; }
    size_t offset = strtoull(argv[2], NULL, 10);
    tok = (const uint16_t *)(map + offset);
    ntok = (sb.st_size - offset) / 2;
    volatile uint64_t sink = 0;
    for (size_t i = 0; i < ntok; i += 512) sink += tok[i]; /* page-cache warm, mapped */
    printf("{\"seq_len\": %d, \"rounds\": %d, \"rows\": [", SEQ, ROUNDS);
    for (int a = 3; a < (argc > 3 ? argc : 4); a++) {
        size_t size = (size_t)(argc > 3 ? atof(argv[a]) : 4.0) * (1 << 20);
        int batch = size / (2 * SEQ), n = (256 << 20) / size;
        int64_t *starts = malloc(sizeof *starts * batch);
        double gbps[3][ROUNDS], ratio[2][ROUNDS];
        for (int r = 0; r < ROUNDS; r++) {
            double t0 = now();
            for (int k = 0; k < n; k++) {
                char *out = malloc(size);
                memcpy(out, tok + rnd() % (ntok - size / 2), size);
                sink += out[size - 1];
                free(out);
            }
            gbps[0][r] = (double)n * size / (now() - t0) / 1e9;
            for (int threads = 1; threads <= 2; threads++) {
                double spent = 0;
                for (int k = 0; k < n; k++) {
                    for (int i = 0; i < batch; i++) starts[i] = rnd() % (ntok - SEQ + 1);
                    double t1 = now();
                    uint16_t *out = malloc(size);
                    job all = {out, starts, batch}, first = {out, starts, batch / 2},
                        second = {out + (size_t)(batch / 2) * SEQ, starts + batch / 2, batch - batch / 2};
                    if (threads == 1) {
                        copy_windows(&all);
                    } else {
                        pthread_t helper;
                        pthread_create(&helper, NULL, copy_windows, &first);
                        copy_windows(&second);
                        pthread_join(helper, NULL);
                    }
                    sink += out[size / 2 - 1];
                    free(out);
                    spent += now() - t1;
                }
                gbps[threads][r] = (double)n * size / spent / 1e9;
                ratio[threads - 1][r] = gbps[threads][r] / gbps[0][r];
            }
        }
        printf("%s{\"batch_bytes\": %zu, \"gbps\": {\"bound\": %.3f, \"windows_1_thread\": %.3f, "
               "\"windows_2_threads\": %.3f}, \"windows_1_thread_over_bound\": %.3f, "
               "\"windows_2_threads_over_bound\": %.3f}",
               a > 3 ? ", " : "", size, median(gbps[0]), median(gbps[1]), median(gbps[2]),
               median(ratio[0]), median(ratio[1]));
        free(starts);
    }
    printf("], \"checksum\": %llu}\n", (unsigned long long)(sink & 1));
    return 0;
}
