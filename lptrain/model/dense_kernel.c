/* Fused dense residual step for activations written as scale_out*sigmoid(z') + shift:
 *
 *     out = u + a*s + c [+ g],   s = sigmoid(K u + b)   (K, b already scaled by scale_in)
 *
 * one pass over each state (w, B) instead of five tensor operations (GEMM with a
 * broadcast bias, sigmoid, Euler update, shift, and an MGRIT level's right-hand side g).
 * States are feature-major rows of length B; a call advances m states, each with its
 * own K, b, a, c (and g).  Compiled at
 * first use by lptrain/model/kernel.py; see there for the flags and the fallback.
 */
#include <stdint.h>
#include <string.h>

/* sigmoid(z) = 1 / (1 + e^x), x = -z.  e^x = 2^n e^r with n = round(x / ln 2) and
 * |r| <= ln(2)/2 (two-part ln 2), e^r by its Taylor series to r^13 (truncation below
 * 2e-16 relative).  x is clamped to [-708, 708]: sigmoid is then 1 or below 4e-308. */
static inline double sigmoid(double z)
{
    double x = -z;
    x = x > 708.0 ? 708.0 : x;
    x = x < -708.0 ? -708.0 : x;
    const double shifter = 6755399441055744.0;          /* 1.5 * 2^52 */
    double t = x * 1.4426950408889634 + shifter;         /* n in the low mantissa bits */
    double n = t - shifter;
    double r = x - n * 6.93147180369123816490e-01;
    r = r - n * 1.90821492927058770002e-10;
    double p = 1.0 / 6227020800.0;
    p = p * r + 1.0 / 479001600.0;
    p = p * r + 1.0 / 39916800.0;
    p = p * r + 1.0 / 3628800.0;
    p = p * r + 1.0 / 362880.0;
    p = p * r + 1.0 / 40320.0;
    p = p * r + 1.0 / 5040.0;
    p = p * r + 1.0 / 720.0;
    p = p * r + 1.0 / 120.0;
    p = p * r + 1.0 / 24.0;
    p = p * r + 1.0 / 6.0;
    p = p * r + 0.5;
    p = p * r + 1.0;
    p = p * r + 1.0;
    int64_t bits;
    memcpy(&bits, &t, sizeof bits);
    bits = (bits - 0x4338000000000000LL + 1023) << 52;   /* the bits of 2^n */
    double scale;
    memcpy(&scale, &bits, sizeof scale);
    return 1.0 / (1.0 + p * scale);
}

/* One state, width W known at compile time: the batch loop is vectorised, the
 * W x W product unrolled into it. */
#define DEFINE_STEP(W, NAME, SAVE, PLUS)                                                \
static void NAME(long B, const double *restrict u, const double *restrict K,            \
                 const double *restrict b, long bi, double a, double c,                 \
                 const double *restrict g, double *restrict o, double *restrict sv)     \
{                                                                                       \
    _Pragma("omp simd")                                                                 \
    for (long j = 0; j < B; ++j) {                                                      \
        double x[W];                                                                    \
        _Pragma("GCC unroll 64") for (int q = 0; q < W; ++q) x[q] = u[q * B + j];      \
        _Pragma("GCC unroll 64") for (int i = 0; i < W; ++i) {                          \
            double z = b[i * bi];                                                       \
            _Pragma("GCC unroll 64") for (int q = 0; q < W; ++q) z += K[i * W + q] * x[q]; \
            double s = sigmoid(z);                                                      \
            if (SAVE) sv[i * B + j] = s;                                                \
            o[i * B + j] = x[i] + a * s + c + (PLUS ? g[i * B + j] : 0.0);             \
        }                                                                               \
    }                                                                                   \
}

typedef void (*step_fn)(long, const double *, const double *, const double *, long,
                        double, double, const double *, double *, double *);

#define WIDTH(W) DEFINE_STEP(W, step##W, 0, 0) DEFINE_STEP(W, step##W##s, 1, 0) \
                 DEFINE_STEP(W, step##W##g, 0, 1)
WIDTH(2) WIDTH(4) WIDTH(8) WIDTH(16)   /* wider: the GEMM dominates, torch's is better */

#define PICK(W) (save ? step##W##s : plus ? step##W##g : step##W)

static step_fn pick(int w, int save, int plus)
{
    if (save && plus)        /* no level both saves activations and has a rhs */
        return 0;
    switch (w) {
    case 2: return PICK(2);
    case 4: return PICK(4);
    case 8: return PICK(8);
    case 16: return PICK(16);
    default: return 0;
    }
}

/* Strides in elements between consecutive states (su, sg, so, ss), weights (sk) and
 * biases (sb); bi is the stride within one bias (0: one bias for all features).
 * g (the rhs added to each result) and save may be null.  Returns -1 for a case
 * without a kernel (the caller falls back), else 0. */
int lp_dense_sigmoid_step(int m, int w, long B, const double *u, long su,
                          const double *K, long sk, const double *b, long sb, long bi,
                          const double *a, const double *c, const double *g, long sg,
                          double *out, long so, double *save, long ss)
{
    step_fn f = pick(w, save != 0, g != 0);
    if (!f)
        return -1;
    for (int t = 0; t < m; ++t)
        f(B, u + t * su, K + t * sk, b + t * sb, bi, a[t], c[t], g ? g + t * sg : 0,
          out + t * so, save ? save + t * ss : 0);
    return 0;
}

int lp_supported_width(int w)
{
    return pick(w, 0, 0) != 0;
}

/* The MGRIT residual r = phi - target over m states of L contiguous elements:
 * returns sum r^2 and, by mode, writes nothing (0), r into phi (1), r added to
 * out (2).  One pass instead of a subtraction, a dot product and an update. */
double lp_residual(int m, long L, double *phi, long sp, const double *target, long st,
                   double *out, long so, int mode)
{
    double total = 0.0;
    for (int t = 0; t < m; ++t) {
        double *p = phi + t * sp, *o = out ? out + t * so : 0;
        const double *q = target + t * st;
        double acc = 0.0;
        if (mode == 0) {
            _Pragma("omp simd reduction(+:acc)")
            for (long i = 0; i < L; ++i) { double r = p[i] - q[i]; acc += r * r; }
        } else if (mode == 1) {
            _Pragma("omp simd reduction(+:acc)")
            for (long i = 0; i < L; ++i) { double r = p[i] - q[i]; p[i] = r; acc += r * r; }
        } else {
            _Pragma("omp simd reduction(+:acc)")
            for (long i = 0; i < L; ++i) { double r = p[i] - q[i]; o[i] += r; acc += r * r; }
        }
        total += acc;
    }
    return total;
}
