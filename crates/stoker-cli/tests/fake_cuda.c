/* A stand-in for libcuda.so, for CI machines without a GPU: it implements, with host memory and
 * one worker thread per stream, exactly the driver calls stoker makes (plus a few that tests call
 * through ctypes). It is a test double, not a GPU: it proves that stoker's transfer logic is
 * ordered correctly (copies really run later, on the stream's thread, after an artificial delay,
 * so a host buffer handed back before its copy event completed would be overwritten and the
 * test's digest would change), never that a real GPU works. The real driver is exercised by
 * tests/gpu on a GPU machine.
 *
 * What it models, because stoker's correctness depends on it:
 * - several devices, each with its own primary context (retain/release counted, so a test can
 *   ask cuDevicePrimaryCtxGetState which devices were opened), a PCI bus id per device, and
 *   CUDA_VISIBLE_DEVICES honoured like the real driver (the listed devices, renumbered from 0,
 *   the list ending at the first entry that is not a valid device);
 * - a per-thread stack of current contexts (cuCtxGetCurrent/SetCurrent/PushCurrent/PopCurrent);
 *   calls that need a context fail with CUDA_ERROR_INVALID_CONTEXT without one;
 * - every stream asynchronous, the legacy default stream (handles 0/1, and 2 for per-thread) of
 *   each context included: its work runs later on a worker thread, like any other stream;
 * - cuCtxSynchronize waits for every stream of the current context;
 * - out of memory on request, and a sticky error (every later call fails, as after a fault);
 * - stoker's one kernel, `stoker_resize` (GPU decode's resampler): cuModuleLoadData accepts
 *   only PTX text that defines it, and a launch runs `stoker_resize_pixel` from the kernel's own
 *   source (crates/stoker-cuda/kernels/resize.cu, compiled here as C) for every thread of the
 *   grid, later, on the stream's thread; so CI checks the kernel's arithmetic, never the PTX;
 * - host work on a stream for the stand-in nvJPEG (fake_nvjpeg.c): fake_cuda_enqueue_host.
 *
 * Build: gcc -shared -fPIC -O1 -ffp-contract=off -pthread -o libcuda.so fake_cuda.c
 * Environment:
 *   FAKE_CUDA_DEVICES (default 1)          physical devices
 *   FAKE_CUDA_COPY_DELAY_US (default 20000) delay before each host-to-device copy runs
 *   FAKE_CUDA_DTOH_DELAY_US (default the copy delay) delay before each asynchronous
 *                                           device-to-host copy runs (a slow reader)
 *   FAKE_CUDA_MEM_LIMIT (bytes, default none) cuMemAlloc fails with CUDA_ERROR_OUT_OF_MEMORY
 *                                           once a device would hold more than this
 *   FAKE_CUDA_STICKY_AFTER (default none)   after this many host-to-device copies, every call
 *                                           fails with CUDA_ERROR_ILLEGAL_ADDRESS (sticky) */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef int CUresult;
enum {
    OK = 0,
    ERR_INVALID_VALUE = 1,
    ERR_OUT_OF_MEMORY = 2,
    ERR_INVALID_DEVICE = 101,
    ERR_INVALID_CONTEXT = 201,
    ERR_NOT_READY = 600,
    ERR_ILLEGAL_ADDRESS = 700,
};

#define MAX_DEVICES 16
#define STACK_DEPTH 32

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t changed = PTHREAD_COND_INITIALIZER;

typedef struct Stream Stream;
typedef struct Ctx {
    int physical;        /* index among all devices */
    int retained;        /* primary context reference count */
    uint64_t allocated;  /* device bytes in use */
    Stream *legacy;      /* the legacy default stream, made on first use */
    Stream *streams[1024];
    int nstreams;
} Ctx;

static Ctx contexts[MAX_DEVICES];
static int visible[MAX_DEVICES]; /* CUDA ordinal -> physical device */
static int nvisible = -1;
static int sticky;               /* once set, every call fails */
static long copies;

static __thread Ctx *stack[STACK_DEPTH]; /* the thread's current-context stack */
static __thread int depth;

typedef struct {
    uint64_t recorded, completed;
    double done_at;
} Event;

enum { OP_COPY, OP_DTOH, OP_RECORD, OP_WAIT, OP_HOST };
typedef struct Op {
    int kind;
    void (*fn)(void *); /* OP_HOST: runs fn(arg) on the stream's thread, then frees arg */
    void *arg;
    void *dst;
    const void *src;
    size_t len;
    Event *ev;
    uint64_t gen;
    struct Op *next;
} Op;

struct Stream {
    Op *head, *tail;
    int busy, stop;
    Ctx *ctx;
    pthread_t thread;
};

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static long env_long(const char *name, long dflt) {
    const char *v = getenv(name);
    return v && *v ? atol(v) : dflt;
}

static int physical_count(void) {
    long n = env_long("FAKE_CUDA_DEVICES", 1);
    return n < 0 ? 0 : n > MAX_DEVICES ? MAX_DEVICES : (int)n;
}

/* CUDA_VISIBLE_DEVICES as the driver reads it: integers, in order, up to the first invalid one. */
static void init_devices(void) {
    if (nvisible >= 0) return;
    int n = physical_count();
    for (int i = 0; i < MAX_DEVICES; i++) contexts[i].physical = i;
    const char *v = getenv("CUDA_VISIBLE_DEVICES");
    nvisible = 0;
    if (!v) {
        for (int i = 0; i < n; i++) visible[nvisible++] = i;
        return;
    }
    char buf[256];
    strncpy(buf, v, sizeof buf - 1);
    buf[sizeof buf - 1] = 0;
    for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
        char *end;
        long d = strtol(tok, &end, 10);
        if (end == tok || *end || d < 0 || d >= n || nvisible >= MAX_DEVICES) break;
        visible[nvisible++] = (int)d;
    }
}

static Ctx *current(void) { return depth ? stack[depth - 1] : NULL; }

static void *worker(void *arg) {
    Stream *s = arg;
    long delay = env_long("FAKE_CUDA_COPY_DELAY_US", 20000);
    long dtoh_delay = env_long("FAKE_CUDA_DTOH_DELAY_US", delay);
    pthread_mutex_lock(&lock);
    for (;;) {
        while (!s->head && !s->stop) pthread_cond_wait(&changed, &lock);
        if (!s->head) break;
        Op *op = s->head;
        s->busy = 1;
        if (op->kind == OP_WAIT) {
            while (op->ev->completed < op->gen) pthread_cond_wait(&changed, &lock);
        } else if (op->kind == OP_HOST) {
            pthread_mutex_unlock(&lock);
            op->fn(op->arg);
            free(op->arg);
            pthread_mutex_lock(&lock);
        } else if (op->kind == OP_COPY || op->kind == OP_DTOH) {
            pthread_mutex_unlock(&lock);
            usleep(op->kind == OP_COPY ? delay : dtoh_delay);
            memcpy(op->dst, op->src, op->len);
            pthread_mutex_lock(&lock);
        } else {
            if (op->ev->completed < op->gen) op->ev->completed = op->gen;
            op->ev->done_at = now_s();
        }
        s->head = op->next;
        if (!s->head) s->tail = NULL;
        s->busy = 0;
        free(op);
        pthread_cond_broadcast(&changed);
    }
    pthread_mutex_unlock(&lock);
    return NULL;
}

/* Called with `lock` held. */
static Stream *new_stream(Ctx *c) {
    Stream *s = calloc(1, sizeof *s);
    s->ctx = c;
    pthread_create(&s->thread, NULL, worker, s);
    if (c->nstreams < 1024) c->streams[c->nstreams++] = s;
    return s;
}

/* The stream a handle names: 0, 1 (legacy) and 2 (per-thread) are the current context's
 * default stream (made asynchronous like any other); NULL without a context. Lock held. */
static Stream *resolve(void *handle) {
    if ((uintptr_t)handle > 2) return handle;
    Ctx *c = current();
    if (!c) return NULL;
    if (!c->legacy) c->legacy = new_stream(c);
    return c->legacy;
}

static void enqueue(Stream *s, Op *op) {
    op->next = NULL;
    if (s->tail) s->tail->next = op; else s->head = op;
    s->tail = op;
    pthread_cond_broadcast(&changed);
}

static void drain(Stream *s) {
    while (s->head || s->busy) pthread_cond_wait(&changed, &lock);
}

#define STICKY() do { if (sticky) return ERR_ILLEGAL_ADDRESS; } while (0)

CUresult cuInit(unsigned flags) { (void)flags; init_devices(); return OK; }
CUresult cuDriverGetVersion(int *v) { *v = 12000; return OK; }
CUresult cuDeviceGetCount(int *n) { init_devices(); *n = nvisible; return OK; }
CUresult cuDeviceGet(int *dev, int ordinal) {
    init_devices();
    if (ordinal < 0 || ordinal >= nvisible) return ERR_INVALID_DEVICE;
    *dev = ordinal;
    return OK;
}
CUresult cuDeviceGetName(char *name, int len, int dev) {
    init_devices();
    if (dev < 0 || dev >= nvisible) return ERR_INVALID_DEVICE;
    snprintf(name, len, "stoker fake CUDA device %d", visible[dev]);
    return OK;
}
/* Bus 0x10 + the physical index, so a test can tell which physical device an ordinal is. */
CUresult cuDeviceGetPCIBusId(char *id, int len, int dev) {
    init_devices();
    if (dev < 0 || dev >= nvisible) return ERR_INVALID_DEVICE;
    snprintf(id, len, "0000:%02X:00.0", 0x10 + visible[dev]);
    return OK;
}
CUresult cuDeviceTotalMem_v2(size_t *bytes, int dev) {
    (void)dev;
    *bytes = (size_t)env_long("FAKE_CUDA_MEM_LIMIT", 16L << 30);
    return OK;
}
CUresult cuDeviceGetAttribute(int *v, int attr, int dev) { (void)attr; (void)dev; *v = 0; return OK; }
CUresult cuGetErrorString(CUresult r, const char **s) {
    switch (r) {
    case ERR_OUT_OF_MEMORY: *s = "out of memory (fake driver)"; break;
    case ERR_INVALID_CONTEXT: *s = "invalid device context (fake driver)"; break;
    case ERR_ILLEGAL_ADDRESS: *s = "an illegal memory access was encountered (fake driver)"; break;
    default: *s = "fake driver error";
    }
    return OK;
}
CUresult cuGetErrorName(CUresult r, const char **s) { return cuGetErrorString(r, s); }

CUresult cuDevicePrimaryCtxRetain(void **ctx, int dev) {
    init_devices();
    if (dev < 0 || dev >= nvisible) return ERR_INVALID_DEVICE;
    pthread_mutex_lock(&lock);
    Ctx *c = &contexts[visible[dev]];
    c->retained++;
    pthread_mutex_unlock(&lock);
    *ctx = c;
    return OK;
}
CUresult cuDevicePrimaryCtxRelease_v2(int dev) {
    if (dev < 0 || dev >= nvisible) return ERR_INVALID_DEVICE;
    pthread_mutex_lock(&lock);
    Ctx *c = &contexts[visible[dev]];
    CUresult r = c->retained > 0 ? OK : ERR_INVALID_CONTEXT;
    if (c->retained > 0) c->retained--;
    pthread_mutex_unlock(&lock);
    return r;
}
CUresult cuDevicePrimaryCtxGetState(int dev, unsigned *flags, int *active) {
    init_devices();
    if (dev < 0 || dev >= nvisible) return ERR_INVALID_DEVICE;
    pthread_mutex_lock(&lock);
    *flags = 0;
    *active = contexts[visible[dev]].retained > 0;
    pthread_mutex_unlock(&lock);
    return OK;
}

CUresult cuCtxGetCurrent(void **ctx) { *ctx = current(); return OK; }
CUresult cuCtxSetCurrent(void *ctx) {
    if (!ctx) {
        if (depth) depth--;
    } else if (depth) {
        stack[depth - 1] = ctx;
    } else {
        stack[depth++] = ctx;
    }
    return OK;
}
CUresult cuCtxPushCurrent_v2(void *ctx) {
    if (!ctx) return ERR_INVALID_CONTEXT;
    if (depth == STACK_DEPTH) return ERR_INVALID_VALUE;
    stack[depth++] = ctx;
    return OK;
}
CUresult cuCtxPopCurrent_v2(void **ctx) {
    if (!depth) return ERR_INVALID_CONTEXT;
    Ctx *c = stack[--depth];
    if (ctx) *ctx = c;
    return OK;
}
CUresult cuCtxGetDevice(int *dev) {
    Ctx *c = current();
    if (!c) return ERR_INVALID_CONTEXT;
    for (int i = 0; i < nvisible; i++)
        if (visible[i] == c->physical) { *dev = i; return OK; }
    return ERR_INVALID_CONTEXT;
}
CUresult cuCtxSynchronize(void) {
    STICKY();
    Ctx *c = current();
    if (!c) return ERR_INVALID_CONTEXT;
    pthread_mutex_lock(&lock);
    for (int i = 0; i < c->nstreams; i++) drain(c->streams[i]);
    pthread_mutex_unlock(&lock);
    return sticky ? ERR_ILLEGAL_ADDRESS : OK;
}

CUresult cuStreamCreate(void **out, unsigned flags) {
    (void)flags;
    STICKY();
    Ctx *c = current();
    if (!c) return ERR_INVALID_CONTEXT;
    pthread_mutex_lock(&lock);
    *out = new_stream(c);
    pthread_mutex_unlock(&lock);
    return OK;
}
CUresult cuStreamSynchronize(void *stream) {
    STICKY();
    pthread_mutex_lock(&lock);
    Stream *s = resolve(stream);
    if (s) drain(s);
    pthread_mutex_unlock(&lock);
    if (!s) return ERR_INVALID_CONTEXT;
    return sticky ? ERR_ILLEGAL_ADDRESS : OK;
}
CUresult cuStreamDestroy_v2(void *stream) {
    Stream *s = stream;
    pthread_mutex_lock(&lock);
    s->stop = 1;
    Ctx *c = s->ctx;
    for (int i = 0; i < c->nstreams; i++)
        if (c->streams[i] == s) { c->streams[i] = c->streams[--c->nstreams]; break; }
    pthread_cond_broadcast(&changed);
    pthread_mutex_unlock(&lock);
    pthread_join(s->thread, NULL);
    free(s);
    return OK;
}

CUresult cuEventCreate(void **out, unsigned flags) {
    (void)flags;
    STICKY();
    if (!current()) return ERR_INVALID_CONTEXT;
    Event *e = calloc(1, sizeof *e);
    *out = e;
    return OK;
}
CUresult cuEventDestroy_v2(void *ev) { free(ev); return OK; }
/* Queues an op about event `e` on `stream`: OP_RECORD records a new generation of it, OP_WAIT
   waits for the last one recorded. */
static CUresult event_op(void *stream, Event *e, int kind) {
    pthread_mutex_lock(&lock);
    Stream *s = resolve(stream);
    if (!s) {
        pthread_mutex_unlock(&lock);
        return ERR_INVALID_CONTEXT;
    }
    Op *op = calloc(1, sizeof *op);
    op->kind = kind;
    op->ev = e;
    op->gen = kind == OP_RECORD ? ++e->recorded : e->recorded;
    enqueue(s, op);
    pthread_mutex_unlock(&lock);
    return OK;
}
CUresult cuEventRecord(void *ev, void *stream) {
    STICKY();
    return event_op(stream, ev, OP_RECORD);
}
CUresult cuStreamWaitEvent(void *stream, void *ev, unsigned flags) {
    (void)flags;
    STICKY();
    return event_op(stream, ev, OP_WAIT);
}
CUresult cuEventQuery(void *ev) {
    STICKY();
    Event *e = ev;
    pthread_mutex_lock(&lock);
    int done = e->completed >= e->recorded;
    pthread_mutex_unlock(&lock);
    return done ? OK : ERR_NOT_READY;
}
CUresult cuEventSynchronize(void *ev) {
    STICKY();
    Event *e = ev;
    pthread_mutex_lock(&lock);
    while (e->completed < e->recorded) pthread_cond_wait(&changed, &lock);
    pthread_mutex_unlock(&lock);
    return sticky ? ERR_ILLEGAL_ADDRESS : OK;
}
CUresult cuEventElapsedTime(float *ms, void *start, void *end) {
    STICKY();
    *ms = (float)((((Event *)end)->done_at - ((Event *)start)->done_at) * 1e3);
    return OK;
}

/* Device memory: a header in front of each block records its size and context. */
typedef struct {
    uint64_t len;
    Ctx *ctx;
    uint64_t pad[6];
} Block;

CUresult cuMemAlloc_v2(uint64_t *ptr, size_t len) {
    STICKY();
    Ctx *c = current();
    if (!c) return ERR_INVALID_CONTEXT;
    long limit = env_long("FAKE_CUDA_MEM_LIMIT", -1);
    pthread_mutex_lock(&lock);
    if (limit >= 0 && c->allocated + len > (uint64_t)limit) {
        pthread_mutex_unlock(&lock);
        return ERR_OUT_OF_MEMORY;
    }
    Block *b = malloc(sizeof(Block) + len);
    if (!b) {
        pthread_mutex_unlock(&lock);
        return ERR_OUT_OF_MEMORY;
    }
    c->allocated += len;
    pthread_mutex_unlock(&lock);
    b->len = len;
    b->ctx = c;
    memset(b + 1, 0xAB, len); /* device memory starts as garbage */
    *ptr = (uint64_t)(uintptr_t)(b + 1);
    return OK;
}
CUresult cuMemFree_v2(uint64_t ptr) {
    if (!current()) return ERR_INVALID_CONTEXT;
    Block *b = (Block *)(uintptr_t)ptr - 1;
    pthread_mutex_lock(&lock);
    b->ctx->allocated -= b->len;
    pthread_mutex_unlock(&lock);
    free(b);
    return OK;
}
CUresult cuMemHostAlloc(void **p, size_t len, unsigned flags) {
    (void)flags;
    STICKY();
    if (!current()) return ERR_INVALID_CONTEXT;
    return posix_memalign(p, 4096, len) ? ERR_OUT_OF_MEMORY : OK;
}
CUresult cuMemFreeHost(void *p) { free(p); return OK; }

/* Queues `op` on `stream` (or frees it and fails); a host-to-device copy counts towards
 * FAKE_CUDA_STICKY_AFTER. */
static CUresult submit(void *stream, Op *op) {
    if (sticky) {
        free(op);
        return ERR_ILLEGAL_ADDRESS;
    }
    pthread_mutex_lock(&lock);
    Stream *s = resolve(stream);
    CUresult r = OK;
    if (!s) {
        r = ERR_INVALID_CONTEXT;
    } else if (op->kind == OP_COPY) {
        long after = env_long("FAKE_CUDA_STICKY_AFTER", -1);
        if (after >= 0 && ++copies > after) {
            sticky = 1;
            pthread_cond_broadcast(&changed);
            r = ERR_ILLEGAL_ADDRESS;
        }
    }
    if (r == OK) enqueue(s, op);
    pthread_mutex_unlock(&lock);
    if (r != OK) free(op);
    return r;
}

static CUresult copy_async(int kind, void *dst, const void *src, size_t len, void *stream) {
    Op *op = calloc(1, sizeof *op);
    op->kind = kind;
    op->dst = dst;
    op->src = src;
    op->len = len;
    return submit(stream, op);
}
CUresult cuMemcpyHtoDAsync_v2(uint64_t dst, const void *src, size_t len, void *stream) {
    return copy_async(OP_COPY, (void *)(uintptr_t)dst, src, len, stream);
}
CUresult cuMemcpyDtoHAsync_v2(void *dst, uint64_t src, size_t len, void *stream) {
    return copy_async(OP_DTOH, dst, (const void *)(uintptr_t)src, len, stream);
}
/* Synchronous, on the legacy stream: after the work queued there. */
CUresult cuMemcpyDtoH_v2(void *dst, uint64_t src, size_t len) {
    STICKY();
    pthread_mutex_lock(&lock);
    Stream *s = resolve(NULL);
    if (s) drain(s);
    pthread_mutex_unlock(&lock);
    if (!s) return ERR_INVALID_CONTEXT;
    memcpy(dst, (const void *)(uintptr_t)src, len);
    return OK;
}

/* Host work `fn(arg)` on `stream`'s thread after the work queued before it; `arg` (malloc'd) is
 * freed afterwards. For the stand-in nvJPEG, which writes its output in stream order. */
CUresult fake_cuda_enqueue_host(void *stream, void (*fn)(void *), void *arg) {
    Op *op = calloc(1, sizeof *op);
    op->kind = OP_HOST;
    op->fn = fn;
    op->arg = arg;
    CUresult r = submit(stream, op);
    if (r != OK) free(arg);
    return r;
}

/* ---- stoker's kernel -------------------------------------------------------------------- */
#include "../../stoker-cuda/kernels/resize.cu"

enum { ERR_INVALID_PTX = 218, ERR_NOT_FOUND = 500 };
static int resize_function; /* the one CUfunction: its address */
static long launches;

CUresult cuModuleLoadData(void **module, const void *image) {
    STICKY();
    if (!current()) return ERR_INVALID_CONTEXT;
    const char *ptx = image;
    if (strncmp(ptx, "//", 2) != 0 || !strstr(ptx, ".entry stoker_resize(")) return ERR_INVALID_PTX;
    *module = &resize_function;
    return OK;
}
CUresult cuModuleGetFunction(void **f, void *module, const char *name) {
    STICKY();
    if (module != &resize_function || strcmp(name, "stoker_resize") != 0) return ERR_NOT_FOUND;
    *f = &resize_function;
    return OK;
}
CUresult cuModuleUnload(void *module) { (void)module; return OK; }

typedef struct {
    StokerResize p;
    unsigned gx, gy, bx, by;
} Launch;

static void run_launch(void *arg) {
    Launch *l = arg;
    for (unsigned y = 0; y < l->gy * l->by; y++)
        for (unsigned x = 0; x < l->gx * l->bx; x++)
            if (x < l->p.out_w && y < l->p.out_h) stoker_resize_pixel(&l->p, x, y);
}

CUresult cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                        unsigned shared, void *stream, void **params, void **extra) {
    (void)shared;
    (void)extra;
    STICKY();
    if (f != &resize_function || gz != 1 || bz != 1 || !params) return ERR_INVALID_VALUE;
    Launch *l = malloc(sizeof *l);
    memcpy(&l->p, params[0], sizeof l->p); /* the driver copies parameters at launch */
    l->gx = gx, l->gy = gy, l->bx = bx, l->by = by;
    __atomic_add_fetch(&launches, 1, __ATOMIC_RELAXED);
    return fake_cuda_enqueue_host(stream, run_launch, l);
}

/* Kernel launches so far (for tests, through ctypes). */
long fake_cuda_launches(void) { return __atomic_load_n(&launches, __ATOMIC_RELAXED); }
