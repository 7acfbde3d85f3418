/* model/rootcause.c - dataflow order of golden-set tensors and the root
 * cause of a failing comparison (see model/rootcause.h). */
#include "model/rootcause.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "model/goldenset.h"

/* A position in dataflow order, compared field by field. */
typedef struct {
    int64_t k;     /* step index of the file (params.K before step.K) */
    int fkind;     /* 0 params, 1 step, 2 not a set file */
    int phase;     /* in step files: 0 inputs, 1 forward, 2 losses, 3 backward, 4 grad norm, 5 other */
    int64_t a, b;  /* block position and the place in it */
} flow_pos;

#define AFTER_LAYERS ((int64_t)1 << 40) /* out.logits / the head, after every main layer */

static int has_prefix(const char *s, const char *p) { return !strncmp(s, p, strlen(p)); }

/* "<key>.<digits>" at the start of s: the number, else -1. */
static int64_t lead_num(const char *s, const char *key, const char **rest)
{
    size_t kl = strlen(key);
    if (strncmp(s, key, kl) || s[kl] != '.' || s[kl + 1] < '0' || s[kl + 1] > '9')
        return -1;
    char *end;
    int64_t v = strtoll(s + kl + 1, &end, 10);
    if (rest)
        *rest = *end == '.' ? end + 1 : end;
    return v;
}

/* The place of a parameter's name tail inside its block, forward order. */
static int64_t block_sub(const char *t)
{
    static const char *const order[] = {"enorm", "hnorm", "e_proj", "h_proj", "hc_attn", "attn_norm", "attn.",
                                        "hc_ffn", "ffn_norm", "ffn.gate", "ffn.", "norm", "hc_head"};
    for (int i = 0; i < (int)(sizeof order / sizeof order[0]); i++)
        if (has_prefix(t, order[i]))
            return i;
    return 99;
}

/* A parameter's place in the forward computation: (block, place). */
static void param_pos(const char *p, int64_t *a, int64_t *b)
{
    const char *rest = p;
    int64_t L;
    if (has_prefix(p, "embed.")) {
        *a = -1, *b = 0;
    } else if ((L = lead_num(p, "layers", &rest)) >= 0) {
        *a = L, *b = block_sub(rest);
    } else if ((L = lead_num(p, "mtp", &rest)) >= 0) {
        *a = AFTER_LAYERS + 1 + L, *b = block_sub(rest);
    } else { /* norm.weight, head.weight, hc_head_*: the main head */
        *a = AFTER_LAYERS, *b = block_sub(p);
    }
}

/* A forward tensor of a step file (act.*, attn.*, router.*, out.*logits). */
static void forward_pos(const char *t, int is_int, int64_t *a, int64_t *b)
{
    static const char *const kinds[] = {"act.", "attn.", "router."};
    int kind = 0;
    while (kind < 3 && !has_prefix(t, kinds[kind]))
        kind++;
    const char *body = kind < 3 ? t + strlen(kinds[kind]) : t;
    int64_t L;
    if ((L = lead_num(body, "layers", NULL)) >= 0)
        *a = L;
    else if ((L = lead_num(body, "mtp", NULL)) >= 0)
        *a = AFTER_LAYERS + 1 + L;
    else if (!strcmp(t, "out.logits"))
        *a = AFTER_LAYERS;
    else
        *a = AFTER_LAYERS * 2; /* out.mtp_logits, anything else forward */
    /* the block's float output first, then its integers */
    *b = !is_int ? 0 : kind == 1 ? 1 : strstr(t, ".load") ? 3 : 2;
}

static void step_pos(const char *t, par_dtype dt, flow_pos *p)
{
    static const char *const losses[] = {"out.loss_main", "out.loss_mtp", "out.loss_aux", "out.loss"};
    int is_int = !par_dtype_is_float(dt);
    if (has_prefix(t, "input.")) {
        p->phase = 0;
    } else if (has_prefix(t, "grad.")) {
        p->phase = 3;
        param_pos(t + 5, &p->a, &p->b);
        p->a = -p->a, p->b = -p->b; /* from the last block back */
    } else if (!strcmp(t, "out.grad_norm")) {
        p->phase = 4;
    } else if (has_prefix(t, "act.") || has_prefix(t, "attn.") || has_prefix(t, "router.") ||
               !strcmp(t, "out.logits") || !strcmp(t, "out.mtp_logits")) {
        p->phase = 1;
        forward_pos(t, is_int, &p->a, &p->b);
    } else if (has_prefix(t, "out.")) {
        p->phase = 2;
        p->a = 4;
        for (int i = 0; i < 4; i++)
            if (!strcmp(t, losses[i]))
                p->a = i;
    } else {
        p->phase = 5;
    }
}

static void flow_of(const char *file, const char *tensor, par_dtype dt, flow_pos *p)
{
    memset(p, 0, sizeof *p);
    const char *base = strrchr(file, '/');
    base = base ? base + 1 : file;
    par_setfile_kind kind;
    if (!par_setfile_parse(base, &kind, &p->k)) {
        p->fkind = 2;
        return;
    }
    p->fkind = (int)kind;
    if (!tensor[0]) { /* an entry about the whole file: at its start */
        p->phase = -1;
        return;
    }
    if (kind == PAR_SETFILE_STEP) {
        step_pos(tensor, dt, p);
        return;
    }
    int opt = has_prefix(tensor, "opt.");
    char name[256];
    snprintf(name, sizeof name, "%s", opt ? tensor + 4 : tensor);
    char *slot = opt ? strrchr(name, '.') : NULL;
    if (slot)
        *slot = 0; /* opt.<name>.<slot> -> <name> */
    param_pos(name, &p->a, &p->b);
    p->b = p->b * 2 + (opt ? 0 : 1); /* a parameter's optimizer state before the parameter */
}

static int cmp64(int64_t x, int64_t y) { return x < y ? -1 : x > y; }

static int cmp_pos(const flow_pos *p, const flow_pos *q)
{
    int c;
    if ((c = cmp64(p->fkind == 2, q->fkind == 2)) || (c = cmp64(p->k, q->k)) || (c = cmp64(p->fkind, q->fkind)) ||
        (c = cmp64(p->phase, q->phase)) || (c = cmp64(p->a, q->a)) || (c = cmp64(p->b, q->b)))
        return c;
    return 0;
}

int par_dataflow_cmp(const char *file_a, const char *tensor_a, par_dtype dtype_a, const char *file_b,
                     const char *tensor_b, par_dtype dtype_b)
{
    flow_pos p, q;
    flow_of(file_a, tensor_a, dtype_a, &p);
    flow_of(file_b, tensor_b, dtype_b, &q);
    int c = cmp_pos(&p, &q);
    if (!c && p.fkind == 2)
        c = strcmp(file_a, file_b);
    return c ? c : strcmp(tensor_a, tensor_b);
}

/* A failing entry with its position, for sorting. */
typedef struct {
    flow_pos pos;
    const par_cmp_entry *e;
    int index;
} flow_item;

static int cmp_items(const void *x, const void *y)
{
    const flow_item *a = x, *b = y;
    int c = cmp_pos(&a->pos, &b->pos);
    if (!c && a->pos.fkind == 2)
        c = strcmp(a->e->file, b->e->file);
    if (!c)
        c = strcmp(a->e->tensor, b->e->tensor);
    return c ? c : a->index - b->index;
}

void par_compare_root_cause(const par_compare_report *r, par_root_cause *out)
{
    out->root = out->first_consequence = out->first_missing = -1;
    out->n_failed = out->n_consequences = out->n_missing = 0;
    int n = par_compare_report_count(r);
    flow_item *v = par_malloc((size_t)(n ? n : 1) * sizeof *v, PAR_TAG_MISC);
    if (!v)
        return;
    int nf = 0;
    for (int i = 0; i < n; i++) {
        const par_cmp_entry *e = par_compare_report_entry(r, i);
        if (e->pass)
            continue;
        flow_of(e->file, e->tensor, e->dtype, &v[nf].pos);
        v[nf].e = e;
        v[nf++].index = i;
    }
    qsort(v, (size_t)nf, sizeof *v, cmp_items);
    out->n_failed = nf;
    for (int i = 0; i < nf; i++) {
        if (v[i].e->side != PAR_CMP_BOTH) {
            if (out->first_missing < 0)
                out->first_missing = v[i].index;
            out->n_missing++;
        } else if (out->root < 0) {
            out->root = v[i].index;
        } else if (v[i].e->tensor[0] && !par_dtype_is_float(v[i].e->dtype)) {
            if (out->first_consequence < 0)
                out->first_consequence = v[i].index;
            out->n_consequences++;
        }
    }
    par_free(v);
}
