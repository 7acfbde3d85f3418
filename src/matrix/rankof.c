/* matrix/rankof.c - the rank of a layout that owned a golden-set element
 * (see matrix/rankof.h). */
#include "matrix/rankof.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/fileio.h"
#include "core/json.h"
#include "core/manifest.h"
#include "model/goldenset.h"
#include "parallel/layout/groups.h"

static int64_t get_int(const cJSON *o, const char *k, int64_t dflt)
{
    int64_t v;
    return par_json_int(o, k, &v) ? v : dflt;
}

/* The given fields of the layout a manifest records. */
static par_status layout_of(const cJSON *lj, par_layout *l)
{
    par_layout_init(l);
    l->world = get_int(lj, "world_size", 1);
    l->tp = get_int(lj, "tensor_model_parallel_size", 1);
    l->pp = get_int(lj, "pipeline_model_parallel_size", 1);
    l->vpp = get_int(lj, "virtual_pipeline_model_parallel_size", 0);
    l->cp = get_int(lj, "context_parallel_size", 1);
    l->ep = get_int(lj, "expert_model_parallel_size", 1);
    l->etp = get_int(lj, "expert_tensor_parallel_size", 1);
    l->micro_batch = get_int(lj, "micro_batch_size", 0);
    l->global_batch = get_int(lj, "global_batch_size", 0);
    const cJSON *z = cJSON_GetObjectItemCaseSensitive(lj, "use_distributed_optimizer");
    l->distributed_optimizer = cJSON_IsTrue(z);
    const char *sched = par_json_str(lj, "pipeline_schedule"), *str = par_json_str(lj, "pipeline_model_parallel_layout");
    par_status s = PAR_OK;
    if (l->pp > 1 && sched && strcmp(sched, "none"))
        s = par_layout_set_schedule(l, sched);
    if (!s && l->pp > 1 && str && str[0])
        s = par_layout_set_pp_layout(l, str);
    return s;
}

static par_status resolve_one(const cJSON *lj, const par_layout_model *lm, par_layout *l)
{
    par_status s = layout_of(lj, l);
    return s ? s : par_layout_resolve(l, lm);
}

par_status par_rankof_from_set(const char *dir, par_rankof *out)
{
    if (!par_path_is_dir(dir))
        return par_err(PAR_EINVAL, "rankof: %s is not a golden-set directory", dir);
    char *mp = par_path_join(dir, PAR_MANIFEST_NAME);
    cJSON *man = NULL;
    par_status s = mp ? par_json_read_file(mp, &man) : par_err(PAR_ENOMEM, "rankof: out of memory");
    par_free(mp);
    if (s)
        return s;
    const cJSON *model = par_json_obj(man, "model"), *train = par_json_obj(man, "train");
    const cJSON *lj = par_json_obj(man, "layout"), *ratios = cJSON_GetObjectItemCaseSensitive(model, "compress_ratios");
    int64_t r[64];
    int nr = 0;
    for (const cJSON *e = cJSON_IsArray(ratios) ? ratios->child : NULL; e && nr < 64; e = e->next) {
        int64_t v = 0;
        par_json_as_int(e, &v);
        r[nr++] = v;
    }
    par_rankof x;
    memset(&x, 0, sizeof x);
    x.S = get_int(train, "seq_length", 0);
    x.E = get_int(model, "n_routed_experts", 0);
    par_layout_model lm = {
        .n_layers = get_int(model, "n_layers", 0), .n_mtp_layers = get_int(model, "n_mtp_layers", 0),
        .n_routed_experts = x.E, .seq_length = x.S, .global_batch_size = get_int(train, "global_batch_size", 0),
        .window_size = get_int(model, "window_size", 0), .n_ratios = nr, .compress_ratios = r,
    };
    s = lj ? resolve_one(lj, &lm, &x.lay[0]) : par_err(PAR_EINVAL, "rankof: %s records no layout", dir);
    x.n_lay = 1;
    const cJSON *after = lj ? par_json_obj(lj, "after_checkpoint") : NULL;
    if (!s && after && resolve_one(after, &lm, &x.lay[1]) == PAR_OK) {
        x.from_step = get_int(after, "from_step", 0);
        x.n_lay = 2;
    }
    cJSON_Delete(man);
    if (s)
        return s;
    x.B = x.lay[0].global_batch;
    *out = x;
    return PAR_OK;
}

/* ---- which block, which stage ----------------------------------------- */

/* "<key>.<digits>" as a name component: the number, else -1. */
static int64_t component(const char *name, const char *key)
{
    size_t kl = strlen(key);
    for (const char *p = strstr(name, key); p; p = strstr(p + 1, key)) {
        if ((p != name && p[-1] != '.') || p[kl] != '.' || p[kl + 1] < '0' || p[kl + 1] > '9')
            continue;
        return strtoll(p + kl + 1, NULL, 10);
    }
    return -1;
}

static int has_prefix(const char *s, const char *p) { return !strncmp(s, p, strlen(p)); }

/* The block a tensor belongs to: kind and index (layer, MTP depth). */
static par_block_kind block_of(const char *t, int64_t *idx)
{
    *idx = 0;
    if ((*idx = component(t, "layers")) >= 0)
        return PAR_BLK_LAYER;
    if ((*idx = component(t, "mtp")) >= 0 || !strcmp(t, "out.mtp_logits")) {
        *idx = *idx < 0 ? 0 : *idx;
        return PAR_BLK_MTP;
    }
    *idx = 0;
    if (has_prefix(t, "input.") || strstr(t, "embed."))
        return PAR_BLK_EMBED;
    return PAR_BLK_LOSS; /* the head, its norm and hc_head_*, logits and losses */
}

/* The pipeline rank holding block (k, idx); -1 when none does. */
static int stage_of(const par_layout *l, par_block_kind k, int64_t idx)
{
    const par_pplayout *p = &l->pipe;
    for (int s = 0; s < p->n_segments; s++) {
        int64_t off = par_pplayout_offset(p, s, k), cnt = par_pplayout_count(p, s, k);
        if (idx >= off && idx < off + cnt)
            return par_layout_segment_rank(l, s);
    }
    return -1;
}

/* ---- the description -------------------------------------------------- */

/* The layout that computed a file of the set. */
static const par_layout *layout_of_file(const par_rankof *x, const char *file)
{
    const char *base = strrchr(file, '/');
    par_setfile_kind kind;
    int64_t k;
    if (x->n_lay < 2 || !par_setfile_parse(base ? base + 1 : file, &kind, &k))
        return &x->lay[0];
    int after = kind == PAR_SETFILE_STEP ? k >= x->from_step : k > x->from_step;
    return &x->lay[after ? 1 : 0];
}

static int is_row_tensor(const char *file, const char *t, int ndim)
{
    const char *base = strrchr(file, '/');
    par_setfile_kind kind;
    int64_t k;
    if (!par_setfile_parse(base ? base + 1 : file, &kind, &k) || kind != PAR_SETFILE_STEP || ndim < 2)
        return 0;
    return has_prefix(t, "input.") || has_prefix(t, "out.") || has_prefix(t, "act.") ||
           (has_prefix(t, "router.") && !strstr(t, ".load")) || has_prefix(t, "attn.");
}

static int describe_row(const par_rankof *x, const par_layout *l, const int64_t *coord, int pp, char *buf,
                        size_t n)
{
    int64_t Bl = x->B / l->da, Sl = x->S / l->cp;
    if (Bl < 1 || Sl < 1)
        return 0;
    int dp = (int)(coord[0] / Bl), cp = (int)(coord[1] / Sl);
    int o = 0;
    if (l->da > 1)
        o += snprintf(buf, n, "dp rank %d of %lld, ", dp, (long long)l->da);
    if (l->cp > 1 && (size_t)o < n)
        o += snprintf(buf + o, n - (size_t)o, "cp rank %d of %lld, ", cp, (long long)l->cp);
    if (l->pp > 1 && (size_t)o < n) {
        int64_t mbs = l->micro_batch > 0 ? l->micro_batch : 1;
        o += snprintf(buf + o, n - (size_t)o, "stage %d of %lld (microbatch %lld), ", pp, (long long)l->pp,
                      (long long)((coord[0] % Bl) / mbs));
    }
    int w = par_rank_of_attn(l, 0, cp, dp, pp < 0 ? 0 : pp);
    if ((size_t)o < n)
        snprintf(buf + o, n - (size_t)o, "world rank %d", w);
    return 1;
}

static int describe_expert(const par_rankof *x, const par_layout *l, int64_t e, int pp, char *buf, size_t n)
{
    if (x->E < l->ep || l->ep < 1)
        return 0;
    int ep = (int)(e / (x->E / l->ep));
    int w = par_rank_of_expert(l, 0, ep, 0, pp < 0 ? 0 : pp);
    int o = snprintf(buf, n, "expert %lld on ep rank %d of %lld", (long long)e, ep, (long long)l->ep);
    if (l->pp > 1 && o > 0 && (size_t)o < n)
        o += snprintf(buf + o, n - (size_t)o, ", stage %d of %lld", pp, (long long)l->pp);
    if (o > 0 && (size_t)o < n)
        snprintf(buf + o, n - (size_t)o, ", world rank %d%s", w, l->de > 1 ? " and its expert-DP replicas" : "");
    return 1;
}

int par_rankof_describe(const par_rankof *x, const char *file, const char *tensor, int ndim, const int64_t *coord,
                        char *buf, size_t n)
{
    buf[0] = 0;
    const par_layout *l = layout_of_file(x, file);
    if (l->world <= 1 || !tensor[0])
        return 0;
    const char *t = tensor;
    if (has_prefix(t, "grad."))
        t += 5;
    else if (has_prefix(t, "opt."))
        t += 4;
    int64_t idx;
    par_block_kind k = block_of(t, &idx);
    int pp = l->pp > 1 ? stage_of(l, k, idx) : 0;
    if (is_row_tensor(file, tensor, ndim))
        return describe_row(x, l, coord, pp, buf, n);
    int64_t e = component(t, "experts");
    if (e < 0 && has_prefix(t, "router.") && strstr(t, ".load") && ndim == 1)
        e = coord[0];
    if (e >= 0 && l->ep > 1)
        return describe_expert(x, l, e, pp, buf, n);
    if (l->pp > 1 && pp >= 0) {
        snprintf(buf, n, "stage %d of %lld (world ranks %lld-%lld)", pp, (long long)l->pp,
                 (long long)(pp * (l->world / l->pp)), (long long)((pp + 1) * (l->world / l->pp) - 1));
        return 1;
    }
    return 0;
}
