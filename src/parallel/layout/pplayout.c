/* parallel/layout/pplayout.c - Megatron-LM pipeline layout strings and the default
 * even split.  See pplayout.h and docs/layouts.md. */
#include "parallel/layout/pplayout.h"

#include <stdio.h>
#include <string.h>

/* ---- parsing ------------------------------------------------------------ */

/* The parser expands repeats into a flat list of symbols (blocks and '|'),
 * each remembering the column it was written at. */
typedef struct {
    const char *s;
    int pos;
    int n;
    char sym[PAR_PPL_MAX_ITEMS + PAR_PPL_MAX_SEGMENTS];
    int col[PAR_PPL_MAX_ITEMS + PAR_PPL_MAX_SEGMENTS];
} parser;

#define PARSER_CAP ((int)(sizeof ((parser *)0)->sym))

static int is_ignored(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == ','; }
static int is_symbol(char c) { return c == 'E' || c == 't' || c == 'm' || c == 'L' || c == '|'; }

static void skip_ignored(parser *p)
{
    while (is_ignored(p->s[p->pos]))
        p->pos++;
}

static par_status too_long(int col)
{
    return par_err(PAR_EINVAL,
                   "pipeline layout: the string expands to more than %d blocks and separators "
                   "(at column %d)",
                   PARSER_CAP, col);
}

/* After an item that started at symbol index `start`, reads an optional
 * "*N" and repeats the item's symbols N times in total. */
static par_status parse_repeat(parser *p, int start)
{
    skip_ignored(p);
    if (p->s[p->pos] != '*')
        return PAR_OK;
    int star_col = p->pos + 1;
    p->pos++;
    skip_ignored(p);
    if (p->s[p->pos] == '\0')
        return par_err(PAR_EINVAL,
                       "pipeline layout: repeat '*' at column %d needs a count (e.g. 't*3'), got the "
                       "end of the string",
                       star_col);
    if (p->s[p->pos] < '0' || p->s[p->pos] > '9')
        return par_err(PAR_EINVAL,
                       "pipeline layout: repeat '*' at column %d needs a count (e.g. 't*3'), got '%c' "
                       "at column %d",
                       star_col, p->s[p->pos], p->pos + 1);
    long count = 0;
    int count_col = p->pos + 1;
    while (p->s[p->pos] >= '0' && p->s[p->pos] <= '9') {
        count = count * 10 + (p->s[p->pos] - '0');
        if (count > PARSER_CAP)
            count = PARSER_CAP + 1; /* saturate; reported below */
        p->pos++;
    }
    if (count == 0)
        return par_err(PAR_EINVAL,
                       "pipeline layout: repeat count 0 at column %d (a count must be at least 1)",
                       count_col);
    int len = p->n - start;
    if (len == 0)
        return par_err(PAR_EINVAL, "pipeline layout: repeat at column %d repeats nothing", star_col);
    if ((long)start + (long)len * count > PARSER_CAP)
        return too_long(count_col);
    for (long r = 1; r < count; r++) {
        memcpy(p->sym + p->n, p->sym + start, (size_t)len);
        memcpy(p->col + p->n, p->col + start, (size_t)len * sizeof p->col[0]);
        p->n += len;
    }
    skip_ignored(p);
    if (p->s[p->pos] == '*')
        return par_err(PAR_EINVAL,
                       "pipeline layout: a second repeat '*' at column %d follows the repeat at "
                       "column %d; write nested repeats with parentheses, e.g. '(t*2)*3'",
                       p->pos + 1, star_col);
    return PAR_OK;
}

/* seq := item*;  item := atom ('*' N)?;  atom := E|t|m|L|'|' | '(' seq ')'.
 * Stops at the end of the string or at a ')' (which the caller handles). */
static par_status parse_seq(parser *p, int depth)
{
    for (;;) {
        skip_ignored(p);
        char c = p->s[p->pos];
        int col = p->pos + 1;
        if (c == '\0' || c == ')')
            return PAR_OK;
        int start = p->n;
        if (is_symbol(c)) {
            if (p->n >= PARSER_CAP)
                return too_long(col);
            p->sym[p->n] = c;
            p->col[p->n] = col;
            p->n++;
            p->pos++;
        } else if (c == '(') {
            if (depth >= 32)
                return par_err(PAR_EINVAL, "pipeline layout: parentheses nested deeper than 32 at column %d",
                               col);
            p->pos++;
            par_status st = parse_seq(p, depth + 1);
            if (st != PAR_OK)
                return st;
            if (p->s[p->pos] != ')')
                return par_err(PAR_EINVAL, "pipeline layout: unbalanced '(' at column %d has no matching ')'",
                               col);
            if (p->n == start)
                return par_err(PAR_EINVAL, "pipeline layout: empty group '()' at column %d", col);
            int close_col = p->pos + 1;
            p->pos++;
            skip_ignored(p);
            if (p->s[p->pos] != '*')
                return par_err(PAR_EINVAL,
                               "pipeline layout: the group '(' at column %d ... ')' at column %d must "
                               "be followed by a repeat '*N' (Megatron-LM syntax)",
                               col, close_col);
        } else if (c == '*') {
            return par_err(PAR_EINVAL,
                           "pipeline layout: repeat '*' at column %d has nothing before it to repeat",
                           col);
        } else {
            char shown[16];
            if ((unsigned char)c >= 32 && (unsigned char)c < 127)
                snprintf(shown, sizeof shown, "'%c'", c);
            else
                snprintf(shown, sizeof shown, "byte 0x%02x", (unsigned char)c);
            return par_err(PAR_EINVAL,
                           "pipeline layout: unknown character %s at column %d (known: E embedding, "
                           "t transformer block, m MTP block, L loss, | stage separator, ( ) *N repeat)",
                           shown, col);
        }
        par_status st = parse_repeat(p, start);
        if (st != PAR_OK)
            return st;
    }
}

par_status par_pplayout_parse(const char *str, par_pplayout *out)
{
    if (!str)
        return par_err(PAR_EINVAL, "pipeline layout: no string given");
    /* The parser is large (symbols of the expanded string): keep it off the
     * stack of thread ranks. */
    static _Thread_local parser p;
    memset(&p, 0, sizeof p);
    p.s = str;
    par_status st = parse_seq(&p, 0);
    if (st != PAR_OK)
        return st;
    if (p.s[p.pos] == ')')
        return par_err(PAR_EINVAL, "pipeline layout: unbalanced ')' at column %d has no matching '('",
                       p.pos + 1);
    if (p.n == 0)
        return par_err(PAR_EINVAL, "pipeline layout: the string is empty (expected e.g. 'Et*3|t*2|t*3mL')");

    static _Thread_local par_pplayout r;
    memset(&r, 0, sizeof r);
    r.from_string = 1;
    r.seg_off[0] = 0;
    for (int i = 0; i < p.n; i++) {
        if (p.sym[i] == '|') {
            if (r.n_segments + 1 >= PAR_PPL_MAX_SEGMENTS)
                return par_err(PAR_EINVAL, "pipeline layout: more than %d segments (at column %d)",
                               PAR_PPL_MAX_SEGMENTS, p.col[i]);
            r.n_segments++;
            r.seg_off[r.n_segments] = r.n_items;
            continue;
        }
        if (r.n_items >= PAR_PPL_MAX_ITEMS)
            return too_long(p.col[i]);
        r.items[r.n_items] = p.sym[i];
        r.column[r.n_items] = p.col[i];
        r.n_items++;
    }
    r.n_segments++;
    r.seg_off[r.n_segments] = r.n_items;
    *out = r;
    return PAR_OK;
}

/* ---- queries ------------------------------------------------------------ */

static int segment_of_item(const par_pplayout *p, int i)
{
    int s = 0;
    while (s + 1 < p->n_segments && p->seg_off[s + 1] <= i)
        s++;
    return s;
}

int par_pplayout_count(const par_pplayout *p, int s, par_block_kind k)
{
    if (s < 0 || s >= p->n_segments)
        return 0;
    int c = 0;
    for (int i = p->seg_off[s]; i < p->seg_off[s + 1]; i++)
        c += p->items[i] == (char)k;
    return c;
}

int par_pplayout_offset(const par_pplayout *p, int s, par_block_kind k)
{
    int c = 0;
    for (int t = 0; t < s && t < p->n_segments; t++)
        c += par_pplayout_count(p, t, k);
    return c;
}

/* Appends the run-length form of items [a, b) to buf at *len. */
static void format_items(const par_pplayout *p, int a, int b, char *buf, int n, int *len)
{
    for (int i = a; i < b;) {
        int j = i;
        while (j < b && p->items[j] == p->items[i])
            j++;
        int w;
        if (j - i > 1)
            w = snprintf(buf + *len, (size_t)(n - *len), "%c*%d", p->items[i], j - i);
        else
            w = snprintf(buf + *len, (size_t)(n - *len), "%c", p->items[i]);
        if (w < 0 || *len + w >= n) {
            *len = n - 1;
            return;
        }
        *len += w;
        i = j;
    }
}

void par_pplayout_format_segment(const par_pplayout *p, int s, char *buf, int n)
{
    if (n <= 0)
        return;
    buf[0] = '\0';
    if (s < 0 || s >= p->n_segments)
        return;
    if (p->seg_off[s] == p->seg_off[s + 1]) {
        snprintf(buf, (size_t)n, "(empty)");
        return;
    }
    int len = 0;
    format_items(p, p->seg_off[s], p->seg_off[s + 1], buf, n, &len);
}

void par_pplayout_format(const par_pplayout *p, char *buf, int n)
{
    if (n <= 0)
        return;
    buf[0] = '\0';
    int len = 0;
    for (int s = 0; s < p->n_segments && len < n - 1; s++) {
        if (s > 0) {
            buf[len++] = '|';
            buf[len] = '\0';
        }
        format_items(p, p->seg_off[s], p->seg_off[s + 1], buf, n, &len);
    }
}

/* ---- rules -------------------------------------------------------------- */

static par_status check_end_block(const par_pplayout *p, par_block_kind k, int want_index,
                                  const char *what, const char *where)
{
    int found = 0;
    for (int i = 0; i < p->n_items; i++) {
        if (p->items[i] != (char)k)
            continue;
        found++;
        if (i != want_index)
            return par_err(PAR_EINVAL,
                           "pipeline layout: '%c' (%s) at column %d in segment %d must be the very %s",
                           (char)k, what, p->column[i], segment_of_item(p, i), where);
    }
    if (!found)
        return par_err(PAR_EINVAL, "pipeline layout: no '%c' (%s); it must be the very %s", (char)k, what,
                       where);
    return PAR_OK;
}

par_status par_pplayout_check(const par_pplayout *p, int64_t pp, int64_t vpp, int64_t n_layers,
                              int64_t n_mtp)
{
    if (pp < 1 || vpp < 1)
        return par_err(PAR_EINVAL, "pipeline layout: PP = %lld and VPP = %lld must be at least 1",
                       (long long)pp, (long long)vpp);
    if (p->n_segments != pp * vpp)
        return par_err(PAR_EINVAL,
                       "pipeline layout has %d segments ('|'-separated stages) but PP * VPP = %lld * "
                       "%lld = %lld",
                       p->n_segments, (long long)pp, (long long)vpp, (long long)(pp * vpp));
    /* E: the first block of segment 0 (an empty segment 0 fails too). */
    int first = p->seg_off[1] > 0 ? 0 : -1;
    par_status st = check_end_block(p, PAR_BLK_EMBED, first, "embedding",
                                    "first block of the first segment");
    if (st != PAR_OK)
        return st;
    int last_seg = p->n_segments - 1;
    int last = p->seg_off[last_seg + 1] > p->seg_off[last_seg] ? p->n_items - 1 : -1;
    st = check_end_block(p, PAR_BLK_LOSS, last, "loss", "last block of the last segment");
    if (st != PAR_OK)
        return st;

    int nt = 0, nm = 0, first_m = -1, m_seg = -1;
    for (int i = 0; i < p->n_items; i++) {
        if (p->items[i] == PAR_BLK_LAYER) {
            nt++;
            if (first_m >= 0)
                return par_err(PAR_EINVAL,
                               "pipeline layout: 't' at column %d comes after the 'm' at column %d; "
                               "every transformer block must precede the MTP blocks",
                               p->column[i], p->column[first_m]);
        } else if (p->items[i] == PAR_BLK_MTP) {
            nm++;
            int s = segment_of_item(p, i);
            if (first_m < 0) {
                first_m = i;
                m_seg = s;
            } else if (s != m_seg) {
                return par_err(PAR_EINVAL,
                               "pipeline layout: 'm' at column %d is in segment %d but the 'm' at "
                               "column %d is in segment %d; all MTP blocks must be in one segment",
                               p->column[i], s, p->column[first_m], m_seg);
            }
        }
    }
    if (nt != n_layers)
        return par_err(PAR_EINVAL, "pipeline layout has %d 't' blocks but n_layers is %lld", nt,
                       (long long)n_layers);
    if (nm != n_mtp)
        return par_err(PAR_EINVAL, "pipeline layout has %d 'm' blocks but n_mtp_layers is %lld", nm,
                       (long long)n_mtp);
    if (first_m >= 0) {
        int chunk = par_pplayout_segment_chunk(m_seg, (int)pp);
        if (chunk != vpp - 1)
            return par_err(PAR_EINVAL,
                           "pipeline layout: 'm' at column %d is in segment %d = virtual chunk %d of "
                           "pipeline rank %d; MTP blocks must be in the last virtual chunk (%lld) of "
                           "their rank",
                           p->column[first_m], m_seg, chunk, par_pplayout_segment_rank(m_seg, (int)pp),
                           (long long)(vpp - 1));
    }
    return PAR_OK;
}

/* ---- the default split -------------------------------------------------- */

/* A suggested uneven layout: q = n_layers / segs blocks each, the r extra
 * blocks to the middle segments first (segment 0 carries E, the last one the
 * MTP blocks and L), then to the first, then to the last. */
void par_pplayout_suggest(char *buf, int n, int64_t segs, int64_t n_layers, int64_t n_mtp)
{
    int64_t q = n_layers / segs, r = n_layers % segs;
    int len = 0;
    buf[0] = '\0';
    for (int64_t s = 0; s < segs && len < n - 1; s++) {
        int64_t extra = 0;
        int64_t middle = segs > 2 ? segs - 2 : 0;
        if (s > 0 && s < segs - 1)
            extra = (s - 1) < r ? 1 : 0;
        else if (s == 0)
            extra = r > middle ? 1 : 0;
        else
            extra = r > middle + (segs > 1 ? 1 : 0) ? 1 : 0;
        int64_t k = q + extra;
        int w = snprintf(buf + len, (size_t)(n - len), "%s%s", s ? "|" : "", s == 0 ? "E" : "");
        if (w < 0 || len + w >= n)
            break;
        len += w;
        if (k > 1)
            w = snprintf(buf + len, (size_t)(n - len), "t*%lld", (long long)k);
        else
            w = snprintf(buf + len, (size_t)(n - len), "%s", k == 1 ? "t" : "");
        if (w < 0 || len + w >= n)
            break;
        len += w;
        if (s == segs - 1) {
            if (n_mtp > 1)
                w = snprintf(buf + len, (size_t)(n - len), "m*%lldL", (long long)n_mtp);
            else
                w = snprintf(buf + len, (size_t)(n - len), "%sL", n_mtp == 1 ? "m" : "");
            if (w < 0 || len + w >= n)
                break;
            len += w;
        }
    }
}

par_status par_pplayout_default(par_pplayout *out, int64_t pp, int64_t vpp, int64_t n_layers,
                                int64_t n_mtp)
{
    if (pp < 1 || vpp < 1)
        return par_err(PAR_EINVAL, "pipeline layout: PP = %lld and VPP = %lld must be at least 1",
                       (long long)pp, (long long)vpp);
    if (n_layers < 0 || n_mtp < 0)
        return par_err(PAR_EINVAL, "pipeline layout: n_layers %lld and n_mtp_layers %lld must be >= 0",
                       (long long)n_layers, (long long)n_mtp);
    int64_t segs = pp * vpp;
    if (segs > PAR_PPL_MAX_SEGMENTS)
        return par_err(PAR_EINVAL, "pipeline layout: PP * VPP = %lld segments, more than the %d supported",
                       (long long)segs, PAR_PPL_MAX_SEGMENTS);
    if (n_layers + n_mtp + 2 > PAR_PPL_MAX_ITEMS)
        return par_err(PAR_EINVAL, "pipeline layout: %lld blocks, more than the %d supported",
                       (long long)(n_layers + n_mtp + 2), PAR_PPL_MAX_ITEMS);
    if (n_layers % segs != 0) {
        char sug[256];
        par_pplayout_suggest(sug, (int)sizeof sug, segs, n_layers, n_mtp);
        return par_err(PAR_EINVAL,
                       "n_layers %lld is not divisible by PP * VPP = %lld * %lld = %lld: without "
                       "--pipeline-model-parallel-layout the layers are split evenly (Megatron-LM "
                       "rule); give a layout for an uneven split, e.g. '%s'",
                       (long long)n_layers, (long long)pp, (long long)vpp, (long long)segs, sug);
    }
    static _Thread_local par_pplayout r;
    memset(&r, 0, sizeof r);
    int64_t per = n_layers / segs;
    int k = 0;
    for (int64_t s = 0; s < segs; s++) {
        r.seg_off[s] = k;
        if (s == 0)
            r.items[k++] = PAR_BLK_EMBED;
        for (int64_t i = 0; i < per; i++)
            r.items[k++] = PAR_BLK_LAYER;
        if (s == segs - 1) {
            for (int64_t i = 0; i < n_mtp; i++)
                r.items[k++] = PAR_BLK_MTP;
            r.items[k++] = PAR_BLK_LOSS;
        }
    }
    r.n_segments = (int)segs;
    r.n_items = k;
    r.seg_off[segs] = k;
    r.from_string = 0;
    *out = r;
    return PAR_OK;
}
