/* Fuzz target: a JSON model config (model/config.h par_config_from_json over a
 * preset, then validation and the parameter count a plan computes). */
#include "core/json.h"
#include "fuzz.h"
#include "model/config.h"
#include "model/params.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_begin();
    cJSON *root;
    if (par_json_parse((const char *)data, size, "fuzz", &root) == PAR_OK) {
        par_config c;
        par_config_preset(&c, "v4-tiny");
        if (par_config_from_json(&c, root) == PAR_OK && par_config_validate(&c) == PAR_OK) {
            int64_t nt, nf, ni;
            par_param_count(&c, &nt, &nf, &ni);
            cJSON *j = par_config_to_json(&c);
            cJSON_Delete(j);
        }
        cJSON_Delete(root);
    }
    fuzz_end();
    return 0;
}
