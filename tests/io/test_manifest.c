/* manifest.json: write/read round trip, hashes, validation, overrides. */
#include <criterion/criterion.h>
#include <string.h>

#include "core/alloc.h"
#include "core/fileio.h"
#include "core/json.h"
#include "core/manifest.h"
#include "io_test_util.h"

static int64_t live0;
static void setup(void)
{
    par_err_set_quiet(1);
    live0 = par_alloc_live_total();
}
static void teardown(void)
{
    cr_expect_eq(par_alloc_live_total(), live0, "leaked %lld bytes", (long long)(par_alloc_live_total() - live0));
}
TestSuite(manifest, .init = setup, .fini = teardown);

static void put(const char *dir, const char *name, const char *content)
{
    char *p = par_path_join(dir, name);
    cr_assert_eq(par_file_write_atomic(p, content, strlen(content)), PAR_OK);
    par_free(p);
}

static void make_set(const char *dir)
{
    put(dir, "params.0.safetensors", "pretend tensors 0");
    put(dir, "step.0.safetensors", "pretend step 0");
    put(dir, ".hidden", "not listed");
    par_manifest m;
    par_manifest_init(&m);
    cr_assert_eq(par_manifest_set_generator(&m, "parity", "0.1.0"), PAR_OK);
    cr_assert_eq(par_manifest_set_precision(&m, "f64"), PAR_OK);
    m.steps = 1;
    m.model = cJSON_Parse("{\"dim\": 64, \"n_layers\": 2}");
    m.train = cJSON_Parse("{\"lr\": 0.001, \"mu\": 0.95}");
    m.layout = cJSON_Parse("{\"world_size\": 1, \"context_parallel_size\": 1}");
    m.data = cJSON_Parse("{\"source\": \"synthetic\", \"seed\": 7}");
    cr_assert_eq(par_manifest_add_tolerance(&m, "out.loss_aux", 1e-8, 0, "aux loss sums in a different order"),
                 PAR_OK);
    cr_expect_eq(par_manifest_add_tolerance(&m, "x", 1e-8, 0, ""), PAR_EINVAL);
    cr_expect_eq(par_manifest_add_tolerance(&m, "x", -1, 0, "r"), PAR_EINVAL);
    cr_expect_eq(par_manifest_add_tolerance(&m, "out.loss_aux", 1, 0, "again"), PAR_EINVAL);
    cr_assert_eq(par_manifest_write(&m, dir), PAR_OK, "%s", par_last_error());
    cr_expect_eq(m.nfiles, 2, "hidden files and manifest.json are not listed");
    par_manifest_free(&m);
}

Test(manifest, round_trip)
{
    char *dir = io_tmpdir();
    make_set(dir);
    cr_expect_eq(io_count_entries(dir, ".tmp-"), 0);
    par_manifest m;
    cr_assert_eq(par_manifest_read(dir, &m), PAR_OK, "%s", par_last_error());
    cr_expect_eq(m.version, PAR_MANIFEST_VERSION);
    cr_expect_str_eq(m.generator_name, "parity");
    cr_expect_str_eq(m.generator_version, "0.1.0");
    cr_expect_str_eq(m.precision, "f64");
    cr_expect_eq(m.steps, 1);
    int64_t v;
    cr_expect(par_json_int(m.model, "dim", &v) && v == 64);
    cr_expect(par_json_int(m.data, "seed", &v) && v == 7);
    cr_expect(par_json_int(m.layout, "world_size", &v) && v == 1);
    cr_expect_eq(m.nfiles, 2);
    cr_expect_str_eq(m.files[0].name, "params.0.safetensors");
    char hex[PAR_SHA256_HEX];
    par_sha256_hex("pretend step 0", 14, hex);
    cr_expect_str_eq(par_manifest_file_sha(&m, "step.0.safetensors"), hex);
    const par_tol_override *o = par_manifest_tolerance(&m, "out.loss_aux");
    cr_assert(o);
    cr_expect_eq(o->rtol, 1e-8);
    cr_expect_str_eq(o->reason, "aux loss sums in a different order");
    cr_expect_eq(par_manifest_tolerance(&m, "out.loss"), NULL);
    par_manifest_free(&m);
    io_rmtree(dir);
}

Test(manifest, hash_mismatch_names_file_and_both_hashes)
{
    char *dir = io_tmpdir();
    make_set(dir);
    char want[PAR_SHA256_HEX], got[PAR_SHA256_HEX];
    par_sha256_hex("pretend step 0", 14, want);
    put(dir, "step.0.safetensors", "pretend step X");
    par_sha256_hex("pretend step X", 14, got);
    par_manifest m;
    memset(&m, 0x5a, sizeof m);
    cr_expect_eq(par_manifest_read(dir, &m), PAR_EMISMATCH);
    const char *msg = par_last_error();
    cr_expect(strstr(msg, "step.0.safetensors"), "%s", msg);
    cr_expect(strstr(msg, want), "%s", msg);
    cr_expect(strstr(msg, got), "%s", msg);
    cr_expect_eq(m.version, (int64_t)0x5a5a5a5a5a5a5a5aLL, "output touched on failure");
    io_rmtree(dir);
}

Test(manifest, missing_listed_file)
{
    char *dir = io_tmpdir();
    make_set(dir);
    char *p = par_path_join(dir, "params.0.safetensors");
    remove(p);
    par_manifest m;
    cr_expect_eq(par_manifest_read(dir, &m), PAR_ENOTFOUND);
    cr_expect(strstr(par_last_error(), "params.0.safetensors"), "%s", par_last_error());
    par_free(p);
    io_rmtree(dir);
}

static void expect_parse_fail(const char *json, par_status code, const char *needle)
{
    par_manifest m;
    par_status st = par_manifest_parse(json, strlen(json), "m.json", &m);
    cr_expect_eq(st, code, "%s -> %d (%s)", json, st, par_last_error());
    if (st == PAR_OK)
        par_manifest_free(&m);
    else
        cr_expect(strstr(par_last_error(), needle), "message lacks '%s': %s", needle, par_last_error());
}

#define BASE_HEAD "{\"format\":\"parity-golden\",\"version\":1,\"generator\":{\"name\":\"p\",\"version\":\"1\"},"
#define BASE_MID "\"model\":{},\"train\":{},\"layout\":{},\"data\":{},\"precision\":\"f64\",\"steps\":0,"

Test(manifest, validation)
{
    par_manifest m;
    const char *ok = BASE_HEAD BASE_MID "\"files\":{}}";
    cr_assert_eq(par_manifest_parse(ok, strlen(ok), "m.json", &m), PAR_OK, "%s", par_last_error());
    par_manifest_free(&m);
    expect_parse_fail("{\"format\":\"other\"}", PAR_EFORMAT, "\"format\" is \"other\"");
    expect_parse_fail("{\"version\":1}", PAR_EFORMAT, "\"format\"");
    expect_parse_fail("{\"format\":\"parity-golden\",\"version\":2}", PAR_EUNSUPPORTED, "version 2");
    expect_parse_fail("{\"format\":\"parity-golden\",\"version\":0}", PAR_EFORMAT, "version 0");
    expect_parse_fail("{\"format\":\"parity-golden\",\"version\":\"1\"}", PAR_EFORMAT, "\"version\"");
    expect_parse_fail(BASE_HEAD "\"train\":{}}", PAR_EFORMAT, "\"model\" is missing");
    expect_parse_fail(BASE_HEAD "\"model\":[],\"train\":{}}", PAR_EFORMAT, "\"model\" is not an object");
    expect_parse_fail(BASE_HEAD BASE_MID "\"files\":{\"a\":\"12\"}}", PAR_EFORMAT, "'a'");
    expect_parse_fail(BASE_HEAD BASE_MID "\"files\":{\"../x\":\"" "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855" "\"}}",
                      PAR_EFORMAT, "not a plain file name");
    expect_parse_fail(BASE_HEAD BASE_MID "\"files\":{},\"tolerances\":{\"t\":{\"rtol\":1,\"atol\":0}}}", PAR_EFORMAT,
                      "no written \"reason\"");
    expect_parse_fail(BASE_HEAD BASE_MID "\"files\":{},\"tolerances\":{\"t\":{\"rtol\":1,\"atol\":0,\"reason\":\"\"}}}",
                      PAR_EFORMAT, "reason");
    expect_parse_fail(BASE_HEAD BASE_MID "\"files\":{},\"tolerances\":{\"t\":{\"rtol\":-1,\"atol\":0,\"reason\":\"r\"}}}",
                      PAR_EFORMAT, "must be finite");
    expect_parse_fail(BASE_HEAD BASE_MID "\"files\":{},\"tolerances\":{\"t\":{\"atol\":0,\"reason\":\"r\"}}}",
                      PAR_EFORMAT, "\"rtol\"");
    expect_parse_fail(BASE_HEAD "\"model\":{},\"train\":{},\"layout\":{},\"data\":{},\"steps\":0,\"files\":{}}",
                      PAR_EFORMAT, "\"precision\"");
    expect_parse_fail(BASE_HEAD "\"model\":{},\"train\":{},\"layout\":{},\"data\":{},\"precision\":\"f64\",\"steps\":-1,\"files\":{}}",
                      PAR_EFORMAT, "\"steps\"");
    expect_parse_fail("not json", PAR_EFORMAT, "m.json");
}

Test(manifest, read_without_manifest)
{
    char *dir = io_tmpdir();
    par_manifest m;
    cr_expect_eq(par_manifest_read(dir, &m), PAR_ENOTFOUND);
    cr_expect(strstr(par_last_error(), "manifest.json"), "%s", par_last_error());
    io_rmtree(dir);
}
