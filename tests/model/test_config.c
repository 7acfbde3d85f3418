/* model: configuration, presets, --set, JSON, validation. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/status.h"
#include "model/config.h"
#include "model/params.h"

static void quiet(void) { par_err_set_quiet(1); }

TestSuite(config, .init = quiet);

Test(config, presets_validate_and_runnable_flags)
{
    const char *const *names = par_config_preset_names();
    int n = 0;
    for (; names[n]; n++) {
        par_config c;
        cr_assert_eq(par_config_preset(&c, names[n]), PAR_OK, "%s", names[n]);
        cr_expect_eq(par_config_validate(&c), PAR_OK, "%s: %s", names[n], par_last_error());
        cr_expect_str_eq(c.preset, names[n]);
        cr_expect_eq(c.n_compress_ratios, c.n_layers + c.n_mtp_layers, "%s", names[n]);
        int want_run = !strcmp(names[n], "v4-tiny") || !strcmp(names[n], "v4-mini");
        cr_expect_eq(c.runnable, want_run, "%s", names[n]);
    }
    cr_expect_eq(n, 4);
    par_config c;
    cr_expect_eq(par_config_preset(&c, "v4-huge"), PAR_ENOTFOUND);
    cr_expect(strstr(par_last_error(), "v4-huge") && strstr(par_last_error(), "v4-tiny"));
}

Test(config, tiny_and_mini_match_model_md)
{
    par_config c;
    par_config_preset(&c, "v4-tiny");
    cr_expect_eq(c.vocab_size, 128);
    cr_expect_eq(c.dim, 32);
    cr_expect_eq(c.window_size, 8);
    int64_t r[4] = {0, 4, 16, 0};
    for (int i = 0; i < 4; i++)
        cr_expect_eq(c.compress_ratios[i], r[i]);
    cr_expect_eq(c.global_batch_size, 8);
    cr_expect_eq(c.seq_length, 64);
    cr_expect_eq(c.index_topk, 4);
    cr_expect_eq(c.n_routed_experts, 8);
    cr_expect(c.aux_alpha == 0.01 && c.lr == 1e-3 && c.mu == 0.95 && c.hc_eps == 1e-6);
    par_config_preset(&c, "v4-mini");
    int64_t rm[9] = {16, 16, 4, 16, 4, 16, 4, 16, 0};
    for (int i = 0; i < 9; i++)
        cr_expect_eq(c.compress_ratios[i], rm[i]);
    cr_expect_eq(c.n_routed_experts, 384);
    cr_expect_eq(c.n_activated_experts, 6);
    cr_expect_eq(c.global_batch_size, 32);
    cr_expect_eq(c.seq_length, 128);
    par_config_preset(&c, "v4-pro");
    cr_expect_eq(c.n_compress_ratios, 62);
    cr_expect_eq(c.compress_ratios[0], 128);
    cr_expect_eq(c.compress_ratios[2], 4);
    cr_expect_eq(c.compress_ratios[60], 4);
    cr_expect_eq(c.compress_ratios[61], 0);
    cr_expect(c.aux_alpha == 1e-4 && c.lr == 2e-4);
    par_config_preset(&c, "v4-flash");
    cr_expect_eq(c.n_compress_ratios, 44);
    cr_expect_eq(c.dim, 4096);
    cr_expect_eq(c.compress_ratios[3], 128);
    cr_expect_eq(c.compress_ratios[42], 4);
    cr_expect_eq(c.compress_ratios[43], 0);
    cr_expect(c.route_scale == 1.5);
}

Test(config, set_keys_and_errors_name_the_key)
{
    par_config c;
    par_config_preset(&c, "v4-tiny");
    cr_assert_eq(par_config_set(&c, "compress_ratios", "0,4,16,16"), PAR_OK);
    cr_expect_eq(c.compress_ratios[3], 16);
    cr_expect_eq(c.n_compress_ratios, 4);
    cr_assert_eq(par_config_set(&c, "lr", "2.5e-4"), PAR_OK);
    cr_expect(c.lr == 2.5e-4);
    cr_assert_eq(par_config_set_arg(&c, "dim=48"), PAR_OK);
    cr_expect_eq(c.dim, 48);
    cr_assert_eq(par_config_set_arg(&c, "seq_length=32"), PAR_OK);
    cr_expect_eq(c.seq_length, 32);

    cr_expect_eq(par_config_set(&c, "dimension", "3"), PAR_ENOTFOUND);
    cr_expect(strstr(par_last_error(), "'dimension'"), "%s", par_last_error());
    cr_expect_eq(par_config_set(&c, "dim", "3x"), PAR_EINVAL);
    cr_expect(strstr(par_last_error(), "'dim'") && strstr(par_last_error(), "3x"), "%s", par_last_error());
    cr_expect_eq(par_config_set(&c, "lr", "fast"), PAR_EINVAL);
    cr_expect(strstr(par_last_error(), "'lr'"));
    cr_expect_eq(par_config_set(&c, "compress_ratios", "0,4,,0"), PAR_EINVAL);
    cr_expect(strstr(par_last_error(), "compress_ratios"));
    cr_expect_eq(par_config_set_arg(&c, "noequals"), PAR_EINVAL);
    cr_expect_eq(c.dim, 48, "a failed set leaves the value alone");

    char buf[128];
    cr_assert_eq(par_config_get(&c, "compress_ratios", buf, sizeof buf), PAR_OK);
    cr_expect_str_eq(buf, "0,4,16,16");
    cr_assert_eq(par_config_get(&c, "lr", buf, sizeof buf), PAR_OK);
    cr_expect_str_eq(buf, "0.00025000000000000001");
}

/* Each broken rule is reported, naming the rule and the numbers. */
static void expect_invalid(const char *key, const char *value, const char *needle)
{
    par_config c;
    par_config_preset(&c, "v4-tiny");
    cr_assert_eq(par_config_set(&c, key, value), PAR_OK, "%s", key);
    cr_expect_eq(par_config_validate(&c), PAR_EINVAL, "%s=%s should be invalid", key, value);
    cr_expect(strstr(par_last_error(), needle), "%s=%s: message '%s' lacks '%s'", key, value, par_last_error(),
              needle);
}

Test(config, validation_rules)
{
    expect_invalid("compress_ratios", "0,4,2,0", "compress_ratios[2] = 2 must be 0, 4 or > 4");
    expect_invalid("compress_ratios", "0,4,-1,0", "compress_ratios[2] = -1");
    expect_invalid("compress_ratios", "0,4,16", "compress_ratios has 3 entries");
    expect_invalid("index_topk", "0", "index_topk must be >= 1, got 0");
    expect_invalid("n_activated_experts", "9", "n_activated_experts must be in [1, n_routed_experts = 8], got 9");
    expect_invalid("n_activated_experts", "0", "got 0");
    expect_invalid("dim", "0", "dim must be >= 1, got 0");
    expect_invalid("moe_inter_dim", "-3", "moe_inter_dim must be >= 1, got -3");
    expect_invalid("rope_head_dim", "7", "rope_head_dim must be even");
    expect_invalid("rope_head_dim", "18", "rope_head_dim = 18 must be <= head_dim = 16");
    expect_invalid("index_head_dim", "6", "rope_head_dim = 8 must be <= index_head_dim = 6");
    expect_invalid("o_groups", "3", "n_heads = 2 must be divisible by o_groups = 3");
    expect_invalid("n_hash_layers", "4", "n_hash_layers must be in [0, n_layers = 3], got 4");
    expect_invalid("n_mtp_layers", "2", "n_mtp_layers must be 0 or 1, got 2");
    expect_invalid("n_shared_experts", "2", "n_shared_experts must be 1");
    expect_invalid("global_batch_size", "0", "global_batch_size must be >= 1");
    expect_invalid("mu", "1", "mu must be in [0, 1)");
    expect_invalid("clip_grad", "0", "clip_grad must be > 0");
    expect_invalid("norm_eps", "0", "norm_eps must be > 0");
    expect_invalid("beta_fast", "0.5", "beta_fast > beta_slow");
    /* n_mtp_layers = 0 needs 3 ratios */
    par_config c;
    par_config_preset(&c, "v4-tiny");
    par_config_set(&c, "n_mtp_layers", "0");
    par_config_set(&c, "compress_ratios", "0,4,16");
    cr_expect_eq(par_config_validate(&c), PAR_OK, "%s", par_last_error());
}

static void expect_same(const par_config *a, const par_config *b)
{
    char va[2048], vb[2048];
    for (int i = 0; par_config_key_name(i); i++) {
        const char *k = par_config_key_name(i);
        par_config_get(a, k, va, sizeof va);
        par_config_get(b, k, vb, sizeof vb);
        cr_expect_str_eq(va, vb, "key %s: %s vs %s", k, va, vb);
    }
}

Test(config, json_round_trip_flat_and_sections)
{
    const char *const *names = par_config_preset_names();
    for (int p = 0; names[p]; p++) {
        par_config c, d;
        par_config_preset(&c, names[p]);
        par_config_set(&c, "lr", "0.123456789012345678");
        cJSON *j = par_config_to_json(&c);
        cr_assert(j);
        char *txt = cJSON_PrintUnformatted(j);
        cJSON_Delete(j);
        cJSON *back = cJSON_Parse(txt);
        free(txt);
        memset(&d, 0, sizeof d);
        cr_assert_eq(par_config_from_json(&d, back), PAR_OK, "%s", par_last_error());
        cJSON_Delete(back);
        expect_same(&c, &d);
        cr_expect_eq(d.runnable, c.runnable);

        /* manifest form: model / train / batch sections */
        cJSON *m = cJSON_CreateObject();
        cJSON_AddItemToObject(m, "model", par_config_section_to_json(&c, PAR_CFG_MODEL));
        cJSON_AddItemToObject(m, "train", par_config_section_to_json(&c, PAR_CFG_TRAIN));
        cJSON_AddItemToObject(m, "batch", par_config_section_to_json(&c, PAR_CFG_BATCH));
        cr_expect(cJSON_GetObjectItem(cJSON_GetObjectItem(m, "model"), "compress_ratios"));
        cr_expect(!cJSON_GetObjectItem(cJSON_GetObjectItem(m, "model"), "lr"));
        cr_expect(cJSON_GetObjectItem(cJSON_GetObjectItem(m, "train"), "mu"));
        memset(&d, 0, sizeof d);
        cr_assert_eq(par_config_from_json(&d, m), PAR_OK, "%s", par_last_error());
        cJSON_Delete(m);
        expect_same(&c, &d);
    }
}

Test(config, json_errors_name_the_key)
{
    par_config c;
    par_config_preset(&c, "v4-tiny");
    cJSON *j = cJSON_Parse("{\"dim\": 40, \"windowsize\": 3}");
    cr_expect_eq(par_config_from_json(&c, j), PAR_ENOTFOUND);
    cr_expect(strstr(par_last_error(), "windowsize"));
    cr_expect_eq(c.dim, 32, "failed apply leaves the config unchanged");
    cJSON_Delete(j);
    j = cJSON_Parse("{\"dim\": 40.5}");
    cr_expect_eq(par_config_from_json(&c, j), PAR_EINVAL);
    cr_expect(strstr(par_last_error(), "'dim'"));
    cJSON_Delete(j);
    j = cJSON_Parse("{\"compress_ratios\": [0, \"4\"]}");
    cr_expect_eq(par_config_from_json(&c, j), PAR_EINVAL);
    cJSON_Delete(j);
    j = cJSON_Parse("{\"preset\": \"v4-mini\", \"dim\": 96}");
    cr_expect_eq(par_config_from_json(&c, j), PAR_OK);
    cr_expect_eq(c.dim, 96);
    cr_expect_eq(c.n_layers, 8);
    cJSON_Delete(j);
}

Test(config, load_file)
{
    char path[] = "/tmp/parity-cfg-XXXXXX";
    int fd = mkstemp(path);
    cr_assert(fd >= 0);
    const char *txt = "{\"preset\": \"v4-tiny\", \"compress_ratios\": [0, 16, 4, 0], \"lr\": 0.01}";
    cr_assert_eq(write(fd, txt, strlen(txt)), (ssize_t)strlen(txt));
    close(fd);
    par_config c;
    memset(&c, 0, sizeof c);
    cr_assert_eq(par_config_load_file(&c, path), PAR_OK, "%s", par_last_error());
    cr_expect_eq(c.compress_ratios[1], 16);
    cr_expect(c.lr == 0.01);
    cr_expect_eq(par_config_validate(&c), PAR_OK);
    unlink(path);
    cr_expect_eq(par_config_load_file(&c, "/nonexistent/cfg.json"), PAR_ENOTFOUND);
}

Test(config, planning_presets_refuse_to_run)
{
    par_config c;
    par_config_preset(&c, "v4-tiny");
    cr_expect_eq(par_config_check_runnable(&c), PAR_OK);
    par_config_preset(&c, "v4-pro");
    cr_expect_eq(par_config_check_runnable(&c), PAR_EUNSUPPORTED);
    cr_expect(strstr(par_last_error(), "planning only") && strstr(par_last_error(), "parameters"),
              "%s", par_last_error());
    fprintf(stderr, "v4-pro: %s\n", par_last_error());
    par_config_preset(&c, "v4-flash");
    cr_expect_eq(par_config_check_runnable(&c), PAR_EUNSUPPORTED);
    fprintf(stderr, "v4-flash: %s\n", par_last_error());
}

/* Issue 13 item 2: every integer key has a range, so no size product of the
 * parameter table or the activations can overflow. */
Test(config, every_integer_key_is_bounded)
{
    int checked = 0;
    for (int i = 0; par_config_key_name(i); i++) {
        const char *k = par_config_key_name(i);
        par_config c;
        par_config_preset(&c, "v4-tiny");
        char buf[64];
        cr_assert_eq(par_config_get(&c, k, buf, sizeof buf), PAR_OK);
        if (strchr(buf, '.') || strchr(buf, 'e') || strchr(buf, ',') || !strcmp(k, "n_mtp_layers") ||
            !strcmp(k, "n_shared_experts") || !strcmp(k, "n_hash_layers"))
            continue; /* reals, the ratio list, keys with a fixed set of values */
        if (par_config_set(&c, k, "9223372036854775807") != PAR_OK)
            continue;
        cr_assert_eq(par_config_get(&c, k, buf, sizeof buf), PAR_OK);
        if (strcmp(buf, "9223372036854775807"))
            continue; /* a real key */
        cr_expect_eq(par_config_validate(&c), PAR_EINVAL, "%s = 2^63-1 validated", k);
        cr_expect(strstr(par_last_error(), k), "%s: %s", k, par_last_error());
        checked++;
    }
    cr_expect_geq(checked, 20, "only %d integer keys checked", checked);
    expect_invalid("dim", "2147483648", "dim must be <= 65536, got 2147483648");
    expect_invalid("compress_ratios", "0,4,16,4294967296", "compress_ratios[3] = 4294967296");
    par_config c;
    par_config_preset(&c, "v4-tiny");
    par_config_set(&c, "seq_length", "16777216");
    par_config_set(&c, "global_batch_size", "1024");
    cr_expect_eq(par_config_validate(&c), PAR_EINVAL);
    cr_expect(strstr(par_last_error(), "= 17179869184 tokens per step"), "%s", par_last_error());
    /* the planning presets keep a wide margin below the bounds */
    par_config_preset(&c, "v4-pro");
    cr_expect_eq(par_config_validate(&c), PAR_OK, "%s", par_last_error());
    int64_t nt, nf;
    cr_expect_eq(par_param_count(&c, &nt, &nf, NULL), PAR_OK, "%s", par_last_error());
    cr_expect_gt(nf, (int64_t)1e12);
}
