/* parallel/plan/plan.c - the `parity plan` summary of a layout (see plan.h). */
#include "parallel/plan/plan.h"

#include <string.h>

#include "core/alloc.h"
#include "parallel/layout/groups.h"

#define LL(x) ((long long)(x))

par_status par_plan_resolve(par_layout *l, const par_config *cfg)
{
    par_layout_model m;
    par_layout_model_from_config(&m, cfg);
    return par_layout_resolve(l, &m);
}

/* "{0,2,4,6}", or "{0,2,...,62} (32 ranks)" for long lists. */
static void format_members(char *buf, size_t n, const int *mem, int cnt)
{
    size_t len = 0;
    buf[0] = '\0';
    if (cnt == 0) {
        snprintf(buf, n, "-");
        return;
    }
    int shown = cnt <= 8 ? cnt : 2;
    len += (size_t)snprintf(buf + len, n - len, "{");
    for (int i = 0; i < shown && len < n; i++)
        len += (size_t)snprintf(buf + len, n - len, "%s%d", i ? "," : "", mem[i]);
    if (len >= n)
        return;
    if (cnt > 8)
        snprintf(buf + len, n - len, ",...,%d} (%d ranks)", mem[cnt - 1], cnt);
    else
        snprintf(buf + len, n - len, "}");
}

static void print_rank(FILE *f, const par_layout *l, int r, int *mem)
{
    par_rank_coords c;
    if (par_rank_coords_of(l, r, &c) != PAR_OK)
        return;
    fprintf(f, "  rank %d: pp %d | tp %d cp %d dp %d | etp %d ep %d edp %d\n", r, c.pp, c.tp, c.cp, c.dp,
            c.etp, c.ep, c.edp);
    int width = 0;
    for (int k = 0; k < PAR_GROUP_COUNT; k++) {
        int n = 0;
        if (par_group_members(l, (par_group_kind)k, r, mem, (int)l->world, &n) != PAR_OK)
            continue;
        char buf[96];
        format_members(buf, sizeof buf, mem, n);
        char item[128];
        int w = snprintf(item, sizeof item, "%s %s", par_group_name((par_group_kind)k), buf);
        if (width > 0 && width + 2 + w > 96) {
            fprintf(f, "\n");
            width = 0;
        }
        fprintf(f, "%s%s", width ? "  " : "      ", item);
        width += (width ? 2 : 6) + w;
    }
    fprintf(f, "\n");
}

void par_plan_print(FILE *f, const par_layout *l, const par_config *cfg, int rank)
{
    if (!l->resolved) {
        fprintf(f, "(layout not resolved)\n");
        return;
    }
    fprintf(f, "model    %s%s: n_layers %lld + %lld MTP, %lld routed experts, B %lld rows x S %lld "
               "tokens, window %lld, D_window %lld\n",
            cfg->preset, cfg->runnable ? "" : " (planning only)", LL(cfg->n_layers), LL(cfg->n_mtp_layers),
            LL(cfg->n_routed_experts), LL(cfg->global_batch_size), LL(cfg->seq_length),
            LL(cfg->window_size), LL(l->d_window));
    fprintf(f, "layout   TP %lld  PP %lld  VPP %lld  CP %lld  EP %lld  ETP %lld  schedule %s  "
               "distributed optimizer %s\n",
            LL(l->tp), LL(l->pp), LL(l->vpp), LL(l->cp), LL(l->ep), LL(l->etp), l->schedule,
            l->distributed_optimizer ? "yes" : "no");
    int64_t per = l->world / l->pp;
    fprintf(f, "world    N = %lld: N/PP = %lld = TP*CP*Da = %lld*%lld*%lld = ETP*EP*De = %lld*%lld*%lld\n",
            LL(l->world), LL(per), LL(l->tp), LL(l->cp), LL(l->da), LL(l->etp), LL(l->ep), LL(l->de));
    fprintf(f, "         Da = %lld (attention data parallel), De = %lld (expert data parallel)\n", LL(l->da),
            LL(l->de));
    fprintf(f, "batch    B = %lld = micro-batch-size %lld * Da %lld * m %lld: %lld microbatches per step "
               "and pipeline",
            LL(l->global_batch), LL(l->micro_batch), LL(l->da), LL(l->n_micro), LL(l->n_micro));
    if (!strcmp(l->schedule, "interleaved"))
        fprintf(f, ", microbatch group %lld", LL(l->mb_group));
    fprintf(f, "\n");
    fprintf(f, "tokens   S/CP = %lld/%lld = %lld local rows per row (D_window %lld)%s\n", LL(cfg->seq_length),
            LL(l->cp), LL(cfg->seq_length / l->cp), LL(l->d_window),
            l->cp > 1 ? "" : "; CP 1: no boundary exchange");
    fprintf(f, "experts  %lld / EP %lld = %lld routed experts per rank\n", LL(cfg->n_routed_experts),
            LL(l->ep), LL(cfg->n_routed_experts / l->ep));

    char str[PAR_LAYOUT_STR_MAX + 64];
    par_pplayout_format(&l->pipe, str, (int)sizeof str);
    fprintf(f, "pipeline %s '%s'\n", l->pipe.from_string ? "layout" : "default even split (Megatron-LM),", str);
    fprintf(f, "  segment  pp rank  chunk  blocks                layers\n");
    for (int s = 0; s < l->pipe.n_segments; s++) {
        char blk[128];
        par_pplayout_format_segment(&l->pipe, s, blk, (int)sizeof blk);
        int nt = par_pplayout_count(&l->pipe, s, PAR_BLK_LAYER);
        int off = par_pplayout_offset(&l->pipe, s, PAR_BLK_LAYER);
        int nm = par_pplayout_count(&l->pipe, s, PAR_BLK_MTP);
        char lay[64] = "-";
        if (nt == 1)
            snprintf(lay, sizeof lay, "%d", off);
        else if (nt > 1)
            snprintf(lay, sizeof lay, "%d-%d", off, off + nt - 1);
        if (nm > 0) {
            size_t len = strlen(lay);
            if (!strcmp(lay, "-"))
                len = 0;
            int moff = par_pplayout_offset(&l->pipe, s, PAR_BLK_MTP);
            snprintf(lay + len, sizeof lay - len, "%smtp %d%s", len ? ", " : "", moff,
                     nm > 1 ? "+" : "");
        }
        fprintf(f, "  %-8d %-8d %-6d %-21s %s\n", s, par_layout_segment_rank(l, s), par_layout_segment_chunk(l, s),
                blk, lay);
    }

    int *mem = par_malloc((size_t)l->world * sizeof *mem, PAR_TAG_MISC);
    if (!mem) {
        fprintf(f, "(out of memory for the group table)\n");
        return;
    }
    fprintf(f, "ranks    attention order tp-cp-dp-pp, expert order etp-ep-edp-pp (tp fastest)\n");
    if (rank >= 0) {
        print_rank(f, l, rank, mem);
    } else {
        int shown = 0;
        int last = -1;
        for (int s = 0; s < (int)l->pp && shown < 12; s++) {
            int cand[3] = {(int)(s * per), (int)(s * per + 1), (int)(s * per + per - 1)};
            for (int i = 0; i < 3 && shown < 12; i++) {
                if (cand[i] <= last || cand[i] >= (s + 1) * per)
                    continue;
                print_rank(f, l, cand[i], mem);
                last = cand[i];
                shown++;
            }
        }
        if (shown < l->world)
            fprintf(f, "  (%d of %lld ranks shown; --rank R shows one)\n", shown, LL(l->world));
    }
    par_free(mem);
}
