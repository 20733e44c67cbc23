/* Kiln's instruction-counting plugin for QEMU's TCG (user mode, plugin API v1 as in QEMU 7.2).
 *
 * Debian's qemu-user loads plugins (`-plugin file.so,out=PATH`) and exports the qemu_plugin_* symbols but
 * ships no qemu-plugin.h, so the few declarations this plugin needs are written out below (they match
 * QEMU 7.2's include/qemu/qemu-plugin.h, QEMU_PLUGIN_VERSION 1).
 *
 * What it records: for every guest instruction address that was executed, the number of executions and
 * the instruction's encoding bytes. Counting is an inline "add 1 to a u64" that QEMU emits into the
 * translated code (no helper call per instruction), so counts are exact for a single guest thread. With
 * several guest threads the adds race (not atomic): run the program single-threaded when counts matter.
 * One counter per address (a hash table with stable entries): a block translated twice, or two blocks
 * that overlap, add into the same counter. At exit it writes `vaddr count size hexbytes` lines to PATH.
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the QEMU 7.2 plugin API subset (declared here because Debian ships no header) ---- */
typedef uint64_t qemu_plugin_id_t;
typedef struct qemu_info_t qemu_info_t;  /* only passed through by pointer */
struct qemu_plugin_tb;
struct qemu_plugin_insn;
enum qemu_plugin_op { QEMU_PLUGIN_INLINE_ADD_U64 };
typedef void (*qemu_plugin_vcpu_tb_trans_cb_t)(qemu_plugin_id_t id, struct qemu_plugin_tb *tb);
typedef void (*qemu_plugin_udata_cb_t)(qemu_plugin_id_t id, void *userdata);

void qemu_plugin_register_vcpu_tb_trans_cb(qemu_plugin_id_t id, qemu_plugin_vcpu_tb_trans_cb_t cb);
size_t qemu_plugin_tb_n_insns(const struct qemu_plugin_tb *tb);
struct qemu_plugin_insn *qemu_plugin_tb_get_insn(const struct qemu_plugin_tb *tb, size_t idx);
const void *qemu_plugin_insn_data(const struct qemu_plugin_insn *insn);
size_t qemu_plugin_insn_size(const struct qemu_plugin_insn *insn);
uint64_t qemu_plugin_insn_vaddr(const struct qemu_plugin_insn *insn);
void qemu_plugin_register_vcpu_insn_exec_inline(struct qemu_plugin_insn *insn, enum qemu_plugin_op op,
                                                void *ptr, uint64_t imm);
void qemu_plugin_register_atexit_cb(qemu_plugin_id_t id, qemu_plugin_udata_cb_t cb, void *userdata);

__attribute__((visibility("default"))) int qemu_plugin_version = 1;

/* ---- per-address counters ---- */
#define MAX_INSN_BYTES 16
#define SLAB_ENTRIES 4096

struct counter {
    uint64_t count;      /* first: the inline add targets this field */
    uint64_t vaddr;
    uint32_t size;
    uint8_t bytes[MAX_INSN_BYTES];
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;  /* translation may run on several vCPU threads */
static struct counter **table;   /* open addressing on vaddr; entries live in slabs and never move */
static size_t table_cap, table_used;
static struct counter *slab;
static size_t slab_left;
static char out_path[4096] = "kiln-isa-counts.txt";

static size_t slot_of(uint64_t vaddr, size_t cap) {
    uint64_t h = vaddr * 0x9E3779B97F4A7C15ull;
    return (size_t)(h >> 17) & (cap - 1);
}

static void grow(void) {
    size_t cap = table_cap ? table_cap * 2 : 1 << 14;
    struct counter **t = calloc(cap, sizeof *t);
    if (!t) { perror("kiln isa plugin"); abort(); }
    for (size_t i = 0; i < table_cap; i++) {
        if (table[i]) {
            size_t s = slot_of(table[i]->vaddr, cap);
            while (t[s]) s = (s + 1) & (cap - 1);
            t[s] = table[i];
        }
    }
    free(table);
    table = t;
    table_cap = cap;
}

static struct counter *counter_for(uint64_t vaddr, const void *data, size_t size) {
    if (2 * (table_used + 1) > table_cap) grow();
    size_t s = slot_of(vaddr, table_cap);
    while (table[s]) {
        if (table[s]->vaddr == vaddr) return table[s];
        s = (s + 1) & (table_cap - 1);
    }
    if (!slab_left) {
        slab = calloc(SLAB_ENTRIES, sizeof *slab);
        if (!slab) { perror("kiln isa plugin"); abort(); }
        slab_left = SLAB_ENTRIES;
    }
    struct counter *c = slab++;
    slab_left--;
    c->vaddr = vaddr;
    c->size = (uint32_t)(size < MAX_INSN_BYTES ? size : MAX_INSN_BYTES);
    memcpy(c->bytes, data, c->size);
    table[s] = c;
    table_used++;
    return c;
}

static void on_translate(qemu_plugin_id_t id, struct qemu_plugin_tb *tb) {
    (void)id;
    size_t n = qemu_plugin_tb_n_insns(tb);
    pthread_mutex_lock(&lock);
    for (size_t i = 0; i < n; i++) {
        struct qemu_plugin_insn *insn = qemu_plugin_tb_get_insn(tb, i);
        struct counter *c = counter_for(qemu_plugin_insn_vaddr(insn), qemu_plugin_insn_data(insn),
                                        qemu_plugin_insn_size(insn));
        qemu_plugin_register_vcpu_insn_exec_inline(insn, QEMU_PLUGIN_INLINE_ADD_U64, &c->count, 1);
    }
    pthread_mutex_unlock(&lock);
}

static void dump_counts(qemu_plugin_id_t id, void *userdata) {
    (void)id;
    (void)userdata;
    FILE *f = fopen(out_path, "w");
    if (!f) { perror(out_path); return; }
    pthread_mutex_lock(&lock);
    for (size_t i = 0; i < table_cap; i++) {
        struct counter *c = table[i];
        if (!c || !c->count) continue;
        fprintf(f, "%" PRIx64 " %" PRIu64 " %u ", c->vaddr, c->count, c->size);
        for (uint32_t b = 0; b < c->size; b++) fprintf(f, "%02x", c->bytes[b]);
        fputc('\n', f);
    }
    pthread_mutex_unlock(&lock);
    fclose(f);
}

__attribute__((visibility("default")))
int qemu_plugin_install(qemu_plugin_id_t id, const qemu_info_t *info, int argc, char **argv) {
    (void)info;
    for (int i = 0; i < argc; i++) {
        if (strncmp(argv[i], "out=", 4) == 0) {
            snprintf(out_path, sizeof out_path, "%s", argv[i] + 4);
        } else {
            fprintf(stderr, "kiln isa plugin: unknown argument '%s' (expected out=PATH)\n", argv[i]);
            return -1;
        }
    }
    qemu_plugin_register_vcpu_tb_trans_cb(id, on_translate);
    qemu_plugin_register_atexit_cb(id, dump_counts, NULL);
    return 0;
}
