/* stoker's GPU resampler: one decoded image (RGB8, interleaved, rows of `pitch` bytes) to one
 * sample of a uint8 batch, with the CPU path's arithmetic, so that the same decoded pixels give
 * the same bytes on either side.
 *
 * The CPU path (crates/stoker/src/image/ops/resample.rs) is Pillow's antialiased bilinear
 * convolution: a horizontal pass into 8-bit rows, then a vertical pass, each with integer
 * coefficients of 22 fractional bits computed from double-precision weights. Here one thread
 * computes one output pixel: its vertical taps, and for each tap row the horizontal pass's
 * 8-bit value at its column, exactly as the CPU's horizontal pass wrote it, so the result is
 * the same integer. The weights are computed in double precision in the same order of
 * operations; the PTX is made with contraction off (--fmad=false), so no multiply and add are
 * fused into one rounding the CPU does not make. Positions outside the box's output rectangle
 * are zero; the flip mirrors the whole row; NCHW writes planes, NHWC interleaved pixels.
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
#define STOKER_DEVICE static
#define STOKER_NO_UNROLL
#endif

#define STOKER_PRECISION_BITS 22
/* Taps per axis at most: a downscale of up to 31x (the host leaves larger ones to the CPU). */
#define STOKER_MAX_TAPS 65

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
    unsigned int pad;
} StokerResize;

STOKER_DEVICE double stoker_bilinear(double x) {
    if (x < 0.0) x = -x;
    return x < 1.0 ? 1.0 - x : 0.0;
}

/* The coefficients of output `xx` of an axis of `in_size` pixels, box [in0, in1) and
 * `out_size` outputs, as Coeffs::compute makes them: the first input and the tap count
 * (returned), the integer weights in `k`. */
STOKER_DEVICE int stoker_coeffs(int in_size, double in0, double in1, int out_size, int xx, int *first, int *k) {
    double scale = (in1 - in0) / (double)out_size;
    double filterscale = scale > 1.0 ? scale : 1.0;
    double support = filterscale;
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
        double w = stoker_bilinear(((double)x + (double)xmin - center + 0.5) * ss);
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
        int nx = stoker_coeffs(x1 - x0, p->bbox[0] - x0, p->bbox[0] + p->bbox[2] - x0, (int)dw, (int)(xs - dx), &fx, kx);
        int ny = stoker_coeffs(y1 - y0, p->bbox[1] - y0, p->bbox[1] + p->bbox[3] - y0, (int)dh, (int)(y - dy), &fy, ky);
        const unsigned char *src = (const unsigned char *)(unsigned long long)p->src;
        int half = 1 << (STOKER_PRECISION_BITS - 1);
        int acc[3] = {half, half, half};
        STOKER_NO_UNROLL
        for (int j = 0; j < ny; j++) {
            const unsigned char *row = src + (unsigned long long)(y0 + fy + j) * p->pitch + (unsigned long long)(x0 + fx) * 3;
            int h[3] = {half, half, half};
            STOKER_NO_UNROLL
            for (int i = 0; i < nx; i++) {
                h[0] += row[3 * i] * kx[i];
                h[1] += row[3 * i + 1] * kx[i];
                h[2] += row[3 * i + 2] * kx[i];
            }
            for (int c = 0; c < 3; c++) acc[c] += stoker_clip8(h[c]) * ky[j];
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
