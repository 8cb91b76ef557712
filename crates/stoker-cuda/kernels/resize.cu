/* stoker's GPU resampler: one decoded image (RGB8, interleaved, rows of `pitch` bytes) to one
 * sample of a uint8 batch, with the CPU path's arithmetic, so that the same decoded pixels give
 * the same bytes on either side.
 *
 * The CPU path (crates/stoker/src/image/ops/resample.rs) is Pillow's antialiased convolution,
 * bilinear (support 1) or bicubic (a = -0.5, support 2): one pass along each axis into 8-bit
 * values, each with integer coefficients of 22 fractional bits computed from double-precision
 * weights, horizontal first, or vertical first where Pillow 13 runs it so (`vfirst`); nearest
 * is Pillow's affine scan run as one tap of weight one. Here one thread computes one output
 * pixel: the second pass's taps, and for each of them the first pass's 8-bit value exactly as
 * the CPU's first pass wrote it, so the result is the same integer. The weights are computed in
 * double precision in the same order of operations; the PTX is made with contraction off
 * (--fmad=false), so no multiply and add are fused into one rounding the CPU does not make.
 * Positions outside the box's output rectangle are zero; the flip mirrors the whole row; NCHW
 * writes planes, NHWC interleaved pixels.
 *
 * The same source is compiled two ways:
 * - as CUDA by NVRTC into resize.ptx (scripts/gen-ptx; the PTX is committed and embedded in
 *   stoker-cuda, and the driver compiles it for the GPU at run time);
 * - as C by the stand-in driver of the tests (crates/stoker-cli/tests/fake_cuda.c), which runs
 *   `stoker_resize_pixel` for every thread of a launch, so CI checks this arithmetic against the
 *   CPU path on the host. */

#ifdef __CUDACC__
#define STOKER_DEVICE __device__
#define STOKER_NO_UNROLL _Pragma("unroll 1")
#else
#include <math.h>
#define STOKER_DEVICE static
#define STOKER_NO_UNROLL
#endif

#define STOKER_PRECISION_BITS 22
/* Taps per axis at most: a downscale of up to 32x bilinear, 16x bicubic (the host leaves larger
 * ones to the CPU). */
#define STOKER_MAX_TAPS 65
/* `filter`: Interpolation of resample.rs. */
#define STOKER_BILINEAR 0
#define STOKER_BICUBIC 1
#define STOKER_NEAREST 2

/* One launch's parameters, passed by value (the layout is mirrored by `ResizeParams` in
 * crates/stoker-cuda/src/gpu_decode/kernel.rs: doubles first, so there is no padding). */
typedef struct {
    double bbox[4];           /* source box (left, top, width, height) */
    unsigned long long src;   /* decoded image: RGB8 rows */
    unsigned long long dst;   /* the sample's first byte in the batch */
    unsigned int pitch;       /* bytes per source row */
    unsigned int clip[4];     /* pixels the filter may read: [x0, y0, x1, y1) */
    unsigned int rect[4];     /* output rectangle the box maps to (x, y, w, h) */
    unsigned int out_w, out_h;
    unsigned int flip, nhwc;
    unsigned int filter;      /* STOKER_BILINEAR, STOKER_BICUBIC or STOKER_NEAREST */
    unsigned int vfirst;      /* vertical pass first (Pillow 13's order for this resize) */
} StokerResize;

STOKER_DEVICE double stoker_bilinear(double x) {
    if (x < 0.0) x = -x;
    return x < 1.0 ? 1.0 - x : 0.0;
}

/* Pillow's bicubic_filter (a = -0.5), in its order of operations. */
STOKER_DEVICE double stoker_bicubic(double x) {
    const double a = -0.5;
    if (x < 0.0) x = -x;
    if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0;
    if (x < 2.0) return (((x - 5.0) * x + 8.0) * x - 4.0) * a;
    return 0.0;
}

/* The one input pixel of output `xx` for nearest, as Coeffs::nearest picks it: Pillow's scan,
 * `xo` starting at half a step and growing by one step per output pixel, added in doubles one
 * step at a time as the CPU adds them (a soft box continues the whole axis' scan). */
STOKER_DEVICE int stoker_nearest(int in_size, double in0, double in1, int out_size, int xx) {
    double scale = (in1 - in0) / (double)out_size;
    double n = (double)in_size;
    double full = round(n / scale), first = round(in0 / scale);
    double tol = 1e-9 * n;
    double a = scale, xo = in0 + scale * 0.5;
    long long skip = 0;
    if (full >= 1.0 && fabs(full * scale - n) <= tol && fabs(first * scale - in0) <= tol && first >= 0.0) {
        a = n / full;
        xo = a * 0.5;
        skip = (long long)first;
    }
    STOKER_NO_UNROLL
    for (long long i = 0; i < skip + xx; i++) xo += a;
    if (xo < 0.0) return 0;
    long long x = (long long)xo;
    return (int)(x < in_size - 1 ? x : in_size - 1);
}

/* The coefficients of output `xx` of an axis of `in_size` pixels, box [in0, in1) and
 * `out_size` outputs, as Coeffs::compute makes them: the first input and the tap count
 * (returned), the integer weights in `k`. */
STOKER_DEVICE int stoker_coeffs(unsigned int filter, int in_size, double in0, double in1, int out_size, int xx, int *first,
                                int *k) {
    if (filter == STOKER_NEAREST) {
        *first = stoker_nearest(in_size, in0, in1, out_size, xx);
        k[0] = 1 << STOKER_PRECISION_BITS;
        return 1;
    }
    double scale = (in1 - in0) / (double)out_size;
    double filterscale = scale > 1.0 ? scale : 1.0;
    double support = (filter == STOKER_BICUBIC ? 2.0 : 1.0) * filterscale;
    double center = in0 + ((double)xx + 0.5) * scale;
    long long xmin = (long long)(center - support + 0.5);
    if (xmin < 0) xmin = 0;
    long long xmax = (long long)(center + support + 0.5);
    if (xmax > in_size) xmax = in_size;
    if (xmax < xmin) xmax = xmin;
    int n = (int)(xmax - xmin);
    if (n > STOKER_MAX_TAPS) n = STOKER_MAX_TAPS;
    double ss = 1.0 / filterscale;
    double pre[STOKER_MAX_TAPS];
    double ww = 0.0;
    STOKER_NO_UNROLL
    for (int x = 0; x < n; x++) {
        double t = ((double)x + (double)xmin - center + 0.5) * ss;
        double w = filter == STOKER_BICUBIC ? stoker_bicubic(t) : stoker_bilinear(t);
        pre[x] = w;
        ww += w;
    }
    double one = (double)(1LL << STOKER_PRECISION_BITS);
    STOKER_NO_UNROLL
    for (int x = 0; x < n; x++) {
        double p = ww != 0.0 ? pre[x] / ww : pre[x];
        k[x] = p < 0.0 ? (int)(-0.5 + p * one) : (int)(0.5 + p * one);
    }
    *first = (int)xmin;
    return n;
}

STOKER_DEVICE unsigned char stoker_clip8(int acc) {
    int v = acc >> STOKER_PRECISION_BITS;
    return (unsigned char)(v < 0 ? 0 : v > 255 ? 255 : v);
}

/* Output pixel (x, y) of the sample (all three channels). */
STOKER_DEVICE void stoker_resize_pixel(const StokerResize *p, unsigned int x, unsigned int y) {
    unsigned char rgb[3] = {0, 0, 0};
    unsigned int xs = p->flip ? p->out_w - 1 - x : x; /* the column before the flip */
    unsigned int dx = p->rect[0], dy = p->rect[1], dw = p->rect[2], dh = p->rect[3];
    if (xs >= dx && xs < dx + dw && y >= dy && y < dy + dh) {
        int x0 = (int)p->clip[0], y0 = (int)p->clip[1], x1 = (int)p->clip[2], y1 = (int)p->clip[3];
        int kx[STOKER_MAX_TAPS], ky[STOKER_MAX_TAPS];
        int fx, fy;
        int nx = stoker_coeffs(p->filter, x1 - x0, p->bbox[0] - x0, p->bbox[0] + p->bbox[2] - x0, (int)dw, (int)(xs - dx), &fx,
                               kx);
        int ny = stoker_coeffs(p->filter, y1 - y0, p->bbox[1] - y0, p->bbox[1] + p->bbox[3] - y0, (int)dh, (int)(y - dy), &fy,
                               ky);
        const unsigned char *src = (const unsigned char *)(unsigned long long)p->src;
        const unsigned char *at = src + (unsigned long long)(y0 + fy) * p->pitch + (unsigned long long)(x0 + fx) * 3;
        int half = 1 << (STOKER_PRECISION_BITS - 1);
        int acc[3] = {half, half, half};
        /* The first pass's 8-bit values at the second pass's taps: horizontal sums along tap
         * row j (horizontal first), or vertical sums along tap column i (vertical first). */
        int outer = p->vfirst ? nx : ny, inner = p->vfirst ? ny : nx;
        const int *ko = p->vfirst ? kx : ky, *ki = p->vfirst ? ky : kx;
        unsigned long long step_o = p->vfirst ? 3 : p->pitch, step_i = p->vfirst ? p->pitch : 3;
        STOKER_NO_UNROLL
        for (int j = 0; j < outer; j++) {
            const unsigned char *px = at + (unsigned long long)j * step_o;
            int h[3] = {half, half, half};
            STOKER_NO_UNROLL
            for (int i = 0; i < inner; i++) {
                const unsigned char *q = px + (unsigned long long)i * step_i;
                h[0] += q[0] * ki[i];
                h[1] += q[1] * ki[i];
                h[2] += q[2] * ki[i];
            }
            for (int c = 0; c < 3; c++) acc[c] += stoker_clip8(h[c]) * ko[j];
        }
        for (int c = 0; c < 3; c++) rgb[c] = stoker_clip8(acc[c]);
    }
    unsigned char *dst = (unsigned char *)(unsigned long long)p->dst;
    unsigned long long at = (unsigned long long)y * p->out_w + x;
    if (p->nhwc) {
        for (int c = 0; c < 3; c++) dst[at * 3 + c] = rgb[c];
    } else {
        unsigned long long plane = (unsigned long long)p->out_w * p->out_h;
        for (int c = 0; c < 3; c++) dst[c * plane + at] = rgb[c];
    }
}

#ifdef __CUDACC__
extern "C" __global__ void stoker_resize(StokerResize p) {
    unsigned int x = blockIdx.x * blockDim.x + threadIdx.x;
    unsigned int y = blockIdx.y * blockDim.y + threadIdx.y;
    if (x < p.out_w && y < p.out_h) stoker_resize_pixel(&p, x, y);
}
#endif
