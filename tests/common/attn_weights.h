/* tests/common/attn_weights.h - the 18 weights of the attention layer
 * (kernels/attention.h, f64) by index: name, slot in the weights struct, and
 * element count for given dims.  Shared by the kernel and CP tests. */
#ifndef PAR_TESTS_ATTN_WEIGHTS_H
#define PAR_TESTS_ATTN_WEIGHTS_H

#include <stdint.h>

#include "kernels/attention.h"

#define PAR_TEST_ATTN_NW 18

static const char *const wname[PAR_TEST_ATTN_NW] = {"wq_a",      "q_norm",       "wq_b",           "wkv",
                                "kv_norm",   "wo_a",         "wo_b",           "attn_sink",
                                "cmp_wkv",   "cmp_wgate",    "cmp_ape",        "cmp_norm",
                                "idx_wq_b",  "idx_weights_proj", "idx_cmp_wkv", "idx_cmp_wgate",
                                "idx_cmp_ape", "idx_cmp_norm"};

static inline double **wslot(par_attn_weights_f64 *W, int k)
{
    double **f[PAR_TEST_ATTN_NW] = {&W->wq_a,     &W->q_norm,    &W->wq_b,      &W->wkv,
                      &W->kv_norm,  &W->wo_a,      &W->wo_b,      &W->attn_sink,
                      &W->cmp_wkv,  &W->cmp_wgate, &W->cmp_ape,   &W->cmp_norm,
                      &W->idx_wq_b, &W->idx_weights_proj, &W->idx_cmp_wkv,
                      &W->idx_cmp_wgate, &W->idx_cmp_ape, &W->idx_cmp_norm};
    return f[k];
}

/* element count of weight k (0 when the layer has none); fan-in in *fan */
static inline int64_t wcount(const par_attn_dims *dm, int k, int64_t *fan)
{
    int64_t coff = dm->m == 4 ? 2 : 1, HD = dm->H * dm->hd, GL = dm->o_groups * dm->o_lora;
    int cm = dm->m > 0, ix = dm->m == 4;
    int64_t n = 0, f = 0;
    switch (k) {
    case 0: n = dm->q_lora * dm->d; f = dm->d; break;
    case 1: n = dm->q_lora; break;
    case 2: n = HD * dm->q_lora; f = dm->q_lora; break;
    case 3: n = dm->hd * dm->d; f = dm->d; break;
    case 4: n = dm->hd; break;
    case 5: n = GL * HD / dm->o_groups; f = HD / dm->o_groups; break;
    case 6: n = dm->d * GL; f = GL; break;
    case 7: n = dm->H; break;
    case 8: case 9: n = cm ? coff * dm->hd * dm->d : 0; f = dm->d; break;
    case 10: n = cm ? dm->m * coff * dm->hd : 0; break;
    case 11: n = cm ? dm->hd : 0; break;
    case 12: n = ix ? dm->iH * dm->ihd * dm->q_lora : 0; f = dm->q_lora; break;
    case 13: n = ix ? dm->iH * dm->d : 0; f = dm->d; break;
    case 14: case 15: n = ix ? 2 * dm->ihd * dm->d : 0; f = dm->d; break;
    case 16: n = ix ? 4 * 2 * dm->ihd : 0; break;
    case 17: n = ix ? dm->ihd : 0; break;
    }
    if (fan)
        *fan = f;
    return n;
}

#endif
