/* tests/model/test_recipe.c - a model under a recipe registers its weights
 * with their classes (kernels/recipe.h) and removes them when freed, so that
 * a later model at the same addresses (the matrix runs many in one process)
 * is not cast; the recipe round-trips through the manifest's JSON. */
#include <criterion/criterion.h>
#include <string.h>

#include "kernels/recipe.h"
#include "model/config.h"
#include "model/model.h"
#include "model/params.h"

Test(model_recipe, registers_its_weights_and_removes_them)
{
    par_config cfg;
    cr_assert_eq(par_config_preset(&cfg, "v4-tiny"), 0);
    cfg.recipe = PAR_RECIPE_V4;
    par_model_f64 M;
    cr_assert_eq(par_model_init_f64(&M, &cfg, 3), 0, "%s", par_last_error());
    int64_t want = 0;
    for (int i = 0; i < M.tab.n; i++) {
        const par_param *p = &M.tab.p[i];
        if (p->dtype == PAR_PDT_REAL && p->ndim == 2 && par_recipe_wclass_of(p->name) != PAR_WCLASS_F32)
            want++;
    }
    cr_expect_gt(want, 0);
    cr_expect_eq(par_recipe_registered(), want, "registered %lld, want %lld", (long long)par_recipe_registered(),
                 (long long)want);
    const int wq_a = par_param_find(&M.tab, "layers.0.attn.wq_a.weight");
    const int gate = par_param_find(&M.tab, "layers.1.ffn.gate.weight");
    cr_assert(wq_a >= 0 && gate >= 0);
    cr_expect_not_null(par_recipe_lookup(par_model_ptr_f64(&M, M.params, wq_a), NULL));
    cr_expect_null(par_recipe_lookup(par_model_ptr_f64(&M, M.params, gate), NULL), "the gate is float32: never cast");
    par_model_free_f64(&M);
    cr_expect_eq(par_recipe_registered(), 0, "%lld registrations outlive the model",
                 (long long)par_recipe_registered());
    cfg.recipe = PAR_RECIPE_NONE; /* no recipe: nothing registered */
    cr_assert_eq(par_model_init_f64(&M, &cfg, 3), 0, "%s", par_last_error());
    cr_expect_eq(par_recipe_registered(), 0);
    par_model_free_f64(&M);
}

Test(model_recipe, manifest_round_trip)
{
    par_config cfg, back;
    cr_assert_eq(par_config_preset(&cfg, "v4-tiny"), 0);
    back = cfg;
    cfg.recipe = PAR_RECIPE_FP8;
    cJSON *train = par_config_section_to_json(&cfg, PAR_CFG_TRAIN);
    cr_assert_not_null(train);
    const cJSON *r = cJSON_GetObjectItemCaseSensitive(train, PAR_CONFIG_RECIPE_KEY);
    cr_assert(cJSON_IsString(r) && !strcmp(r->valuestring, "fp8"));
    cr_expect_eq(par_config_from_json(&back, train), 0, "%s", par_last_error());
    cr_expect_eq(back.recipe, PAR_RECIPE_FP8);
    cJSON_Delete(train);
    cfg.recipe = PAR_RECIPE_NONE; /* none: the manifest stays as it was */
    train = par_config_section_to_json(&cfg, PAR_CFG_TRAIN);
    cr_expect_null(cJSON_GetObjectItemCaseSensitive(train, PAR_CONFIG_RECIPE_KEY));
    cJSON_Delete(train);
    cJSON *bad = cJSON_Parse("{\"recipe\": \"fp16\"}");
    cr_expect_eq(par_config_from_json(&back, bad), PAR_EINVAL);
    cJSON_Delete(bad);
}
