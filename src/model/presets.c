/* model/presets.c - the named configurations of MODEL.md section 8.
 *
 * v4-tiny, v4-mini: runnable.  v4-pro (MODEL.md table, = the V4-Pro
 * inference/config.json) and v4-flash (DeepSeek-V4-Flash config.json, see
 * docs/model.md for the source) are for planning only (runnable = 0).
 */
#include <string.h>

#include "model/config.h"

static void set_common(par_config *c)
{
    memset(c, 0, sizeof *c);
    c->runnable = 1;
    c->n_shared_experts = 1;
    c->route_scale = 2.5;
    c->swiglu_limit = 10.0;
    c->hc_mult = 4;
    c->hc_sinkhorn_iters = 20;
    c->hc_eps = 1e-6;
    c->norm_eps = 1e-6;
    c->rope_theta = 10000.0;
    c->compress_rope_theta = 160000.0;
    c->rope_factor = 16.0;
    c->original_seq_len = 65536;
    c->beta_fast = 32.0;
    c->beta_slow = 1.0;
    c->mtp_lambda = 0.3;
    c->aux_alpha = 0.01;
    c->bias_update_rate = 1e-3;
    c->lr = 1e-3;
    c->wd = 0.1;
    c->clip_grad = 1.0;
    c->mu = 0.95;
}

static void set_ratios(par_config *c, const int64_t *r, int64_t n)
{
    c->n_compress_ratios = n;
    for (int64_t i = 0; i < n; i++)
        c->compress_ratios[i] = r[i];
}

static void preset_tiny(par_config *c)
{
    static const int64_t r[] = {0, 4, 16, 0};
    set_common(c);
    c->vocab_size = 128;
    c->dim = 32;
    c->n_layers = 3;
    c->n_hash_layers = 1;
    c->n_mtp_layers = 1;
    c->n_heads = 2;
    c->head_dim = 16;
    c->rope_head_dim = 8;
    c->q_lora_rank = 16;
    c->o_groups = 2;
    c->o_lora_rank = 8;
    c->window_size = 8;
    set_ratios(c, r, 4);
    c->index_n_heads = 2;
    c->index_head_dim = 16;
    c->index_topk = 4;
    c->n_routed_experts = 8;
    c->n_activated_experts = 2;
    c->moe_inter_dim = 16;
    c->global_batch_size = 8;
    c->seq_length = 64;
}

static void preset_mini(par_config *c)
{
    static const int64_t r[] = {16, 16, 4, 16, 4, 16, 4, 16, 0};
    set_common(c);
    c->vocab_size = 512;
    c->dim = 64;
    c->n_layers = 8;
    c->n_hash_layers = 3;
    c->n_mtp_layers = 1;
    c->n_heads = 4;
    c->head_dim = 32;
    c->rope_head_dim = 8;
    c->q_lora_rank = 32;
    c->o_groups = 2;
    c->o_lora_rank = 16;
    c->window_size = 16;
    set_ratios(c, r, 9);
    c->index_n_heads = 2;
    c->index_head_dim = 16;
    c->index_topk = 8;
    c->n_routed_experts = 384;
    c->n_activated_experts = 6;
    c->moe_inter_dim = 16;
    c->global_batch_size = 32;
    c->seq_length = 128;
}

static void preset_pro(par_config *c)
{
    set_common(c);
    c->runnable = 0;
    c->vocab_size = 129280;
    c->dim = 7168;
    c->n_layers = 61;
    c->n_hash_layers = 3;
    c->n_mtp_layers = 1;
    c->n_heads = 128;
    c->head_dim = 512;
    c->rope_head_dim = 64;
    c->q_lora_rank = 1536;
    c->o_groups = 16;
    c->o_lora_rank = 1024;
    c->window_size = 128;
    /* 128,128,4,(128,4)x29,0: 62 entries (61 layers + MTP) */
    int64_t n = 0;
    c->compress_ratios[n++] = 128;
    c->compress_ratios[n++] = 128;
    c->compress_ratios[n++] = 4;
    for (int i = 0; i < 29; i++) {
        c->compress_ratios[n++] = 128;
        c->compress_ratios[n++] = 4;
    }
    c->compress_ratios[n++] = 0;
    c->n_compress_ratios = n;
    c->index_n_heads = 64;
    c->index_head_dim = 128;
    c->index_topk = 1024;
    c->n_routed_experts = 384;
    c->n_activated_experts = 6;
    c->moe_inter_dim = 3072;
    c->global_batch_size = 4096;
    c->seq_length = 8192;
    c->aux_alpha = 1e-4;
    c->lr = 2e-4;
}

/* DeepSeek-V4-Flash config.json (HF release; docs/model.md cites it):
 * hidden_size 4096, 43 layers, 3 hash layers, 1 nextn layer, 64 heads of
 * 512 (rope 64), q_lora 1024, o_groups 8, o_lora 1024, sliding_window 128,
 * 256 experts, 6 per token, moe_intermediate_size 2048,
 * routed_scaling_factor 1.5, index 64 x 128 top 512,
 * compress_ratios 0,0,(4,128)x20,4,0 (44 entries). */
static void preset_flash(par_config *c)
{
    set_common(c);
    c->runnable = 0;
    c->vocab_size = 129280;
    c->dim = 4096;
    c->n_layers = 43;
    c->n_hash_layers = 3;
    c->n_mtp_layers = 1;
    c->n_heads = 64;
    c->head_dim = 512;
    c->rope_head_dim = 64;
    c->q_lora_rank = 1024;
    c->o_groups = 8;
    c->o_lora_rank = 1024;
    c->window_size = 128;
    int64_t n = 0;
    c->compress_ratios[n++] = 0;
    c->compress_ratios[n++] = 0;
    for (int i = 0; i < 20; i++) {
        c->compress_ratios[n++] = 4;
        c->compress_ratios[n++] = 128;
    }
    c->compress_ratios[n++] = 4;
    c->compress_ratios[n++] = 0;
    c->n_compress_ratios = n;
    c->index_n_heads = 64;
    c->index_head_dim = 128;
    c->index_topk = 512;
    c->n_routed_experts = 256;
    c->n_activated_experts = 6;
    c->moe_inter_dim = 2048;
    c->route_scale = 1.5;
    c->global_batch_size = 4096;
    c->seq_length = 8192;
    c->aux_alpha = 1e-4;
    c->lr = 2e-4;
}

static const char *const names[] = {"v4-tiny", "v4-mini", "v4-pro", "v4-flash", NULL};

const char *const *par_config_preset_names(void) { return names; }

par_status par_config_preset(par_config *cfg, const char *name)
{
    if (!name)
        return par_err(PAR_EINVAL, "config preset: no name given");
    par_config c;
    if (!strcmp(name, "v4-tiny"))
        preset_tiny(&c);
    else if (!strcmp(name, "v4-mini"))
        preset_mini(&c);
    else if (!strcmp(name, "v4-pro"))
        preset_pro(&c);
    else if (!strcmp(name, "v4-flash"))
        preset_flash(&c);
    else
        return par_err(PAR_ENOTFOUND, "config preset '%s': unknown (known: v4-tiny, v4-mini, v4-pro, v4-flash)",
                       name);
    strncpy(c.preset, name, sizeof c.preset - 1);
    *cfg = c;
    return PAR_OK;
}
