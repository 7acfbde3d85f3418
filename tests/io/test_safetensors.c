/* safetensors: round trips of every dtype, scalars, zero-size dims, metadata,
 * header padding, packing order, atomic writes, misaligned data. */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "core/alloc.h"
#include "core/fileio.h"
#include "core/safetensors.h"
#include "core/sha256.h"
#include "core/tensor.h"
#include "io_test_util.h"

static int64_t live0;
static void setup(void)
{
    par_err_set_quiet(1);
    live0 = par_alloc_live_total();
}
static void teardown(void) { cr_expect_eq(par_alloc_live_total(), live0, "leaked %lld bytes", (long long)(par_alloc_live_total() - live0)); }

TestSuite(safetensors, .init = setup, .fini = teardown);

/* Fills a tensor with distinct values of its dtype. */
static void fill(par_tensor *t, int seed)
{
    int64_t n = par_tensor_numel(t);
    for (int64_t i = 0; i < n; i++) {
        double v = (double)seed * 0.25 + (double)i * 1.0009765625 - 3.0;
        switch (t->dtype) {
        case PAR_F64: ((double *)t->data)[i] = v / 3.0; break;
        case PAR_F32: ((float *)t->data)[i] = (float)(v / 3.0); break;
        case PAR_BF16: ((uint16_t *)t->data)[i] = par_bf16_from_f64(v / 3.0); break;
        case PAR_I32: ((int32_t *)t->data)[i] = (int32_t)(i * 7 - 5 + seed); break;
        case PAR_I64: ((int64_t *)t->data)[i] = (int64_t)i * 3000000000LL - seed; break;
        default: break;
        }
    }
}

Test(safetensors, round_trip_every_dtype_scalars_and_zero_dims)
{
    char *dir = io_tmpdir();
    cr_assert(dir);
    char *path = par_path_join(dir, "rt.safetensors");
    struct {
        const char *name;
        par_dtype dt;
        int nd;
        int64_t shape[5];
    } spec[] = {
        {"f64.scalar", PAR_F64, 0, {0}},
        {"f64.mat", PAR_F64, 2, {3, 5}},
        {"f32.vec", PAR_F32, 1, {7}},
        {"f32.5d", PAR_F32, 5, {2, 1, 3, 2, 2}},
        {"bf16.mat", PAR_BF16, 2, {3, 3}},
        {"bf16.scalar", PAR_BF16, 0, {0}},
        {"i32.mat", PAR_I32, 2, {2, 9}},
        {"i64.vec", PAR_I64, 1, {5}},
        {"zero.f64", PAR_F64, 2, {0, 4}},
        {"zero.i32", PAR_I32, 3, {2, 0, 3}},
        {"zero.bf16", PAR_BF16, 1, {0}},
    };
    int n = (int)(sizeof spec / sizeof spec[0]);
    par_tensor t[16];
    par_st_writer *w;
    cr_assert_eq(par_st_writer_new(&w), PAR_OK);
    /* add in reverse order: the file must still be sorted by name */
    for (int i = n - 1; i >= 0; i--) {
        cr_assert_eq(par_tensor_alloc(&t[i], spec[i].dt, spec[i].nd, spec[i].shape, PAR_TAG_TENSOR), PAR_OK);
        fill(&t[i], i);
        cr_assert_eq(par_st_writer_add(w, spec[i].name, &t[i]), PAR_OK, "%s", par_last_error());
    }
    cr_assert_eq(par_st_writer_meta(w, "format", "pt"), PAR_OK);
    cr_assert_eq(par_st_writer_meta(w, "note", "quote \" backslash \\ newline \n tab \t ctl \x01"), PAR_OK);
    cr_assert_eq(par_st_writer_meta(w, "format", "parity"), PAR_OK); /* replaces */
    cr_assert_eq(par_st_writer_write(w, path), PAR_OK, "%s", par_last_error());
    par_st_writer_free(w);
    cr_expect_eq(io_count_entries(dir, ".tmp-"), 0, "temporary file left behind");

    par_st_file *f;
    cr_assert_eq(par_st_read(path, &f), PAR_OK, "%s", par_last_error());
    cr_assert_eq(par_st_count(f), n);
    for (int i = 1; i < n; i++)
        cr_expect(strcmp(par_st_name(f, i - 1), par_st_name(f, i)) < 0, "names not sorted");
    for (int i = 0; i < n; i++) {
        const par_tensor *r = par_st_find(f, spec[i].name);
        cr_assert(r, "tensor %s missing", spec[i].name);
        cr_expect_eq(r->dtype, spec[i].dt, "%s dtype", spec[i].name);
        cr_expect_eq(r->ndim, spec[i].nd, "%s ndim", spec[i].name);
        cr_expect(par_tensor_same_shape(r, &t[i]), "%s shape", spec[i].name);
        cr_expect_eq(memcmp(r->data, t[i].data, par_tensor_nbytes(&t[i])), 0, "%s data", spec[i].name);
        cr_expect_eq((uintptr_t)r->data % par_dtype_size(r->dtype), 0, "%s misaligned", spec[i].name);
    }
    cr_expect_eq(par_st_find(f, "nope"), NULL);
    cr_expect_eq(par_st_index(f, "nope"), -1);
    cr_expect_str_eq(par_st_meta(f, "format"), "parity");
    cr_expect_str_eq(par_st_meta(f, "note"), "quote \" backslash \\ newline \n tab \t ctl \x01");
    cr_expect_eq(par_st_meta_count(f), 2);
    cr_expect_str_eq(par_st_meta_key(f, 0), "format");
    cr_expect_eq(par_st_meta(f, "absent"), NULL);
    par_st_close(f);

    /* header is padded with spaces to a multiple of 8; data packed by name */
    void *buf;
    size_t len;
    cr_assert_eq(par_file_read(path, PAR_TAG_IO, &buf, &len), PAR_OK);
    const unsigned char *b = buf;
    uint64_t hn = 0;
    for (int i = 7; i >= 0; i--)
        hn = (hn << 8) | b[i];
    cr_expect_eq(hn % 8, 0, "header length %llu not a multiple of 8", (unsigned long long)hn);
    cr_expect_eq(b[8], '{');
    cr_expect(b[8 + hn - 1] == ' ' || b[8 + hn - 1] == '}');
    const char *first = strstr((const char *)b + 8, "\"bf16.mat\"");
    const char *last = strstr((const char *)b + 8, "\"zero.i32\"");
    cr_expect(first && last && first < last, "header entries not in name order");
    cr_expect(strstr((const char *)b + 8, "\"bf16.mat\":{\"dtype\":\"BF16\",\"shape\":[3,3],\"data_offsets\":[0,18]}"),
              "first tensor (by name) must start at offset 0");
    size_t total = 0;
    for (int i = 0; i < n; i++)
        total += par_tensor_nbytes(&t[i]);
    cr_expect_eq(len, 8 + hn + total, "file has gaps or extra bytes");

    /* writing to memory gives the same bytes */
    cr_assert_eq(par_st_writer_new(&w), PAR_OK);
    for (int i = 0; i < n; i++)
        par_st_writer_add(w, spec[i].name, &t[i]);
    par_st_writer_meta(w, "note", "quote \" backslash \\ newline \n tab \t ctl \x01");
    par_st_writer_meta(w, "format", "parity");
    void *mem;
    size_t mlen;
    cr_assert_eq(par_st_writer_to_mem(w, &mem, &mlen), PAR_OK);
    cr_expect_eq(mlen, len);
    cr_expect_eq(memcmp(mem, buf, len), 0, "to_mem differs from the file");
    par_st_writer_free(w);
    par_st_file *fm;
    cr_assert_eq(par_st_read_mem(mem, mlen, "mem", &fm), PAR_OK);
    cr_expect_eq(par_st_count(fm), n);
    cr_expect_str_eq(par_st_label(fm), "mem");
    par_st_close(fm);
    par_free(mem);
    par_free(buf);

    for (int i = 0; i < n; i++)
        par_tensor_free(&t[i]);
    par_free(path);
    io_rmtree(dir);
}

Test(safetensors, empty_file_round_trip)
{
    par_st_writer *w;
    cr_assert_eq(par_st_writer_new(&w), PAR_OK);
    void *mem;
    size_t len;
    cr_assert_eq(par_st_writer_to_mem(w, &mem, &len), PAR_OK);
    cr_expect_eq(len, 16, "'{}' padded to 8 bytes plus the length");
    par_st_file *f;
    cr_assert_eq(par_st_read_mem(mem, len, "empty", &f), PAR_OK, "%s", par_last_error());
    cr_expect_eq(par_st_count(f), 0);
    par_st_close(f);
    par_free(mem);
    par_st_writer_free(w);
}

Test(safetensors, writer_rejects_bad_input)
{
    par_st_writer *w;
    cr_assert_eq(par_st_writer_new(&w), PAR_OK);
    double x[2] = {1, 2};
    int64_t sh[1] = {2};
    par_tensor t = par_tensor_view(PAR_F64, 1, sh, x);
    cr_expect_eq(par_st_writer_add(w, "a", &t), PAR_OK);
    cr_expect_eq(par_st_writer_add(w, "a", &t), PAR_EINVAL);
    cr_expect(strstr(par_last_error(), "'a' added twice"), "%s", par_last_error());
    cr_expect_eq(par_st_writer_add(w, "__metadata__", &t), PAR_EINVAL);
    par_tensor bad = t;
    bad.data = NULL;
    cr_expect_eq(par_st_writer_add(w, "b", &bad), PAR_EINVAL);
    bad = t;
    bad.ndim = 6;
    cr_expect_eq(par_st_writer_add(w, "c", &bad), PAR_EINVAL);
    bad = t;
    bad.shape[0] = -1;
    cr_expect_eq(par_st_writer_add(w, "d", &bad), PAR_EINVAL);
    /* a failed write leaves neither the target nor a temporary */
    cr_expect_neq(par_st_writer_write(w, "/nonexistent-dir-parity/x.safetensors"), PAR_OK);
    par_st_writer_free(w);
}

Test(safetensors, misaligned_tensor_is_copied)
{
    /* data section starts at 8 + 67 (odd); an F64 at offset 0 is misaligned */
    double v[2] = {1.5, -2.25};
    unsigned char data[16] = {0};
    memcpy(data, v, 16);
    char hdr[256];
    snprintf(hdr, sizeof hdr, "{\"b\":{\"dtype\":\"F64\",\"shape\":[2],\"data_offsets\":[0,16]}}");
    size_t len;
    unsigned char *raw = io_raw(hdr, data, sizeof data, &len);
    par_st_file *f;
    cr_assert_eq(par_st_read_mem(raw, len, "mis", &f), PAR_OK, "%s", par_last_error());
    const par_tensor *t = par_st_find(f, "b");
    cr_assert(t);
    cr_expect_eq((uintptr_t)t->data % 8, 0);
    cr_expect_eq(((double *)t->data)[0], 1.5);
    cr_expect_eq(((double *)t->data)[1], -2.25);
    par_st_close(f);
    free(raw);
}

Test(safetensors, foreign_files_with_extra_keys_are_read_but_gaps_refused)
{
    /* Unknown keys of an entry are ignored; tensors must tile the data
     * section (no gap, no trailing bytes: issue 13, as the Rust reference). */
    int32_t i[3] = {1, 2, 3};
    unsigned char data[24] = {0};
    memcpy(data + 8, i, 12);
    size_t len;
    unsigned char *raw = io_raw("{\"z\":{\"dtype\":\"I32\",\"shape\":[3],\"data_offsets\":[0,12],\"extra\":1},"
                                "\"a\":{\"dtype\":\"I32\",\"shape\":[0],\"data_offsets\":[0,0]}}   \n",
                                i, sizeof i, &len);
    par_st_file *f;
    cr_assert_eq(par_st_read_mem(raw, len, "extra", &f), PAR_OK, "%s", par_last_error());
    cr_expect_str_eq(par_st_name(f, 0), "a");
    cr_expect_eq(((int32_t *)par_st_find(f, "z")->data)[2], 3);
    par_st_close(f);
    free(raw);
    raw = io_raw("{\"z\":{\"dtype\":\"I32\",\"shape\":[3],\"data_offsets\":[8,20]}}", data, sizeof data, &len);
    cr_expect_eq(par_st_read_mem(raw, len, "gap", &f), PAR_EFORMAT);
    cr_expect(strstr(par_last_error(), "bytes [0,8) of the data section belong to no tensor"), "%s", par_last_error());
    free(raw);
    raw = io_raw("{\"z\":{\"dtype\":\"I32\",\"shape\":[3],\"data_offsets\":[0,12]}}", data + 8, 16, &len);
    cr_expect_eq(par_st_read_mem(raw, len, "tail", &f), PAR_EFORMAT);
    cr_expect(strstr(par_last_error(), "4 trailing bytes after the last tensor 'z'"), "%s", par_last_error());
    free(raw);
    /* names: NUL and invalid UTF-8 are refused */
    raw = io_raw("{\"a\\u0000b\":{\"dtype\":\"I32\",\"shape\":[3],\"data_offsets\":[0,12]}}", i, sizeof i, &len);
    cr_expect_eq(par_st_read_mem(raw, len, "nul", &f), PAR_EFORMAT);
    cr_expect(strstr(par_last_error(), "NUL"), "%s", par_last_error());
    free(raw);
    raw = io_raw("{\"a\xff\xfe\":{\"dtype\":\"I32\",\"shape\":[3],\"data_offsets\":[0,12]}}", i, sizeof i, &len);
    cr_expect_eq(par_st_read_mem(raw, len, "utf8", &f), PAR_EFORMAT);
    cr_expect(strstr(par_last_error(), "not valid UTF-8"), "%s", par_last_error());
    free(raw);
    raw = io_raw("{\"caf\xc3\xa9\":{\"dtype\":\"I32\",\"shape\":[3],\"data_offsets\":[0,12]}}", i, sizeof i, &len);
    cr_expect_eq(par_st_read_mem(raw, len, "utf8-ok", &f), PAR_OK, "%s", par_last_error());
    par_st_close(f);
    free(raw);
}

Test(safetensors, sha256_known_vectors)
{
    char hex[PAR_SHA256_HEX];
    par_sha256_hex("abc", 3, hex);
    cr_expect_str_eq(hex, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    par_sha256_hex("", 0, hex);
    cr_expect_str_eq(hex, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    cr_expect(par_sha256_hex_valid(hex));
    cr_expect(!par_sha256_hex_valid("abc"));
    char *dir = io_tmpdir();
    char *p = par_path_join(dir, "abc.txt");
    cr_assert_eq(par_file_write_atomic(p, "abc", 3), PAR_OK);
    char fh[PAR_SHA256_HEX];
    cr_assert_eq(par_sha256_file(p, fh), PAR_OK);
    cr_expect_str_eq(fh, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    cr_expect_eq(par_sha256_file("/nonexistent/parity", fh), PAR_ENOTFOUND);
    par_free(p);
    io_rmtree(dir);
}

Test(safetensors, atomic_file_and_directory)
{
    char *dir = io_tmpdir();
    char *p = par_path_join(dir, "f.bin");
    cr_assert_eq(par_file_write_atomic(p, "one", 3), PAR_OK);
    /* abort keeps the old content and removes the temporary */
    par_afile *af;
    cr_assert_eq(par_afile_open(p, &af), PAR_OK);
    cr_assert_eq(par_afile_write(af, "two-partial", 11), PAR_OK);
    cr_expect_eq(io_count_entries(dir, ".tmp-"), 1);
    par_afile_abort(af);
    cr_expect_eq(io_count_entries(dir, ".tmp-"), 0);
    void *b;
    size_t n;
    cr_assert_eq(par_file_read(p, PAR_TAG_IO, &b, &n), PAR_OK);
    cr_expect_eq(n, 3);
    cr_expect_eq(memcmp(b, "one", 3), 0);
    par_free(b);

    /* directory: build, commit over an existing one, abort */
    char *gd = par_path_join(dir, "set");
    char *tmp;
    cr_assert_eq(par_adir_begin(gd, &tmp), PAR_OK);
    char *x = par_path_join(tmp, "x");
    cr_assert_eq(par_file_write_atomic(x, "1", 1), PAR_OK);
    par_free(x);
    cr_assert_eq(par_adir_commit(tmp, gd), PAR_OK, "%s", par_last_error());
    cr_expect(par_path_is_dir(gd));
    char *gx = par_path_join(gd, "x"), *gy = par_path_join(gd, "y");
    /* "set" holds x and no parity marker: it is not replaced (core/outdir.h) */
    cr_assert_eq(par_adir_begin(gd, &tmp), PAR_OK);
    cr_expect_eq(par_adir_commit(tmp, gd), PAR_EINVAL);
    cr_expect(strstr(par_last_error(), "was not written by parity"), "%s", par_last_error());
    cr_expect(par_path_exists(gx), "a directory parity did not write was replaced");
    cr_expect_eq(io_count_entries(dir, ".tmp-"), 0);
    /* with a golden-set marker listing x it is parity's and is replaced */
    char *man = par_path_join(gd, "manifest.json");
    static const char mtext[] = "{\"format\": \"parity-golden\", \"files\": {\"x\": \"00\"}}";
    cr_assert_eq(par_file_write_atomic(man, mtext, sizeof mtext - 1), PAR_OK);
    par_free(man);
    cr_assert_eq(par_adir_begin(gd, &tmp), PAR_OK);
    x = par_path_join(tmp, "y");
    cr_assert_eq(par_file_write_atomic(x, "2", 1), PAR_OK);
    par_free(x);
    cr_assert_eq(par_adir_commit(tmp, gd), PAR_OK, "%s", par_last_error());
    cr_expect(!par_path_exists(gx), "old content survived the replacement");
    cr_expect(par_path_exists(gy));
    cr_assert_eq(par_adir_begin(gd, &tmp), PAR_OK);
    par_adir_abort(tmp);
    cr_expect_eq(io_count_entries(dir, ".tmp-"), 0);
    cr_expect_eq(io_count_entries(dir, ".old-"), 0);
    cr_expect(par_path_exists(gy), "abort touched the committed directory");
    par_free(gx);
    par_free(gy);
    par_free(gd);
    par_free(p);
    io_rmtree(dir);
}

/* A stream (tensors declared by shape, put in any order) writes the bytes
 * the one-go writer writes; a tensor never put, put twice or of the wrong
 * size is refused, and a refused commit leaves no file. */
Test(safetensors, stream_writes_the_writers_bytes_in_any_order)
{
    char *dir = io_tmpdir();
    cr_assert(dir);
    char *p1 = par_path_join(dir, "one.safetensors"), *p2 = par_path_join(dir, "stream.safetensors");
    static const char *const names[4] = {"zeta", "alpha", "mid.x", "b"};
    const par_dtype dt[4] = {PAR_F64, PAR_I32, PAR_F32, PAR_I64};
    const int64_t sh[4][2] = {{3, 5}, {7, 1}, {2, 2}, {4, 0}};
    par_tensor t[4];
    void *buf[4];
    for (int i = 0; i < 4; i++) {
        buf[i] = par_calloc(64, 8, PAR_TAG_IO);
        t[i] = par_tensor_view(dt[i], 2, sh[i], buf[i]);
        fill(&t[i], i + 1);
    }
    par_st_writer *w1, *w2;
    cr_assert_eq(par_st_writer_new(&w1), PAR_OK);
    cr_assert_eq(par_st_writer_new(&w2), PAR_OK);
    for (int i = 0; i < 4; i++) {
        cr_assert_eq(par_st_writer_add(w1, names[i], &t[i]), PAR_OK);
        if (i == 1) /* one entry with its data at begin, the rest declared */
            cr_assert_eq(par_st_writer_add(w2, names[i], &t[i]), PAR_OK);
        else
            cr_assert_eq(par_st_writer_add_shape(w2, names[i], dt[i], 2, sh[i]), PAR_OK);
    }
    cr_assert_eq(par_st_writer_meta(w1, "k", "v"), PAR_OK);
    cr_assert_eq(par_st_writer_meta(w2, "k", "v"), PAR_OK);
    cr_assert_eq(par_st_writer_write(w1, p1), PAR_OK, "%s", par_last_error());
    cr_expect_eq(par_st_writer_write(w2, p2), PAR_EINVAL, "a declared tensor has no data to write in one go");
    par_st_stream *s;
    cr_assert_eq(par_st_stream_begin(w2, p2, &s), PAR_OK, "%s", par_last_error());
    cr_expect_eq(par_st_stream_put(s, "nope", buf[0], 8), PAR_EINVAL);
    cr_expect_eq(par_st_stream_put(s, "zeta", buf[0], 8), PAR_EINVAL, "wrong size");
    cr_assert_eq(par_st_stream_put(s, "mid.x", buf[2], par_tensor_nbytes(&t[2])), PAR_OK);
    cr_assert_eq(par_st_stream_put(s, "zeta", buf[0], par_tensor_nbytes(&t[0])), PAR_OK);
    cr_expect_eq(par_st_stream_put(s, "zeta", buf[0], par_tensor_nbytes(&t[0])), PAR_EINVAL, "twice");
    cr_assert_eq(par_st_stream_put(s, "b", buf[3], 0), PAR_OK);
    cr_assert_eq(par_st_stream_commit(s), PAR_OK, "%s", par_last_error());
    void *a, *b;
    size_t na, nb;
    cr_assert_eq(par_file_read(p1, PAR_TAG_IO, &a, &na), PAR_OK);
    cr_assert_eq(par_file_read(p2, PAR_TAG_IO, &b, &nb), PAR_OK);
    cr_expect(na == nb && !memcmp(a, b, na), "the stream's file differs from the writer's (%zu vs %zu bytes)", nb, na);
    par_free(a);
    par_free(b);
    /* a stream with a tensor never put: refused, no file */
    char *p3 = par_path_join(dir, "short.safetensors");
    cr_assert_eq(par_st_stream_begin(w2, p3, &s), PAR_OK);
    cr_assert_eq(par_st_stream_put(s, "zeta", buf[0], par_tensor_nbytes(&t[0])), PAR_OK);
    cr_expect_eq(par_st_stream_commit(s), PAR_EINVAL);
    cr_expect(strstr(par_last_error(), "never written"), "%s", par_last_error());
    cr_expect(!par_path_exists(p3));
    cr_expect_eq(io_count_entries(dir, ".tmp-"), 0);
    par_st_writer_free(w1);
    par_st_writer_free(w2);
    for (int i = 0; i < 4; i++)
        par_free(buf[i]);
    par_free(p1);
    par_free(p2);
    par_free(p3);
    io_rmtree(dir);
}
