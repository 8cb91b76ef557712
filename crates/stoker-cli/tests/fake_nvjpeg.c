/* A stand-in for libnvjpeg.so, for CI machines without a GPU, beside the stand-in driver
 * (fake_cuda.c, whose "device memory" is host memory). It implements the nvJPEG calls stoker
 * makes. It does not decode JPEG: the test decodes each image beforehand with a reference
 * decoder and leaves the pixels in FAKE_NVJPEG_DIR, in a file named by the 64-bit FNV-1a hash
 * of the JPEG's bytes (`%016llx.rgb`: width and height as little-endian u32, then RGB8 rows).
 * A "decode" looks the bytes up and writes the pixels into the output image later, on the
 * stream's thread (fake_cuda_enqueue_host), in stream order like the real library. It proves
 * that stoker hands nvJPEG the right bytes, sizes, pitches and stream, and that the resampler
 * after it sees what nvJPEG wrote; never that nvJPEG works, which tests/gpu checks on a GPU.
 *
 * Unknown bytes are NVJPEG_STATUS_BAD_JPEG; a pitch that is not width * 3, or a batch of
 * another size than the one initialised, NVJPEG_STATUS_INVALID_PARAMETER.
 *
 * Build (next to the stand-in libcuda.so in DIR):
 *   gcc -shared -fPIC -O1 -pthread -o DIR/libnvjpeg.so fake_nvjpeg.c -LDIR -lcuda -Wl,-rpath,DIR
 * Environment:
 *   FAKE_NVJPEG_DIR          the decoded pixels
 *   FAKE_NVJPEG_HARDWARE=0   no hardware backend (nvjpegCreateEx fails for it, as on a GPU
 *                            without JPEG engines)
 *   FAKE_NVJPEG_BATCH_FAILS=1 nvjpegDecodeBatched fails (the engine refuses a batch)
 * Calls counted for tests, through ctypes: fake_nvjpeg_calls(0) batched, (1) single. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { SUCCESS = 0, INVALID_PARAMETER = 2, BAD_JPEG = 3, ARCH_MISMATCH = 7 };
enum { BACKEND_DEFAULT = 0, BACKEND_HARDWARE = 3, OUTPUT_RGBI = 5 };

typedef struct {
    unsigned char *channel[4];
    size_t pitch[4];
} nvjpegImage_t;

typedef struct {
    int backend;
} Handle;
typedef struct {
    int batch;
} State;

int fake_cuda_enqueue_host(void *stream, void (*fn)(void *), void *arg);

static long calls[2];

long fake_nvjpeg_calls(int which) { return __atomic_load_n(&calls[which & 1], __ATOMIC_RELAXED); }

static int env_is(const char *name, const char *value) {
    const char *v = getenv(name);
    return v && strcmp(v, value) == 0;
}

int nvjpegGetProperty(int type, int *value) {
    *value = type == 0 ? 12 : type == 1 ? 3 : 0;
    return SUCCESS;
}

int nvjpegCreateEx(int backend, void *dev_alloc, void *pinned_alloc, unsigned flags, void **handle) {
    (void)dev_alloc, (void)pinned_alloc, (void)flags;
    if (backend == BACKEND_HARDWARE && env_is("FAKE_NVJPEG_HARDWARE", "0")) return ARCH_MISMATCH;
    if (backend != BACKEND_DEFAULT && backend != BACKEND_HARDWARE) return INVALID_PARAMETER;
    Handle *h = calloc(1, sizeof *h);
    h->backend = backend;
    *handle = h;
    return SUCCESS;
}
int nvjpegDestroy(void *handle) {
    free(handle);
    return SUCCESS;
}
int nvjpegJpegStateCreate(void *handle, void **state) {
    (void)handle;
    *state = calloc(1, sizeof(State));
    return SUCCESS;
}
int nvjpegJpegStateDestroy(void *state) {
    free(state);
    return SUCCESS;
}
int nvjpegDecodeBatchedInitialize(void *handle, void *state, int batch, int threads, int format) {
    (void)threads;
    if (((Handle *)handle)->backend != BACKEND_HARDWARE || format != OUTPUT_RGBI || batch <= 0) return INVALID_PARAMETER;
    ((State *)state)->batch = batch;
    return SUCCESS;
}

typedef struct {
    unsigned char *dst;
    size_t len;
    unsigned char pixels[];
} Write;

static void write_pixels(void *arg) {
    Write *w = arg;
    memcpy(w->dst, w->pixels, w->len);
}

/* Looks `data` up and queues the write of its pixels into `out` on `stream`. */
static int decode_one(const unsigned char *data, size_t len, nvjpegImage_t *out, void *stream) {
    uint64_t h = 14695981039346656037ULL;
    for (size_t i = 0; i < len; i++) h = (h ^ data[i]) * 1099511628211ULL;
    const char *dir = getenv("FAKE_NVJPEG_DIR");
    char path[4096];
    snprintf(path, sizeof path, "%s/%016llx.rgb", dir ? dir : ".", (unsigned long long)h);
    FILE *f = fopen(path, "rb");
    if (!f) return BAD_JPEG;
    uint32_t wh[2];
    if (fread(wh, 4, 2, f) != 2) {
        fclose(f);
        return BAD_JPEG;
    }
    if (out->pitch[0] != (size_t)wh[0] * 3 || !out->channel[0]) {
        fclose(f);
        return INVALID_PARAMETER;
    }
    size_t n = (size_t)wh[0] * wh[1] * 3;
    Write *w = malloc(sizeof *w + n);
    w->dst = out->channel[0];
    w->len = n;
    size_t got = fread(w->pixels, 1, n, f);
    fclose(f);
    if (got != n) {
        free(w);
        return BAD_JPEG;
    }
    return fake_cuda_enqueue_host(stream, write_pixels, w) == 0 ? SUCCESS : INVALID_PARAMETER;
}

int nvjpegDecodeBatched(void *handle, void *state, const unsigned char *const *data, const size_t *lengths,
                        nvjpegImage_t *out, void *stream) {
    __atomic_add_fetch(&calls[0], 1, __ATOMIC_RELAXED);
    if (((Handle *)handle)->backend != BACKEND_HARDWARE || ((State *)state)->batch <= 0) return INVALID_PARAMETER;
    if (env_is("FAKE_NVJPEG_BATCH_FAILS", "1")) return INVALID_PARAMETER;
    for (int i = 0; i < ((State *)state)->batch; i++) {
        int r = decode_one(data[i], lengths[i], &out[i], stream);
        if (r != SUCCESS) return r;
    }
    return SUCCESS;
}

int nvjpegDecode(void *handle, void *state, const unsigned char *data, size_t length, int format,
                 nvjpegImage_t *out, void *stream) {
    (void)state;
    __atomic_add_fetch(&calls[1], 1, __ATOMIC_RELAXED);
    if (((Handle *)handle)->backend != BACKEND_DEFAULT || format != OUTPUT_RGBI) return INVALID_PARAMETER;
    return decode_one(data, length, out, stream);
}
