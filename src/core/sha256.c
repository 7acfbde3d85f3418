#include "core/sha256.h"

#include <errno.h>
#include <fcntl.h>
#include <nettle/sha2.h>
#include <string.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/fileio.h"

static void to_hex(const uint8_t d[PAR_SHA256_BYTES], char out[PAR_SHA256_HEX])
{
    static const char hx[] = "0123456789abcdef";
    for (int i = 0; i < PAR_SHA256_BYTES; i++) {
        out[2 * i] = hx[d[i] >> 4];
        out[2 * i + 1] = hx[d[i] & 15];
    }
    out[2 * PAR_SHA256_BYTES] = '\0';
}

void par_sha256(const void *data, size_t n, uint8_t out[PAR_SHA256_BYTES])
{
    struct sha256_ctx ctx;
    sha256_init(&ctx);
    const uint8_t *p = data;
    /* nettle takes size_t lengths; feed in bounded pieces anyway */
    while (n) {
        size_t k = n > ((size_t)1 << 30) ? ((size_t)1 << 30) : n;
        sha256_update(&ctx, k, p);
        p += k;
        n -= k;
    }
    sha256_digest(&ctx, PAR_SHA256_BYTES, out);
}

void par_sha256_hex(const void *data, size_t n, char out[PAR_SHA256_HEX])
{
    uint8_t d[PAR_SHA256_BYTES];
    par_sha256(data, n, d);
    to_hex(d, out);
}

par_status par_sha256_file(const char *path, char out[PAR_SHA256_HEX])
{
    int fd;
    par_status ost = par_file_open_read(path, &fd, NULL); /* regular files only (a FIFO never blocks) */
    if (ost)
        return ost;
    enum { CHUNK = 1 << 20 };
    uint8_t *buf = par_malloc(CHUNK, PAR_TAG_IO);
    if (!buf) {
        close(fd);
        return par_err(PAR_ENOMEM, "%s: cannot allocate a %d-byte hashing buffer", path, CHUNK);
    }
    struct sha256_ctx ctx;
    sha256_init(&ctx);
    par_status st = PAR_OK;
    for (;;) {
        ssize_t r = read(fd, buf, CHUNK);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            st = par_err(PAR_EIO, "%s: read failed while hashing: %s", path, strerror(errno));
            goto done_free_buf;
        }
        if (r == 0)
            break;
        sha256_update(&ctx, (size_t)r, buf);
    }
    uint8_t d[PAR_SHA256_BYTES];
    sha256_digest(&ctx, PAR_SHA256_BYTES, d);
    to_hex(d, out);
done_free_buf:
    par_free(buf);
    close(fd);
    return st;
}

int par_sha256_hex_valid(const char *s)
{
    if (!s)
        return 0;
    for (int i = 0; i < 64; i++) {
        char c = s[i];
        if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F')))
            return 0;
    }
    return s[64] == '\0';
}
