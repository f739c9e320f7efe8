/*
 * c-naive: attention forward in plain C, the worked example of a backend that is not a Python
 * adapter (workflow/rules/backends/c-naive.smk runs it; README "Add a backend as a rule").
 *
 * Reads the cases written by `attnbench rule-backend cases` (TSV with a header) on stdin and
 * prints one TSV line per case on stdout: case_id status ms_median ms_p20 ms_p80 n_reps ms_ci_low
 * ms_ci_high rel_err max_abs_err reason. It runs fwd cases in fp32 (any layout; causal bottom-right aligned, as in
 * attnbench.bench.conventions) one query row at a time, so the score matrix is never
 * materialised: its bytes follow the `fused` family. Error is measured against the same
 * computation in double precision on the same inputs. Single-threaded; timing is
 * CLOCK_MONOTONIC around each call, median and quantiles of at least 6 calls or 0.2 s, and the
 * distribution-free 95% interval of the median from the order statistics (median_ci).
 */
#define _POSIX_C_SOURCE 199309L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct {
    char id[64], mode[16], layout[16], dtype[16];
    int batch, heads_q, heads_kv, d_qk, d_v, seq_q, seq_kv, causal, page_size;
} Case;

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static unsigned long long rng_state = 88172645463325252ULL;
static float uniform(void) { /* xorshift64, uniform in [-1, 1) */
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (float)((rng_state >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
}

/* Keys a query row may see: all of them, or (causal, bottom-right aligned) up to i + Skv - Sq. */
static int visible(const Case *c, int i) {
    int n = c->causal ? i + c->seq_kv - c->seq_q + 1 : c->seq_kv;
    return n < 0 ? 0 : (n > c->seq_kv ? c->seq_kv : n);
}

/* BHSD tensors; query head h reads KV head h / (Hq / Hkv). Row by row: scores, softmax, P V. */
static void attention_f32(const Case *c, const float *q, const float *k, const float *v, float *o, float *p) {
    const float scale = 1.0f / sqrtf((float)c->d_qk);
    const int group = c->heads_q / c->heads_kv;
    for (int b = 0; b < c->batch; b++)
        for (int h = 0; h < c->heads_q; h++) {
            const int hk = h / group;
            const float *kh = k + ((size_t)b * c->heads_kv + hk) * c->seq_kv * c->d_qk;
            const float *vh = v + ((size_t)b * c->heads_kv + hk) * c->seq_kv * c->d_v;
            for (int i = 0; i < c->seq_q; i++) {
                const float *qi = q + (((size_t)b * c->heads_q + h) * c->seq_q + i) * c->d_qk;
                float *oi = o + (((size_t)b * c->heads_q + h) * c->seq_q + i) * c->d_v;
                const int n = visible(c, i);
                float m = -INFINITY, sum = 0.0f;
                for (int j = 0; j < n; j++) {
                    float s = 0.0f;
                    for (int d = 0; d < c->d_qk; d++) s += qi[d] * kh[(size_t)j * c->d_qk + d];
                    p[j] = s * scale;
                    if (p[j] > m) m = p[j];
                }
                for (int d = 0; d < c->d_v; d++) oi[d] = 0.0f;
                for (int j = 0; j < n; j++) {
                    const float w = expf(p[j] - m);
                    sum += w;
                    for (int d = 0; d < c->d_v; d++) oi[d] += w * vh[(size_t)j * c->d_v + d];
                }
                for (int d = 0; d < c->d_v; d++) oi[d] = n ? oi[d] / sum : 0.0f;
            }
        }
}

/* The same computation in double precision: the reference for rel_err and max_abs_err. */
static void attention_f64(const Case *c, const float *q, const float *k, const float *v, double *o, double *p) {
    const double scale = 1.0 / sqrt((double)c->d_qk);
    const int group = c->heads_q / c->heads_kv;
    for (int b = 0; b < c->batch; b++)
        for (int h = 0; h < c->heads_q; h++) {
            const int hk = h / group;
            const float *kh = k + ((size_t)b * c->heads_kv + hk) * c->seq_kv * c->d_qk;
            const float *vh = v + ((size_t)b * c->heads_kv + hk) * c->seq_kv * c->d_v;
            for (int i = 0; i < c->seq_q; i++) {
                const float *qi = q + (((size_t)b * c->heads_q + h) * c->seq_q + i) * c->d_qk;
                double *oi = o + (((size_t)b * c->heads_q + h) * c->seq_q + i) * c->d_v;
                const int n = visible(c, i);
                double m = -INFINITY, sum = 0.0;
                for (int j = 0; j < n; j++) {
                    double s = 0.0;
                    for (int d = 0; d < c->d_qk; d++) s += (double)qi[d] * kh[(size_t)j * c->d_qk + d];
                    p[j] = s * scale;
                    if (p[j] > m) m = p[j];
                }
                for (int d = 0; d < c->d_v; d++) oi[d] = 0.0;
                for (int j = 0; j < n; j++) {
                    const double w = exp(p[j] - m);
                    sum += w;
                    for (int d = 0; d < c->d_v; d++) oi[d] += w * vh[(size_t)j * c->d_v + d];
                }
                for (int d = 0; d < c->d_v; d++) oi[d] = n ? oi[d] / sum : 0.0;
            }
        }
}

static int compare(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double quantile(const double *sorted, int n, double at) {
    const double pos = at * (n - 1);
    const int lo = (int)pos, hi = lo + 1 < n ? lo + 1 : lo;
    return sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - lo);
}

/* The distribution-free interval of the median of n sorted samples (Conover 1999, "Practical Nonparametric
 * Statistics", the confidence interval for a quantile): [x_(r), x_(n+1-r)] (1-based) with the largest r whose coverage
 * 1 - 2 P(Binomial(n, 1/2) <= r - 1) is at least 95%. Under 6 samples no such r exists: NaN. */
static void median_ci(const double *sorted, int n, double *low, double *high) {
    double pmf = pow(0.5, n), below = 0.0; /* P(Bin = i), P(Bin <= r - 1) */
    int r = 0;
    for (int i = 0; i < n; i++) {
        if (1.0 - 2.0 * (below + pmf) < 0.95) break;
        below += pmf;
        r = i + 1;
        pmf *= (double)(n - i) / (i + 1);
    }
    *low = r ? sorted[r - 1] : NAN;
    *high = r ? sorted[n - r] : NAN;
}

static float *random_tensor(size_t n) {
    float *t = malloc(n * sizeof *t);
    for (size_t i = 0; t && i < n; i++) t[i] = uniform();
    return t;
}

static void run(const Case *c) {
    if (strcmp(c->mode, "fwd") != 0 || strcmp(c->dtype, "fp32") != 0 || c->page_size) {
        printf("%s\tunsupported\t\t\t\t\t\t\t\t\tc-naive runs fwd in fp32 on a contiguous cache (got %s %s)\n", c->id,
               c->mode, c->dtype);
        return;
    }
    const size_t nq = (size_t)c->batch * c->heads_q * c->seq_q, nkv = (size_t)c->batch * c->heads_kv * c->seq_kv;
    float *q = random_tensor(nq * c->d_qk), *k = random_tensor(nkv * c->d_qk), *v = random_tensor(nkv * c->d_v);
    float *o = malloc(nq * c->d_v * sizeof *o), *p = malloc(c->seq_kv * sizeof *p);
    double *ref = malloc(nq * c->d_v * sizeof *ref), *pd = malloc(c->seq_kv * sizeof *pd);
    enum { MAX_REPS = 100 };
    double times[MAX_REPS];
    if (!q || !k || !v || !o || !p || !ref || !pd) {
        printf("%s\terror\t\t\t\t\t\t\t\t\tout of memory\n", c->id);
    } else {
        attention_f32(c, q, k, v, o, p); /* warm-up: page in the buffers */
        int n = 0;
        double total = 0.0;
        while (n < MAX_REPS && (n < 6 || total < 0.2)) {
            const double start = now_s();
            attention_f32(c, q, k, v, o, p);
            times[n] = now_s() - start;
            total += times[n++];
        }
        qsort(times, n, sizeof *times, compare);
        attention_f64(c, q, k, v, ref, pd);
        double err2 = 0.0, ref2 = 0.0, max_abs = 0.0;
        for (size_t i = 0; i < nq * c->d_v; i++) {
            const double e = fabs((double)o[i] - ref[i]);
            err2 += e * e;
            ref2 += ref[i] * ref[i];
            if (e > max_abs) max_abs = e;
        }
        double low, high;
        median_ci(times, n, &low, &high);
        printf("%s\tok\t%.6g\t%.6g\t%.6g\t%d\t%.6g\t%.6g\t%.6g\t%.6g\t\n", c->id, quantile(times, n, 0.5) * 1e3,
               quantile(times, n, 0.2) * 1e3, quantile(times, n, 0.8) * 1e3, n, low * 1e3, high * 1e3,
               sqrt(err2 / ref2), max_abs);
    }
    free(q), free(k), free(v), free(o), free(p), free(ref), free(pd);
}

int main(void) {
    char line[1024];
    if (!fgets(line, sizeof line, stdin)) return 1; /* header: attnbench.workflow.ingest.CASE_COLUMNS */
    printf("case_id\tstatus\tms_median\tms_p20\tms_p80\tn_reps\tms_ci_low\tms_ci_high\trel_err\tmax_abs_err\treason\n");
    while (fgets(line, sizeof line, stdin)) {
        Case c;
        if (sscanf(line, "%63s %15s %15s %d %d %d %d %d %d %d %d %15s %d", c.id, c.mode, c.layout, &c.batch,
                   &c.heads_q, &c.heads_kv, &c.d_qk, &c.d_v, &c.seq_q, &c.seq_kv, &c.causal, c.dtype,
                   &c.page_size) != 13) {
            fprintf(stderr, "c-naive: cannot parse case line: %s", line);
            continue;
        }
        run(&c);
        fflush(stdout);
    }
    return 0;
}
