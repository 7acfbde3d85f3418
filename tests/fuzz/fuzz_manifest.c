/* Fuzz target: golden-set manifest.json parsing and validation (core/manifest.h). */
#include "core/manifest.h"
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_begin();
    par_manifest m;
    if (par_manifest_parse((const char *)data, size, "fuzz", &m) == PAR_OK) {
        for (int i = 0; i < m.nfiles; i++)
            if (par_manifest_file_sha(&m, m.files[i].name) == NULL)
                abort();
        cJSON *j = par_manifest_to_json(&m);
        cJSON_Delete(j);
        par_manifest_free(&m);
    }
    fuzz_end();
    return 0;
}
