/* tests/matrix/test_rankof.c - the rank of a layout that owned a
 * diverging element (matrix/rankof.h), from a set's manifest: the DP and
 * CP ranks of a row, the EP rank of an expert, the pipeline stage of a
 * block (interleaved included), the layout after a checkpoint of a resumed
 * pair's merged set; nothing for a serial set. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "core/fileio.h"
#include "matrix/rankof.h"
#include "tmpdir.h"

static const char *model_json =
    "\"model\": {\"n_layers\": 3, \"n_mtp_layers\": 1, \"n_routed_experts\": 8, \"window_size\": 8, "
    "\"compress_ratios\": [0, 4, 16, 0]}, \"train\": {\"seq_length\": 64, \"global_batch_size\": 8}";

/* A set directory holding only a manifest with this "layout" object. */
static void make_set(const char *dir, const char *layout)
{
    cr_assert_eq(mkdir(dir, 0777), 0, "mkdir %s", dir);
    char *path = sub(dir, "manifest.json");
    char text[2048];
    int n = snprintf(text, sizeof text, "{\"format\": \"parity-golden\", \"version\": 1, %s, \"layout\": {%s}}",
                     model_json, layout);
    cr_assert(n > 0 && (size_t)n < sizeof text);
    cr_assert_eq(par_file_write_atomic(path, text, (size_t)n), 0, "%s", par_last_error());
    free(path);
}

static const char *owner(const char *layout, const char *file, const char *tensor, int ndim, const int64_t *coord)
{
    char *t = mktmp(), *d = sub(t, "set");
    make_set(d, layout);
    par_rankof x;
    cr_assert_eq(par_rankof_from_set(d, &x), 0, "%s", par_last_error());
    static char buf[300];
    if (!par_rankof_describe(&x, file, tensor, ndim, coord, buf, sizeof buf))
        buf[0] = 0;
    rmtree(t);
    free(d);
    free(t);
    return buf;
}

Test(rankof, row_of_dp_and_cp)
{
    const int64_t c[4] = {5, 40, 0, 0};
    const char *s = owner("\"world_size\": 8, \"data_parallel_size\": 4, \"context_parallel_size\": 2",
                          "step.0.safetensors", "act.layers.1", 4, c);
    /* B/Da = 2 rows per DP rank: row 5 on dp 2; S/CP = 32: pos 40 on cp 1; rank = cp + CP*dp = 5 */
    cr_expect(strstr(s, "dp rank 2 of 4") && strstr(s, "cp rank 1 of 2") && strstr(s, "world rank 5"), "%s", s);
}

Test(rankof, expert_of_ep)
{
    const int64_t c[2] = {0, 0};
    const char *s = owner("\"world_size\": 8, \"expert_model_parallel_size\": 4", "step.1.safetensors",
                          "grad.layers.1.ffn.experts.5.w1.weight", 2, c);
    /* E/EP = 2 experts per EP rank: expert 5 on ep 2 = world rank 2 (edp 0), De = 2 replicas */
    cr_expect(strstr(s, "expert 5 on ep rank 2 of 4") && strstr(s, "world rank 2") && strstr(s, "replicas"), "%s", s);
    const int64_t e[1] = {7};
    s = owner("\"world_size\": 8, \"expert_model_parallel_size\": 4", "step.1.safetensors", "router.layers.0.load",
              1, e);
    cr_expect(strstr(s, "expert 7 on ep rank 3 of 4"), "a load's element is an expert: %s", s);
}

Test(rankof, stage_of_a_block)
{
    const int64_t c[1] = {0};
    const char *pp = "\"world_size\": 2, \"pipeline_model_parallel_size\": 2, \"pipeline_schedule\": \"1f1b\", "
                     "\"pipeline_model_parallel_layout\": \"Et*3|mL\"";
    cr_expect(strstr(owner(pp, "step.0.safetensors", "grad.mtp.0.attn_norm.weight", 1, c), "stage 1 of 2"));
    cr_expect(strstr(owner(pp, "step.0.safetensors", "grad.layers.2.attn_norm.weight", 1, c), "stage 0 of 2"));
    cr_expect(strstr(owner(pp, "params.1.safetensors", "head.weight", 1, c), "stage 1 of 2"));
    /* interleaved, 6 segments: segment s on rank s % 2; layer 1 is segment 2, row 3 microbatch 3 */
    const char *vpp = "\"world_size\": 2, \"pipeline_model_parallel_size\": 2, \"virtual_pipeline_model_parallel_size\": "
                      "3, \"pipeline_schedule\": \"interleaved\", \"pipeline_model_parallel_layout\": "
                      "\"E|t|t|t|m|L\"";
    const int64_t r[4] = {3, 0, 0, 0};
    const char *s = owner(vpp, "step.0.safetensors", "act.layers.1", 4, r);
    cr_expect(strstr(s, "stage 0 of 2 (microbatch 3)") && strstr(s, "world rank 0"), "%s", s);
    s = owner(vpp, "step.0.safetensors", "act.layers.2", 4, r);
    cr_expect(strstr(s, "stage 1 of 2") && strstr(s, "world rank 1"), "%s", s);
}

Test(rankof, layout_after_a_checkpoint)
{
    const char *pair = "\"world_size\": 4, \"data_parallel_size\": 4, \"after_checkpoint\": {\"world_size\": 4, "
                       "\"context_parallel_size\": 2, \"from_step\": 1}";
    const int64_t c[4] = {7, 63, 0, 0};
    const char *s = owner(pair, "step.0.safetensors", "act.layers.0", 4, c);
    cr_expect(strstr(s, "dp rank 3 of 4") && !strstr(s, "cp rank"), "before the checkpoint: %s", s);
    s = owner(pair, "step.1.safetensors", "act.layers.0", 4, c);
    cr_expect(strstr(s, "dp rank 1 of 2") && strstr(s, "cp rank 1 of 2") && strstr(s, "world rank 3"),
              "after it: %s", s);
}

Test(rankof, serial_set_names_no_rank)
{
    const int64_t c[4] = {1, 1, 0, 0};
    cr_expect_str_eq(owner("\"world_size\": 1", "step.0.safetensors", "act.layers.0", 4, c), "");
}
