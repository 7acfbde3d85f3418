/* Broken safetensors files: every one is refused with PAR_EFORMAT (or the
 * code named) and a message naming the fault, without a crash or a leak. */
#include <criterion/criterion.h>
#include <string.h>

#include "core/alloc.h"
#include "core/fileio.h"
#include "core/safetensors.h"
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
TestSuite(broken, .init = setup, .fini = teardown);

/* A small valid file: two tensors and metadata. */
static void *valid_file(size_t *len)
{
    static double a[6] = {1, 2, 3, 4, 5, 6};
    static int32_t b[3] = {7, 8, 9};
    int64_t sa[2] = {2, 3}, sb[1] = {3};
    par_tensor ta = par_tensor_view(PAR_F64, 2, sa, a), tb = par_tensor_view(PAR_I32, 1, sb, b);
    par_st_writer *w;
    cr_assert_eq(par_st_writer_new(&w), PAR_OK);
    par_st_writer_add(w, "a", &ta);
    par_st_writer_add(w, "b", &tb);
    par_st_writer_meta(w, "k", "v");
    void *buf;
    cr_assert_eq(par_st_writer_to_mem(w, &buf, len), PAR_OK);
    par_st_writer_free(w);
    return buf;
}

/* Expects reading (hdr, data) to fail with `code` and a message holding
 * every needle (NULL-terminated list). */
static void expect_bad(const unsigned char *raw, size_t len, par_status code, const char *const *needles)
{
    par_st_file *f = (par_st_file *)0x1;
    par_clear_error();
    par_status st = par_st_read_mem(raw, len, "bad.safetensors", &f);
    cr_expect_eq(st, code, "status %d, want %d; message: %s", st, code, par_last_error());
    cr_expect_eq(f, (par_st_file *)0x1, "output set on failure");
    const char *m = par_last_error();
    cr_expect(strstr(m, "bad.safetensors"), "message does not name the file: %s", m);
    for (int i = 0; needles && needles[i]; i++)
        cr_expect(strstr(m, needles[i]), "message lacks '%s': %s", needles[i], m);
}

static void expect_bad_hdr(const char *hdr, const void *data, size_t dn, par_status code, const char *const *needles)
{
    size_t len;
    unsigned char *raw = io_raw(hdr, data, dn, &len);
    expect_bad(raw, len, code, needles);
    free(raw);
}

#define NEED(...) ((const char *const[]){__VA_ARGS__, NULL})

Test(broken, valid_file_reads)
{
    size_t len;
    void *buf = valid_file(&len);
    par_st_file *f;
    cr_assert_eq(par_st_read_mem(buf, len, "ok", &f), PAR_OK, "%s", par_last_error());
    par_st_close(f);
    par_free(buf);
}

Test(broken, truncated_at_every_offset)
{
    size_t len;
    unsigned char *buf = valid_file(&len);
    for (size_t cut = 0; cut < len; cut++) {
        par_st_file *f = NULL;
        par_status st = par_st_read_mem(buf, cut, "bad.safetensors", &f);
        cr_expect_eq(st, PAR_EFORMAT, "cut at %zu of %zu: status %d (%s)", cut, len, st, par_last_error());
        cr_expect_eq(f, NULL);
        cr_expect(strstr(par_last_error(), "bad.safetensors"), "cut at %zu: %s", cut, par_last_error());
        if (st == PAR_OK)
            par_st_close(f);
    }
    /* also through a real file */
    char *dir = io_tmpdir();
    char *p = par_path_join(dir, "t.safetensors");
    io_write_bytes(p, buf, len - 1);
    par_st_file *f;
    cr_expect_eq(par_st_read(p, &f), PAR_EFORMAT);
    cr_expect(strstr(par_last_error(), p), "%s", par_last_error());
    par_free(p);
    io_rmtree(dir);
    par_free(buf);
}

Test(broken, header_length_past_the_file)
{
    size_t len;
    unsigned char *buf = valid_file(&len);
    uint64_t n = (uint64_t)len; /* more than len - 8 */
    for (int i = 0; i < 8; i++)
        buf[i] = (unsigned char)(n >> (8 * i));
    expect_bad(buf, len, PAR_EFORMAT, NEED("header length", "runs past the end"));
    par_free(buf);
}

Test(broken, header_length_2_pow_63_and_max)
{
    unsigned char raw[16] = {0, 0, 0, 0, 0, 0, 0, 0x80, '{', '}', ' ', ' ', ' ', ' ', ' ', ' '};
    expect_bad(raw, sizeof raw, PAR_EFORMAT, NEED("9223372036854775808", "cap"));
    memset(raw, 0xff, 8);
    expect_bad(raw, sizeof raw, PAR_EFORMAT, NEED("18446744073709551615"));
    /* just above the cap */
    uint64_t n = ((uint64_t)100 << 20) + 1;
    for (int i = 0; i < 8; i++)
        raw[i] = (unsigned char)(n >> (8 * i));
    expect_bad(raw, sizeof raw, PAR_EFORMAT, NEED("cap"));
}

Test(broken, tiny_files)
{
    expect_bad((const unsigned char *)"", 0, PAR_EFORMAT, NEED("fewer than the 8-byte"));
    expect_bad((const unsigned char *)"\x02\0\0\0", 4, PAR_EFORMAT, NEED("fewer than the 8-byte"));
    unsigned char z[8] = {0};
    expect_bad(z, 8, PAR_EFORMAT, NEED("too short"));
}

Test(broken, overlapping_offsets)
{
    double d[4] = {0};
    expect_bad_hdr("{\"x\":{\"dtype\":\"F64\",\"shape\":[2],\"data_offsets\":[0,16]},"
                   "\"y\":{\"dtype\":\"F64\",\"shape\":[2],\"data_offsets\":[8,24]}}",
                   d, sizeof d, PAR_EFORMAT, NEED("'x'", "'y'", "overlap"));
    /* identical ranges */
    expect_bad_hdr("{\"x\":{\"dtype\":\"F64\",\"shape\":[2],\"data_offsets\":[0,16]},"
                   "\"y\":{\"dtype\":\"I64\",\"shape\":[2],\"data_offsets\":[0,16]}}",
                   d, sizeof d, PAR_EFORMAT, NEED("overlap"));
}

Test(broken, wrong_size_for_dtype)
{
    double d[4] = {0};
    expect_bad_hdr("{\"x\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,16]}}", d, sizeof d, PAR_EFORMAT,
                   NEED("'x'", "hold 16 bytes", "needs 24"));
    expect_bad_hdr("{\"x\":{\"dtype\":\"F64\",\"shape\":[],\"data_offsets\":[0,16]}}", d, sizeof d, PAR_EFORMAT,
                   NEED("needs 8"));
}

Test(broken, unknown_dtype)
{
    double d[1] = {0};
    expect_bad_hdr("{\"x\":{\"dtype\":\"F16\",\"shape\":[4],\"data_offsets\":[0,8]}}", d, sizeof d, PAR_EFORMAT,
                   NEED("'x'", "'F16'", "not supported"));
    expect_bad_hdr("{\"x\":{\"dtype\":7,\"shape\":[4],\"data_offsets\":[0,8]}}", d, sizeof d, PAR_EFORMAT,
                   NEED("dtype is not a string"));
}

Test(broken, bad_json)
{
    double d[1] = {0};
    expect_bad_hdr("{\"x\":{\"dtype\":\"F64\",\"shape\":[1],\"data_offsets\":[0,8]}", d, sizeof d, PAR_EFORMAT,
                   NEED("JSON is not well formed"));
    expect_bad_hdr("{\"x\" \"y\"}", NULL, 0, PAR_EFORMAT, NEED("JSON is not well formed"));
    expect_bad_hdr("{} trailing", NULL, 0, PAR_EFORMAT, NEED("unexpected bytes"));
    expect_bad_hdr("[1,2]", NULL, 0, PAR_EFORMAT, NEED("'{'"));
    expect_bad_hdr("{\"x\":5}", NULL, 0, PAR_EFORMAT, NEED("'x'", "not a JSON object"));
    expect_bad_hdr("{\"x\":{\"shape\":[1],\"data_offsets\":[0,8]}}", d, sizeof d, PAR_EFORMAT,
                   NEED("missing key \"dtype\""));
    expect_bad_hdr("{\"__metadata__\":{\"k\":1}}", NULL, 0, PAR_EFORMAT, NEED("__metadata__", "'k'"));
    expect_bad_hdr("{\"__metadata__\":[]}", NULL, 0, PAR_EFORMAT, NEED("__metadata__", "not a JSON object"));
    /* deeply nested JSON must not crash */
    char deep[4200];
    strcpy(deep, "{\"x\":");
    size_t o = strlen(deep);
    for (int i = 0; i < 2000; i++)
        deep[o++] = '[';
    deep[o] = '\0';
    expect_bad_hdr(deep, NULL, 0, PAR_EFORMAT, NEED("JSON"));
}

Test(broken, data_offsets_not_integers)
{
    double d[2] = {0};
    expect_bad_hdr("{\"x\":{\"dtype\":\"F64\",\"shape\":[1],\"data_offsets\":[0.5,8.5]}}", d, sizeof d, PAR_EFORMAT,
                   NEED("'x'", "data_offsets[0]", "not a non-negative integer"));
    expect_bad_hdr("{\"x\":{\"dtype\":\"F64\",\"shape\":[1],\"data_offsets\":[\"0\",\"8\"]}}", d, sizeof d,
                   PAR_EFORMAT, NEED("data_offsets[0]"));
    expect_bad_hdr("{\"x\":{\"dtype\":\"F64\",\"shape\":[1],\"data_offsets\":[0]}}", d, sizeof d, PAR_EFORMAT,
                   NEED("list of two integers"));
    expect_bad_hdr("{\"x\":{\"dtype\":\"F64\",\"shape\":[1],\"data_offsets\":[-8,0]}}", d, sizeof d, PAR_EFORMAT,
                   NEED("data_offsets[0]"));
    expect_bad_hdr("{\"x\":{\"dtype\":\"F64\",\"shape\":[1],\"data_offsets\":[8,0]}}", d, sizeof d, PAR_EFORMAT,
                   NEED("begin after they end"));
    expect_bad_hdr("{\"x\":{\"dtype\":\"F64\",\"shape\":[1],\"data_offsets\":[8,16]}}", d, 8, PAR_EFORMAT,
                   NEED("run past the data section"));
    expect_bad_hdr("{\"x\":{\"dtype\":\"F64\",\"shape\":[1],\"data_offsets\":[0,9223372036854775807]}}", d, 8,
                   PAR_EFORMAT, NEED("data_offsets[1]"));
    expect_bad_hdr("{\"x\":{\"dtype\":\"F64\",\"shape\":[1],\"data_offsets\":[0,1e400]}}", d, 8, PAR_EFORMAT,
                   NEED("data_offsets[1]"));
}

Test(broken, shape_faults)
{
    double d[2] = {0};
    expect_bad_hdr("{\"x\":{\"dtype\":\"F64\",\"shape\":[1,1,1,1,1,1],\"data_offsets\":[0,8]}}", d, 8, PAR_EFORMAT,
                   NEED("'x'", "6 dims", "at most 5"));
    expect_bad_hdr("{\"x\":{\"dtype\":\"F64\",\"shape\":[-1],\"data_offsets\":[0,8]}}", d, 8, PAR_EFORMAT,
                   NEED("shape entry 0"));
    expect_bad_hdr("{\"x\":{\"dtype\":\"F64\",\"shape\":4,\"data_offsets\":[0,8]}}", d, 8, PAR_EFORMAT,
                   NEED("shape is not a list"));
    /* numel * 8 overflows int64: must be refused, not wrap */
    expect_bad_hdr("{\"x\":{\"dtype\":\"F64\",\"shape\":[4194304,4194304,4194304],\"data_offsets\":[0,0]}}", d, 8,
                   PAR_EFORMAT, NEED("overflow"));
    expect_bad_hdr("{\"x\":{\"dtype\":\"I64\",\"shape\":[1073741824,1073741824],\"data_offsets\":[0,8]}}", d, 8,
                   PAR_EFORMAT, NEED("overflow"));
    expect_bad_hdr("{\"x\":{\"dtype\":\"I32\",\"shape\":[1073741824,1073741824],\"data_offsets\":[0,8]}}", d, 8,
                   PAR_EFORMAT, NEED("hold 8 bytes", "needs 4611686018427387904"));
}

Test(broken, duplicate_names)
{
    double d[2] = {0};
    expect_bad_hdr("{\"x\":{\"dtype\":\"F64\",\"shape\":[1],\"data_offsets\":[0,8]},"
                   "\"x\":{\"dtype\":\"F64\",\"shape\":[1],\"data_offsets\":[8,16]}}",
                   d, sizeof d, PAR_EFORMAT, NEED("'x'", "appears twice"));
    expect_bad_hdr("{\"__metadata__\":{},\"__metadata__\":{}}", NULL, 0, PAR_EFORMAT, NEED("__metadata__", "twice"));
    expect_bad_hdr("{\"__metadata__\":{\"k\":\"a\",\"k\":\"b\"}}", NULL, 0, PAR_EFORMAT, NEED("'k'", "twice"));
}

Test(broken, not_a_file)
{
    par_st_file *f;
    cr_expect_eq(par_st_read("/nonexistent/parity.safetensors", &f), PAR_ENOTFOUND);
    cr_expect(strstr(par_last_error(), "/nonexistent/parity.safetensors"));
    char *dir = io_tmpdir();
    cr_expect_eq(par_st_read(dir, &f), PAR_EIO);
    cr_expect(strstr(par_last_error(), "not a regular file"), "%s", par_last_error());
    io_rmtree(dir);
}

/* Every single-byte corruption of the header is either accepted or refused
 * cleanly (no crash, no leak). */
Test(broken, every_header_byte_flipped)
{
    size_t len;
    unsigned char *buf = valid_file(&len);
    uint64_t hn = 0;
    for (int i = 7; i >= 0; i--)
        hn = (hn << 8) | buf[i];
    int refused = 0;
    for (size_t i = 0; i < 8 + hn; i++) {
        for (int v = 0; v < 3; v++) {
            unsigned char save = buf[i];
            buf[i] = v == 0 ? (unsigned char)(save ^ 0xff) : v == 1 ? (unsigned char)'9' : (unsigned char)'"';
            par_st_file *f = NULL;
            par_status st = par_st_read_mem(buf, len, "bad.safetensors", &f);
            if (st == PAR_OK)
                par_st_close(f);
            else
                refused++;
            buf[i] = save;
        }
    }
    cr_expect_gt(refused, (int)hn, "most corruptions should be refused");
    par_free(buf);
}
