/* Kiln cross driver: runs one compiled model (kiln_main, see kiln/codegen/module.py) on a target without
 * Python, under qemu-user. Built by kiln/cross/build.py with the cross GCC and linked statically with the
 * model's object.
 *
 *   driver SPEC [REPEAT]
 *
 * SPEC is a text file, one item per line:  weights PATH BYTES | arena BYTES | input PATH BYTES |
 * output PATH BYTES  (inputs and outputs in the model's order). The driver reads the weights and inputs,
 * calls kiln_main REPEAT times (default 1) with one thread and a serial kiln_parallel, writes the outputs,
 * and prints "kiln_main_ns <nanoseconds of the last call>" on stderr. A bounds-checked build (kiln/codegen/bounds.py)
 * exports kiln_bounds_record: if it recorded a violation the driver prints "kiln_bounds_violation <kernel call + 1>
 * <buffer position> <flat index> <buffer size> <count>" on stderr and exits with 5. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef void (*worker_fn)(void *ctx, int64_t chunk);
typedef void (*hook_fn)(int32_t kernel);
extern int64_t *kiln_bounds_record(void) __attribute__((weak));   /* absent (NULL) unless bounds-checked */
extern void kiln_main(void **inputs, void **outputs, void *arena, void *weights, int32_t nthreads,
                      hook_fn profile_hook, void *kiln_parallel);

/* The thread pool's interface (kiln/codegen/kernel.py PARALLEL_FN): run chunks 0..chunks-1, here in order. */
static void serial_parallel(worker_fn worker, void *ctx, int64_t chunks, int32_t nthreads) {
    (void)nthreads;
    for (int64_t c = 0; c < chunks; c++) worker(ctx, c);
}

static void *alloc64(size_t n) {
    void *p = aligned_alloc(64, ((n + 63) / 64) * 64 + 64);
    if (!p) { fprintf(stderr, "kiln driver: out of memory (%zu bytes)\n", n); exit(3); }
    memset(p, 0, n + 64);
    return p;
}

static void read_file(const char *path, void *dst, size_t n) {
    FILE *f = fopen(path, "rb");
    if (!f) { fprintf(stderr, "kiln driver: cannot open %s\n", path); exit(4); }
    if (n && fread(dst, 1, n, f) != n) { fprintf(stderr, "kiln driver: %s is shorter than %zu bytes\n", path, n); exit(4); }
    fclose(f);
}

#define MAX_IO 64

int main(int argc, char **argv) {
    if (argc < 2) { fprintf(stderr, "usage: %s SPEC [REPEAT]\n", argv[0]); return 2; }
    int repeat = argc > 2 ? atoi(argv[2]) : 1;
    FILE *spec = fopen(argv[1], "r");
    if (!spec) { fprintf(stderr, "kiln driver: cannot open spec %s\n", argv[1]); return 2; }
    void *ins[MAX_IO], *outs[MAX_IO], *weights = NULL, *arena = NULL;
    char out_paths[MAX_IO][1024];
    size_t out_bytes[MAX_IO];
    int nin = 0, nout = 0;
    char kind[32], path[1024];
    while (fscanf(spec, "%31s", kind) == 1) {
        unsigned long long n = 0;
        if (!strcmp(kind, "arena")) {
            if (fscanf(spec, "%llu", &n) != 1) return 2;
            arena = alloc64(n);
            continue;
        }
        if (fscanf(spec, "%1023s %llu", path, &n) != 2) { fprintf(stderr, "kiln driver: bad spec line\n"); return 2; }
        if (!strcmp(kind, "weights")) {
            weights = alloc64(n);
            read_file(path, weights, n);
        } else if (!strcmp(kind, "input") && nin < MAX_IO) {
            ins[nin] = alloc64(n);
            read_file(path, ins[nin++], n);
        } else if (!strcmp(kind, "output") && nout < MAX_IO) {
            strcpy(out_paths[nout], path);
            out_bytes[nout] = n;
            outs[nout++] = alloc64(n);
        } else {
            fprintf(stderr, "kiln driver: unknown spec item %s\n", kind);
            return 2;
        }
    }
    fclose(spec);
    if (!weights) weights = alloc64(1);
    if (!arena) arena = alloc64(1);
    struct timespec t0, t1;
    long long ns = 0;
    for (int r = 0; r < (repeat > 0 ? repeat : 1); r++) {
        clock_gettime(CLOCK_MONOTONIC, &t0);
        kiln_main(ins, outs, arena, weights, 1, NULL, (void *)serial_parallel);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        ns = (long long)(t1.tv_sec - t0.tv_sec) * 1000000000LL + (t1.tv_nsec - t0.tv_nsec);
    }
    for (int i = 0; i < nout; i++) {
        FILE *f = fopen(out_paths[i], "wb");
        if (!f || fwrite(outs[i], 1, out_bytes[i], f) != out_bytes[i]) {
            fprintf(stderr, "kiln driver: cannot write %s\n", out_paths[i]);
            return 4;
        }
        fclose(f);
    }
    fprintf(stderr, "kiln_main_ns %lld\n", ns);
    if (kiln_bounds_record) {
        int64_t *rec = kiln_bounds_record();
        if (rec[0]) {
            fprintf(stderr, "kiln_bounds_violation %lld %lld %lld %lld %lld\n", (long long)rec[0], (long long)rec[1],
                    (long long)rec[2], (long long)rec[3], (long long)rec[4]);
            return 5;
        }
    }
    return 0;
}
