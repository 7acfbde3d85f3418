/* tests/model/test_batchexport.c - packed batches for a framework
 * (model/batchexport.h): a golden set's batches equal the generator's, the
 * fields follow MODEL.md section 1 (checked with loops of their own), the
 * .npy files are numpy format 1.0, batch.json hashes what it lists. */
#include <criterion/criterion.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/fileio.h"
#include "core/json.h"
#include "core/safetensors.h"
#include "core/sha256.h"
#include "files.h"
#include "model/batchexport.h"
#include "tmpdir.h"

static const char *src_root(void)
{
    const char *r = getenv("PARITY_SOURCE_ROOT");
    return r ? r : ".";
}

static void export_set(const char *out)
{
    char set[PATH_MAX];
    snprintf(set, sizeof set, "%s/golden/v4-tiny", src_root());
    par_batch_export_opts o;
    memset(&o, 0, sizeof o);
    o.set_dir = set;
    par_batch_export_info info;
    cr_assert_eq(par_batch_export(&o, out, &info), 0, "%s", par_last_error());
    cr_expect_eq(info.steps, 3);
    cr_expect(info.B == 8 && info.S == 64);
}

Test(batchexport, golden_set_equals_the_generator)
{
    char *d = mktmp(), *a = sub(d, "set"), *b = sub(d, "gen");
    export_set(a);
    par_batch_export_opts o;
    memset(&o, 0, sizeof o);
    cr_assert_eq(par_config_preset(&o.cfg, "v4-tiny"), 0);
    o.fixture = "tiny-boundary-mix"; /* golden/v4-tiny/REGENERATE.md */
    o.steps = 3;
    o.seed = 1234;
    cr_assert_eq(par_batch_export(&o, b, NULL), 0, "%s", par_last_error());
    for (int k = 0; k < 3; k++) {
        char n[64];
        snprintf(n, sizeof n, "batch.%d.safetensors", k);
        char *x = sub(a, n), *y = sub(b, n);
        cr_expect(files_equal(x, y), "step %d differs", k);
        free(x), free(y);
    }
    rmtree(d);
    free(a), free(b), free(d);
}

static const int32_t *field(const par_st_file *f, const char *name)
{
    const par_tensor *t = par_st_find(f, name);
    cr_assert(t, "no field %s", name);
    return t->data;
}

/* MODEL.md section 1, from segments and tokens alone. */
Test(batchexport, fields_follow_model_md)
{
    char *d = mktmp(), *a = sub(d, "set"), *p = sub(a, "batch.1.safetensors");
    export_set(a);
    par_st_file *f = NULL;
    cr_assert_eq(par_st_read(p, &f), 0);
    const int32_t *tok = field(f, "tokens"), *seg = field(f, "segments"), *pos = field(f, "position_ids");
    const int32_t *lab = field(f, "labels"), *mi = field(f, "mtp_input_ids"), *ml = field(f, "mtp_labels");
    const float *lm = (const float *)field(f, "loss_mask"), *mm = (const float *)field(f, "mtp_loss_mask");
    const par_tensor *cut = par_st_find(f, "cu_seqlens");
    const int32_t *cu = cut->data, *num = field(f, "num_samples"), *flat = field(f, "cu_seqlens_flat");
    const int32_t *ids = field(f, "sample_ids");
    int64_t S = 64, W = cut->shape[1], nmain = 0, nmtp = 0, q = -1, nf = 0;
    for (int64_t r = 0; r < 8; r++) {
        int64_t k = 0;
        for (int64_t s = 0; s < S; s++) {
            int64_t t = r * S + s;
            int start = s == 0 || seg[t] != seg[t - 1];
            int same1 = s + 1 < S && seg[t + 1] == seg[t], same2 = s + 2 < S && seg[t + 2] == seg[t];
            cr_assert_eq(pos[t], start ? 0 : pos[t - 1] + 1, "pos at %lld", (long long)t);
            cr_assert_eq(lab[t], same1 ? tok[t + 1] : -1);
            cr_assert_eq(mi[t], same1 ? tok[t + 1] : 0);
            cr_assert_eq(ml[t], same2 ? tok[t + 2] : -1);
            cr_assert_eq(lm[t], same1 ? 1.0f : 0.0f);
            cr_assert_eq(mm[t], same2 ? 1.0f : 0.0f);
            nmain += same1;
            nmtp += same2;
            if (start) {
                cr_assert_eq(cu[r * W + k++], s, "row %lld boundary %lld", (long long)r, (long long)k);
                cr_assert_eq(flat[nf++], t);
                q++;
            }
            cr_assert_eq(ids[t], q);
        }
        cr_assert_eq(num[r], k);
        cr_assert_eq(cu[r * W + k], S);
        for (int64_t j = k + 1; j < W; j++)
            cr_assert_eq(cu[r * W + j], -1);
    }
    cr_assert_eq(flat[nf], 8 * S);
    cr_expect_eq(*(const int64_t *)field(f, "n_main"), nmain);
    cr_expect_eq(*(const int64_t *)field(f, "n_mtp"), nmtp);
    cr_expect_eq(*(const int64_t *)field(f, "n_samples"), q + 1);
    par_st_close(f);
    rmtree(d);
    free(p), free(a), free(d);
}

Test(batchexport, npy_header_and_batch_json)
{
    int64_t sh[2] = {2, 3};
    int32_t v[6] = {1, 2, 3, 4, 5, 6};
    void *buf;
    size_t len;
    cr_assert_eq(par_npy_encode(PAR_I32, 2, sh, v, &buf, &len), 0);
    const unsigned char *b = buf;
    size_t hl = (size_t)b[8] | ((size_t)b[9] << 8);
    cr_expect(!memcmp(b, "\x93NUMPY\x01\x00", 8));
    cr_expect_eq((10 + hl) % 64, 0, "data 64-byte aligned");
    cr_expect_eq(b[10 + hl - 1], '\n');
    cr_expect(strstr((const char *)b + 10, "'shape': (2, 3)") != NULL);
    cr_expect(strstr((const char *)b + 10, "'descr': '<i4'") != NULL);
    cr_expect_eq(len, 10 + hl + sizeof v);
    cr_expect(!memcmp(b + 10 + hl, v, sizeof v));
    par_free(buf);
    cr_assert_eq(par_npy_encode(PAR_I64, 0, sh, v, &buf, &len), 0);
    cr_expect(strstr((const char *)buf + 10, "'shape': ()") != NULL);
    par_free(buf);
    cr_assert_eq(par_npy_encode(PAR_F32, 1, sh, v, &buf, &len), 0);
    cr_expect(strstr((const char *)buf + 10, "'shape': (2,)") != NULL);
    par_free(buf);

    char *d = mktmp(), *a = sub(d, "set"), *jp = sub(a, PAR_BATCH_JSON);
    export_set(a);
    cJSON *j = NULL;
    cr_assert_eq(par_json_read_file(jp, &j), 0);
    cr_expect_str_eq(par_json_str(j, "format"), PAR_BATCH_FORMAT);
    cr_expect_eq(cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(j, "fields")), 16);
    const cJSON *files = par_json_obj(j, "files");
    cr_expect_eq(cJSON_GetArraySize(files), 3 * 17);
    for (const cJSON *e = files->child; e; e = e->next) {
        char *fp = sub(a, e->string), hex[PAR_SHA256_HEX];
        cr_assert_eq(par_sha256_file(fp, hex), 0, "%s", e->string);
        cr_expect_str_eq(hex, e->valuestring, "%s", e->string);
        free(fp);
    }
    cJSON_Delete(j);
    rmtree(d);
    free(jp), free(a), free(d);
}
