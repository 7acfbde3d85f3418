/* parallel: Megatron-LM pipeline layout strings and the default split. */
#include <criterion/criterion.h>
#include <string.h>

#include "core/status.h"
#include "parallel/layout/pplayout.h"

static void quiet(void) { par_err_set_quiet(1); }

TestSuite(pplayout, .init = quiet);

/* Segment s as a string of kinds, e.g. "Ettt". */
static void seg_str(const par_pplayout *p, int s, char *buf, size_t n)
{
    size_t k = 0;
    for (int i = p->seg_off[s]; i < p->seg_off[s + 1] && k + 1 < n; i++)
        buf[k++] = p->items[i];
    buf[k] = '\0';
}

static void expect_parse_fail(const char *str, const char *n1, const char *n2)
{
    par_pplayout p;
    par_clear_error();
    cr_assert_eq(par_pplayout_parse(str, &p), PAR_EINVAL, "'%s' parsed", str);
    const char *e = par_last_error();
    cr_expect(strstr(e, n1) != NULL, "'%s': message '%s' lacks '%s'", str, e, n1);
    if (n2)
        cr_expect(strstr(e, n2) != NULL, "'%s': message '%s' lacks '%s'", str, e, n2);
}

static void expect_check_fail(const char *str, int pp, int vpp, int nl, int nm, const char *n1,
                              const char *n2)
{
    par_pplayout p;
    cr_assert_eq(par_pplayout_parse(str, &p), PAR_OK, "'%s': %s", str, par_last_error());
    par_clear_error();
    cr_assert_eq(par_pplayout_check(&p, pp, vpp, nl, nm), PAR_EINVAL, "'%s' passed", str);
    const char *e = par_last_error();
    cr_expect(strstr(e, n1) != NULL, "'%s': message '%s' lacks '%s'", str, e, n1);
    if (n2)
        cr_expect(strstr(e, n2) != NULL, "'%s': message '%s' lacks '%s'", str, e, n2);
}

Test(pplayout, brief_example)
{
    par_pplayout p;
    cr_assert_eq(par_pplayout_parse("Et*3|t*2|t*3mL", &p), PAR_OK, "%s", par_last_error());
    cr_expect_eq(p.n_segments, 3);
    char b[64];
    seg_str(&p, 0, b, sizeof b);
    cr_expect_str_eq(b, "Ettt");
    seg_str(&p, 1, b, sizeof b);
    cr_expect_str_eq(b, "tt");
    seg_str(&p, 2, b, sizeof b);
    cr_expect_str_eq(b, "tttmL");
    cr_expect_eq(par_pplayout_check(&p, 3, 1, 8, 1), PAR_OK, "%s", par_last_error());
    /* layer ids: segment 1 holds layers 3-4, segment 2 layers 5-7 and MTP 0 */
    cr_expect_eq(par_pplayout_offset(&p, 1, PAR_BLK_LAYER), 3);
    cr_expect_eq(par_pplayout_offset(&p, 2, PAR_BLK_LAYER), 5);
    cr_expect_eq(par_pplayout_count(&p, 2, PAR_BLK_LAYER), 3);
    cr_expect_eq(par_pplayout_offset(&p, 2, PAR_BLK_MTP), 0);
    cr_expect_eq(par_pplayout_count(&p, 2, PAR_BLK_MTP), 1);
    par_pplayout_format(&p, b, sizeof b);
    cr_expect_str_eq(b, "Et*3|t*2|t*3mL");
    par_pplayout_format_segment(&p, 0, b, sizeof b);
    cr_expect_str_eq(b, "Et*3");
    /* columns point into the string */
    cr_expect_eq(p.column[0], 1);
    cr_expect_eq(p.column[p.n_items - 1], 14);
}

Test(pplayout, megatron_docstring_example_with_vpp)
{
    /* Megatron-LM's own example: "Ettt|(tt|)*29,m|L" is
     * [E t t t] + [t t]*29 + [m] + [L]: 32 segments, 61 layers; with PP 16 it
     * is VPP 2 and puts m on PP rank 14 and L on PP rank 15, chunk 1. */
    par_pplayout p;
    cr_assert_eq(par_pplayout_parse("Ettt|(tt|)*29,m|L", &p), PAR_OK, "%s", par_last_error());
    cr_expect_eq(p.n_segments, 32);
    cr_expect_eq(par_pplayout_check(&p, 16, 2, 61, 1), PAR_OK, "%s", par_last_error());
    cr_expect_eq(par_pplayout_count(&p, 30, PAR_BLK_MTP), 1);
    cr_expect_eq(par_pplayout_segment_rank(30, 16), 14);
    cr_expect_eq(par_pplayout_segment_chunk(30, 16), 1);
    cr_expect_eq(par_pplayout_segment_rank(31, 16), 15);
    cr_expect_eq(par_pplayout_segment_of(15, 1, 16), 31);
    cr_expect_eq(par_pplayout_count(&p, 31, PAR_BLK_LOSS), 1);
    for (int s = 1; s < 30; s++)
        cr_expect_eq(par_pplayout_count(&p, s, PAR_BLK_LAYER), 2, "segment %d", s);
    /* The same layout with PP 32 is VPP 1; with PP 8 VPP 4 the MTP segment 30
     * is rank 6, chunk 3 = the last: valid too. */
    cr_expect_eq(par_pplayout_check(&p, 32, 1, 61, 1), PAR_OK, "%s", par_last_error());
    cr_expect_eq(par_pplayout_check(&p, 8, 4, 61, 1), PAR_OK, "%s", par_last_error());
}

Test(pplayout, uneven_vpp_nested_whitespace)
{
    par_pplayout p;
    /* uneven PP 3 */
    cr_assert_eq(par_pplayout_parse("Et|t*4|t*3mL", &p), PAR_OK);
    cr_expect_eq(par_pplayout_check(&p, 3, 1, 8, 1), PAR_OK, "%s", par_last_error());
    /* VPP: PP 2 x 2, segment 2 is rank 0's chunk 1 */
    cr_assert_eq(par_pplayout_parse("Et*2|t*2|t*2|t*2mL", &p), PAR_OK);
    cr_expect_eq(par_pplayout_check(&p, 2, 2, 8, 1), PAR_OK, "%s", par_last_error());
    cr_expect_eq(par_pplayout_segment_rank(2, 2), 0);
    cr_expect_eq(par_pplayout_segment_chunk(2, 2), 1);
    cr_expect_eq(par_pplayout_offset(&p, 2, PAR_BLK_LAYER), 4);
    /* whitespace and commas are ignored, also around '*' */
    cr_assert_eq(par_pplayout_parse(" E t * 3 |\tt*2 , | t*3 m L\n", &p), PAR_OK, "%s", par_last_error());
    cr_expect_eq(par_pplayout_check(&p, 3, 1, 8, 1), PAR_OK, "%s", par_last_error());
    /* nested groups, multi-digit counts, repeated separators */
    cr_assert_eq(par_pplayout_parse("E((t*2)*2|)*3t*12mL", &p), PAR_OK, "%s", par_last_error());
    cr_expect_eq(p.n_segments, 4);
    cr_expect_eq(par_pplayout_check(&p, 4, 1, 24, 1), PAR_OK, "%s", par_last_error());
    cr_expect_eq(par_pplayout_count(&p, 3, PAR_BLK_LAYER), 12);
    /* '|' is an item too: "|*3" is three separators (as in Megatron-LM) */
    cr_assert_eq(par_pplayout_parse("Et*2|*3t*6mL", &p), PAR_OK, "%s", par_last_error());
    cr_expect_eq(p.n_segments, 4);
    cr_expect_eq(par_pplayout_count(&p, 1, PAR_BLK_LAYER) + par_pplayout_count(&p, 2, PAR_BLK_LAYER), 0);
    cr_assert_eq(par_pplayout_parse("Et*2(|t*2)*3mL", &p), PAR_OK, "%s", par_last_error());
    cr_expect_eq(p.n_segments, 4);
    cr_expect_eq(par_pplayout_check(&p, 4, 1, 8, 1), PAR_OK, "%s", par_last_error());
    /* empty segments (Megatron's "(empty stage)") are allowed in the middle */
    cr_assert_eq(par_pplayout_parse("Et*8||mL", &p), PAR_OK);
    cr_expect_eq(par_pplayout_check(&p, 3, 1, 8, 1), PAR_OK, "%s", par_last_error());
    char b[32];
    par_pplayout_format_segment(&p, 1, b, sizeof b);
    cr_expect_str_eq(b, "(empty)");
    /* no MTP */
    cr_assert_eq(par_pplayout_parse("Et*4|t*4L", &p), PAR_OK);
    cr_expect_eq(par_pplayout_check(&p, 2, 1, 8, 0), PAR_OK, "%s", par_last_error());
}

Test(pplayout, malformed_syntax)
{
    expect_parse_fail("", "empty", NULL);
    expect_parse_fail(" , \t", "empty", NULL);
    expect_parse_fail("(Et*3|t*5mL", "unbalanced '(' at column 1", NULL);
    expect_parse_fail("E(t*3|(t*2)*2mL", "unbalanced '(' at column 2", NULL);
    expect_parse_fail("Et*3)|t*5mL", "unbalanced ')' at column 5", NULL);
    expect_parse_fail("Et*3|t*5mLX", "unknown character 'X' at column 11", NULL);
    expect_parse_fail("Et*", "repeat '*' at column 3 needs a count", "end of the string");
    expect_parse_fail("Et*x|t", "repeat '*' at column 3 needs a count", "'x'");
    expect_parse_fail("Et*0|t*8mL", "repeat count 0 at column 4", NULL);
    expect_parse_fail("*3Et", "repeat '*' at column 1 has nothing before it", NULL);
    expect_parse_fail("E(*3t)*2", "repeat '*' at column 3 has nothing before it", NULL);
    expect_parse_fail("Et*2*3", "second repeat '*' at column 5", "(t*2)*3");
    expect_parse_fail("E(tt)|L", "group '(' at column 2", "'*N'");
    expect_parse_fail("E()*2L", "empty group '()' at column 2", NULL);
    expect_parse_fail("E(t*1000)*1000L", "expands to more than", NULL);
    expect_parse_fail("Et*99999999999999999999L", "expands to more than", NULL);
    cr_expect_eq(par_pplayout_parse(NULL, &(par_pplayout){0}), PAR_EINVAL);
}

Test(pplayout, malformed_rules)
{
    /* E: not first, twice, missing */
    expect_check_fail("tEt*7|mL", 2, 1, 8, 1, "'E' (embedding) at column 2 in segment 0",
                      "very first block of the first segment");
    expect_check_fail("Et*4|Et*4mL", 2, 1, 8, 1, "'E' (embedding) at column 6 in segment 1", NULL);
    expect_check_fail("t*4|t*4mL", 2, 1, 8, 1, "no 'E'", NULL);
    expect_check_fail("|Et*8mL", 2, 1, 8, 1, "'E' (embedding) at column 2 in segment 1", NULL);
    /* L: not last, twice, missing, last segment empty */
    expect_check_fail("Et*4|t*4Lm", 2, 1, 8, 1, "'L' (loss) at column 9 in segment 1",
                      "very last block of the last segment");
    expect_check_fail("Et*4L|t*4mL", 2, 1, 8, 1, "'L' (loss) at column 5 in segment 0", NULL);
    expect_check_fail("Et*4|t*4m", 2, 1, 8, 1, "no 'L'", NULL);
    expect_check_fail("Et*4|t*4mL|", 3, 1, 8, 1, "'L' (loss) at column 10 in segment 1", NULL);
    /* block counts */
    expect_check_fail("Et*3|t*4mL", 2, 1, 8, 1, "has 7 't' blocks but n_layers is 8", NULL);
    expect_check_fail("Et*4|t*4L", 2, 1, 8, 1, "has 0 'm' blocks but n_mtp_layers is 1", NULL);
    expect_check_fail("Et*4|t*4m*2L", 2, 1, 8, 1, "has 2 'm' blocks but n_mtp_layers is 1", NULL);
    /* segment count */
    expect_check_fail("Et*4|t*2|t*2mL", 2, 1, 8, 1, "has 3 segments", "PP * VPP = 2 * 1 = 2");
    expect_check_fail("Et*4|t*4mL", 2, 2, 8, 1, "has 2 segments", "PP * VPP = 2 * 2 = 4");
    /* MTP placement (Megatron-LM's rules) */
    expect_check_fail("Et*4m|t*4L", 2, 1, 8, 1, "'t' at column 7 comes after the 'm' at column 5", NULL);
    expect_check_fail("Et*8m|mL", 2, 1, 8, 2, "'m' at column 7 is in segment 1", "all MTP blocks must be in one segment");
    expect_check_fail("Et*4|t*4m||L", 2, 2, 8, 1, "segment 1 = virtual chunk 0 of pipeline rank 1",
                      "last virtual chunk (1)");
    /* sizes */
    par_pplayout p;
    par_pplayout_parse("EtL", &p);
    cr_expect_eq(par_pplayout_check(&p, 0, 1, 1, 0), PAR_EINVAL);
    cr_expect_eq(par_pplayout_check(&p, 1, 1, 1, 0), PAR_OK, "%s", par_last_error());
}

Test(pplayout, default_split_follows_megatron)
{
    par_pplayout p;
    /* PP 4 x VPP 2, 8 layers: one per segment; E in segment 0, m and L in 7 */
    cr_assert_eq(par_pplayout_default(&p, 4, 2, 8, 1), PAR_OK, "%s", par_last_error());
    cr_expect_eq(p.n_segments, 8);
    cr_expect_eq(p.from_string, 0);
    char b[64];
    par_pplayout_format(&p, b, sizeof b);
    cr_expect_str_eq(b, "Et|t|t|t|t|t|t|tmL");
    cr_expect_eq(par_pplayout_check(&p, 4, 2, 8, 1), PAR_OK, "%s", par_last_error());
    for (int s = 0; s < 8; s++)
        cr_expect_eq(par_pplayout_offset(&p, s, PAR_BLK_LAYER), s);
    cr_expect_eq(par_pplayout_segment_rank(7, 4), 3);
    cr_expect_eq(par_pplayout_segment_chunk(7, 4), 1);
    /* PP 1 */
    cr_assert_eq(par_pplayout_default(&p, 1, 1, 3, 1), PAR_OK);
    par_pplayout_format(&p, b, sizeof b);
    cr_expect_str_eq(b, "Et*3mL");
    /* PP 2, no MTP */
    cr_assert_eq(par_pplayout_default(&p, 2, 1, 4, 0), PAR_OK);
    par_pplayout_format(&p, b, sizeof b);
    cr_expect_str_eq(b, "Et*2|t*2L");
    /* uneven: an error that suggests a layout */
    par_clear_error();
    cr_expect_eq(par_pplayout_default(&p, 2, 1, 3, 1), PAR_EINVAL);
    cr_expect(strstr(par_last_error(), "n_layers 3 is not divisible by PP * VPP = 2 * 1 = 2"), "%s",
              par_last_error());
    cr_expect(strstr(par_last_error(), "'Et*2|tmL'"), "%s", par_last_error());
    cr_expect_eq(par_pplayout_default(&p, 3, 2, 8, 1), PAR_EINVAL);
    cr_expect(strstr(par_last_error(), "'Et|t*2|t*2|t|t|tmL'"), "%s", par_last_error());
    cr_expect_eq(par_pplayout_default(&p, 600, 1, 600, 1), PAR_EINVAL);
    cr_expect(strstr(par_last_error(), "more than the 512 supported"), "%s", par_last_error());
}
