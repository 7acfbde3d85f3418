/* parallel/layout/tp_split.c - the TP / ETP cut of every parameter (see
 * parallel/layout/tp_split.h). */
#include "parallel/layout/tp_split.h"

#include <string.h>

#define LL(x) ((long long)(x))

/* The rule table.  `suffix` matches the end of a name after a '.' (block
 * tensors: "layers.N." / "mtp.N." prefixes), or, for kind TOP, the whole
 * name (top-level tensors); kind EXPERT rules need ".ffn.experts." in the
 * name, the others must not have it.  First match wins; no match:
 * replicated over TP. */
enum { BLOCK = 0, TOP, EXPERT };
static const struct {
    const char *suffix;
    int kind;
    par_tp_cut cut;
    par_tp_group group;
} rules[] = {
    {"embed.weight", TOP, PAR_TP_ROWS, PAR_TP_GROUP_TP},           /* vocab rows    */
    {"head.weight", TOP, PAR_TP_ROWS, PAR_TP_GROUP_TP},            /* vocab rows    */
    {"attn.wq_b.weight", BLOCK, PAR_TP_ROWS, PAR_TP_GROUP_TP},         /* query heads   */
    {"attn.attn_sink", BLOCK, PAR_TP_ROWS, PAR_TP_GROUP_TP},           /* with heads    */
    {"attn.wo_a.weight", BLOCK, PAR_TP_ROWS, PAR_TP_GROUP_TP},         /* whole groups  */
    {"attn.wo_b.weight", BLOCK, PAR_TP_COLS, PAR_TP_GROUP_TP},         /* group columns */
    {"attn.indexer.wq_b.weight", BLOCK, PAR_TP_ROWS, PAR_TP_GROUP_TP}, /* index heads   */
    {"attn.indexer.weights_proj.weight", BLOCK, PAR_TP_ROWS, PAR_TP_GROUP_TP},
    {"ffn.shared_experts.w1.weight", BLOCK, PAR_TP_ROWS, PAR_TP_GROUP_TP},
    {"ffn.shared_experts.w3.weight", BLOCK, PAR_TP_ROWS, PAR_TP_GROUP_TP},
    {"ffn.shared_experts.w2.weight", BLOCK, PAR_TP_COLS, PAR_TP_GROUP_TP},
    {"w1.weight", EXPERT, PAR_TP_ROWS, PAR_TP_GROUP_ETP},          /* routed: I rows */
    {"w3.weight", EXPERT, PAR_TP_ROWS, PAR_TP_GROUP_ETP},
    {"w2.weight", EXPERT, PAR_TP_COLS, PAR_TP_GROUP_ETP},          /* routed: I cols */
};

static int ends_with_part(const char *name, const char *suffix)
{
    size_t n = strlen(name), k = strlen(suffix);
    if (k > n || strcmp(name + n - k, suffix) != 0)
        return 0;
    return n == k || name[n - k - 1] == '.';
}

par_tp_split par_tp_split_of(const char *name)
{
    par_tp_split s = {PAR_TP_REPLICATED, PAR_TP_GROUP_TP};
    if (!name)
        return s;
    const int is_expert = strstr(name, ".ffn.experts.") != NULL;
    for (size_t i = 0; i < sizeof rules / sizeof rules[0]; i++) {
        const int k = rules[i].kind;
        if (k == TOP ? strcmp(name, rules[i].suffix) != 0
                     : (k == EXPERT) != is_expert || !ends_with_part(name, rules[i].suffix))
            continue;
        s.cut = rules[i].cut;
        s.group = rules[i].group;
        return s;
    }
    return s;
}

const char *par_tp_cut_name(par_tp_cut cut)
{
    switch (cut) {
    case PAR_TP_REPLICATED: return "replicated";
    case PAR_TP_ROWS: return "rows";
    case PAR_TP_COLS: return "cols";
    }
    return "?";
}

par_status par_tp_shard_shape(const char *name, int64_t rows, int64_t cols, par_tp_cut cut,
                              int64_t P, int64_t *srows, int64_t *scols)
{
    if (P < 1)
        return par_err(PAR_EINVAL, "tensor parallel shard of %s: group size %lld must be >= 1",
                       name ? name : "a tensor", LL(P));
    int64_t dim = cut == PAR_TP_ROWS ? rows : cols;
    if (cut != PAR_TP_REPLICATED && dim % P != 0)
        return par_err(PAR_EINVAL,
                       "tensor parallel shard of %s [%lld, %lld]: its %s (%lld) are not divisible "
                       "by the group size %lld",
                       name ? name : "a tensor", LL(rows), LL(cols), par_tp_cut_name(cut), LL(dim),
                       LL(P));
    *srows = cut == PAR_TP_ROWS ? rows / P : rows;
    *scols = cut == PAR_TP_COLS ? cols / P : cols;
    return PAR_OK;
}

/* Copies between a full [rows, cols] tensor and rank r's packed block;
 * to_shard selects the direction. */
static void copy_block(char *full, char *shard, int64_t rows, int64_t cols, par_tp_cut cut,
                       int rank, int P, size_t es, int to_shard)
{
    if (cut == PAR_TP_REPLICATED) {
        size_t n = (size_t)(rows * cols) * es;
        if (to_shard)
            memcpy(shard, full, n);
        else
            memcpy(full, shard, n);
        return;
    }
    if (cut == PAR_TP_ROWS) {
        size_t n = (size_t)(rows / P * cols) * es;
        char *f = full + (size_t)rank * n;
        if (to_shard)
            memcpy(shard, f, n);
        else
            memcpy(f, shard, n);
        return;
    }
    const int64_t sc = cols / P;
    for (int64_t i = 0; i < rows; i++) {
        char *f = full + (size_t)(i * cols + rank * sc) * es, *s = shard + (size_t)(i * sc) * es;
        if (to_shard)
            memcpy(s, f, (size_t)sc * es);
        else
            memcpy(f, s, (size_t)sc * es);
    }
}

void par_tp_slice(void *dst, const void *full, int64_t rows, int64_t cols, par_tp_cut cut,
                  int rank, int P, size_t es)
{
    copy_block((char *)(uintptr_t)full, dst, rows, cols, cut, rank, P, es, 1);
}

void par_tp_unslice(void *full, const void *src, int64_t rows, int64_t cols, par_tp_cut cut,
                    int rank, int P, size_t es)
{
    copy_block(full, (char *)(uintptr_t)src, rows, cols, cut, rank, P, es, 0);
}

int64_t par_tp_shard_run(int64_t rows, int64_t cols, par_tp_cut cut, int rank, int P, int64_t j, int64_t *run)
{
    if (cut == PAR_TP_REPLICATED || P <= 1) {
        *run = rows * cols - j;
        return j;
    }
    if (cut == PAR_TP_ROWS) {
        const int64_t n = rows / P * cols;
        *run = n - j;
        return (int64_t)rank * n + j;
    }
    const int64_t sc = cols / P, i = j / sc, c = j % sc;
    *run = sc - c;
    return i * cols + (int64_t)rank * sc + c;
}

int64_t par_tp_logical_run(int64_t rows, int64_t cols, par_tp_cut cut, int rank, int P, int64_t g, int64_t *run)
{
    if (cut == PAR_TP_REPLICATED || P <= 1) {
        *run = rows * cols - g;
        return g;
    }
    if (cut == PAR_TP_ROWS) {
        const int64_t n = rows / P * cols, lo = (int64_t)rank * n;
        if (g < lo || g >= lo + n)
            return -1;
        *run = lo + n - g;
        return g - lo;
    }
    const int64_t sc = cols / P, i = g / cols, c = g % cols - (int64_t)rank * sc;
    if (c < 0 || c >= sc)
        return -1;
    *run = sc - c;
    return i * sc + c;
}

par_tp_cut par_tp_storage_cut(const par_layout *l, const char *name, int64_t *P)
{
    *P = 1;
    const par_tp_split s = par_tp_split_of(name);
    const int64_t g = s.group == PAR_TP_GROUP_ETP ? l->etp : l->tp;
    /* every cut of the table is held as shards once its group is larger
     * than 1: the row cuts (vocab rows, query / index heads, output groups
     * of wo_a, the sinks, the shared w1 / w3, the routed w1 / w3 ETP rows)
     * and the column cuts (wo_b's group columns, the shared w2's TP
     * columns, the routed w2's ETP columns); the shared expert with TP > 1
     * whatever EP and ETP are (it runs TP-split there:
     * par_tp_shared_expert_split) */
    if (s.cut == PAR_TP_REPLICATED || g <= 1 ||
        (strstr(name, ".shared_experts.") && !par_tp_shared_expert_split(l)))
        return PAR_TP_REPLICATED;
    *P = g;
    return s.cut;
}

/* One divisibility rule: `flag` size v must divide the config key's n. */
static par_status divides(const char *flag, int64_t v, const char *key, int64_t n,
                          const char *why)
{
    if (n % v != 0)
        return par_err(PAR_EINVAL, "%s %lld does not divide %s %lld (%s)", flag, LL(v), key, LL(n),
                       why);
    return PAR_OK;
}

par_status par_tp_check_config(const par_config *cfg, int64_t tp, int64_t etp)
{
    static const char tpf[] = "tensor-model-parallel-size", etpf[] = "expert-tensor-parallel-size";
    if (tp < 1 || etp < 1)
        return par_err(PAR_EINVAL, "%s %lld and %s %lld must be at least 1", tpf, LL(tp), etpf,
                       LL(etp));
    par_status st;
    if ((st = divides(tpf, tp, "n_heads", cfg->n_heads, "TP splits the query heads")) ||
        (st = divides(tpf, tp, "o_groups", cfg->o_groups,
                      "each TP rank owns whole output groups of wo_a")) ||
        (st = divides(tpf, tp, "index_n_heads", cfg->index_n_heads,
                      "TP splits the indexer heads")) ||
        (st = divides(tpf, tp, "vocab_size", cfg->vocab_size,
                      "embed.weight and head.weight are vocab-parallel")) ||
        (st = divides(tpf, tp, "moe_inter_dim", cfg->moe_inter_dim,
                      "the shared expert's w1/w3 rows and w2 columns")) ||
        (st = divides(etpf, etp, "moe_inter_dim", cfg->moe_inter_dim,
                      "ETP splits every routed expert's w1/w3 rows and w2 columns")))
        return st;
    return PAR_OK;
}

int par_tp_shared_expert_split(const par_layout *l)
{
    return l && l->tp > 1;
}
