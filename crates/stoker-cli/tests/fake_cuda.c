/* A stand-in for libcuda.so, for CI machines without a GPU: it implements, with host memory and
 * one worker thread per stream, exactly the driver calls stoker makes. It is a test double, not
 * a GPU: it proves that stoker's transfer logic is ordered correctly (copies really run later,
 * on the stream's thread, after an artificial delay, so a host buffer handed back before its
 * copy event completed would be overwritten and the test's digest would change), never that a
 * real GPU works. The real driver is exercised by tests/gpu on a GPU machine.
 *
 * Build: gcc -shared -fPIC -O1 -pthread -o libcuda.so fake_cuda.c
 * FAKE_CUDA_DEVICES (default 1) sets the device count; FAKE_CUDA_COPY_DELAY_US (default 20000)
 * the delay before each host-to-device copy runs. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef int CUresult;
enum { OK = 0, ERR_INVALID_VALUE = 1, ERR_OUT_OF_MEMORY = 2, ERR_INVALID_DEVICE = 101, ERR_NOT_READY = 600 };

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t changed = PTHREAD_COND_INITIALIZER;
static int primary_ctx;             /* its address is the one context */
static __thread void *current_ctx;  /* cuCtxGetCurrent / cuCtxSetCurrent */

typedef struct {
    uint64_t recorded, completed;
    double done_at;
} Event;

enum { OP_COPY, OP_RECORD, OP_WAIT };
typedef struct Op {
    int kind;
    void *dst;
    const void *src;
    size_t len;
    Event *ev;
    uint64_t gen;
    struct Op *next;
} Op;

typedef struct {
    Op *head, *tail;
    int busy, stop;
    pthread_t thread;
} Stream;

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static int env_int(const char *name, int dflt) {
    const char *v = getenv(name);
    return v && *v ? atoi(v) : dflt;
}

static void *worker(void *arg) {
    Stream *s = arg;
    int delay = env_int("FAKE_CUDA_COPY_DELAY_US", 20000);
    pthread_mutex_lock(&lock);
    for (;;) {
        while (!s->head && !s->stop) pthread_cond_wait(&changed, &lock);
        if (!s->head) break;
        Op *op = s->head;
        s->busy = 1;
        if (op->kind == OP_WAIT) {
            while (op->ev->completed < op->gen) pthread_cond_wait(&changed, &lock);
        } else if (op->kind == OP_COPY) {
            pthread_mutex_unlock(&lock);
            usleep(delay);
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

/* Streams 0, 1 (legacy) and 2 (per-thread) run their work at once, on the calling thread. */
static int special(void *stream) { return (uintptr_t)stream <= 2; }

static void enqueue(Stream *s, Op *op) {
    op->next = NULL;
    if (s->tail) s->tail->next = op; else s->head = op;
    s->tail = op;
    pthread_cond_broadcast(&changed);
}

CUresult cuInit(unsigned flags) { (void)flags; return OK; }
CUresult cuDriverGetVersion(int *v) { *v = 12000; return OK; }
CUresult cuDeviceGetCount(int *n) { *n = env_int("FAKE_CUDA_DEVICES", 1); return OK; }
CUresult cuDeviceGet(int *dev, int ordinal) {
    if (ordinal < 0 || ordinal >= env_int("FAKE_CUDA_DEVICES", 1)) return ERR_INVALID_DEVICE;
    *dev = ordinal;
    return OK;
}
CUresult cuDeviceGetName(char *name, int len, int dev) {
    (void)dev;
    strncpy(name, "stoker fake CUDA device", len);
    if (len > 0) name[len - 1] = 0;
    return OK;
}
CUresult cuDeviceGetAttribute(int *v, int attr, int dev) { (void)attr; (void)dev; *v = 0; return OK; }
CUresult cuGetErrorString(CUresult r, const char **s) { (void)r; *s = "fake driver error"; return OK; }
CUresult cuDevicePrimaryCtxRetain(void **ctx, int dev) { (void)dev; *ctx = &primary_ctx; return OK; }
CUresult cuDevicePrimaryCtxRelease_v2(int dev) { (void)dev; return OK; }
CUresult cuCtxGetCurrent(void **ctx) { *ctx = current_ctx; return OK; }
CUresult cuCtxSetCurrent(void *ctx) { current_ctx = ctx; return OK; }

CUresult cuStreamCreate(void **out, unsigned flags) {
    (void)flags;
    if (!current_ctx) return ERR_INVALID_VALUE;
    Stream *s = calloc(1, sizeof *s);
    pthread_create(&s->thread, NULL, worker, s);
    *out = s;
    return OK;
}
CUresult cuStreamSynchronize(void *stream) {
    if (special(stream)) return OK;
    Stream *s = stream;
    pthread_mutex_lock(&lock);
    while (s->head || s->busy) pthread_cond_wait(&changed, &lock);
    pthread_mutex_unlock(&lock);
    return OK;
}
CUresult cuStreamDestroy_v2(void *stream) {
    Stream *s = stream;
    pthread_mutex_lock(&lock);
    s->stop = 1;
    pthread_cond_broadcast(&changed);
    pthread_mutex_unlock(&lock);
    pthread_join(s->thread, NULL);
    free(s);
    return OK;
}
CUresult cuCtxSynchronize(void) { return OK; /* callers here synchronise their streams first */ }

CUresult cuEventCreate(void **out, unsigned flags) {
    (void)flags;
    Event *e = calloc(1, sizeof *e);
    *out = e;
    return OK;
}
CUresult cuEventDestroy_v2(void *ev) { free(ev); return OK; }
CUresult cuEventRecord(void *ev, void *stream) {
    Event *e = ev;
    pthread_mutex_lock(&lock);
    uint64_t gen = ++e->recorded;
    if (special(stream)) {
        e->completed = gen;
        e->done_at = now_s();
        pthread_cond_broadcast(&changed);
    } else {
        Op *op = calloc(1, sizeof *op);
        op->kind = OP_RECORD;
        op->ev = e;
        op->gen = gen;
        enqueue(stream, op);
    }
    pthread_mutex_unlock(&lock);
    return OK;
}
CUresult cuStreamWaitEvent(void *stream, void *ev, unsigned flags) {
    (void)flags;
    Event *e = ev;
    pthread_mutex_lock(&lock);
    if (special(stream)) {
        while (e->completed < e->recorded) pthread_cond_wait(&changed, &lock);
    } else {
        Op *op = calloc(1, sizeof *op);
        op->kind = OP_WAIT;
        op->ev = e;
        op->gen = e->recorded;
        enqueue(stream, op);
    }
    pthread_mutex_unlock(&lock);
    return OK;
}
CUresult cuEventQuery(void *ev) {
    Event *e = ev;
    pthread_mutex_lock(&lock);
    int done = e->completed >= e->recorded;
    pthread_mutex_unlock(&lock);
    return done ? OK : ERR_NOT_READY;
}
CUresult cuEventSynchronize(void *ev) {
    Event *e = ev;
    pthread_mutex_lock(&lock);
    while (e->completed < e->recorded) pthread_cond_wait(&changed, &lock);
    pthread_mutex_unlock(&lock);
    return OK;
}
CUresult cuEventElapsedTime(float *ms, void *start, void *end) {
    *ms = (float)((((Event *)end)->done_at - ((Event *)start)->done_at) * 1e3);
    return OK;
}

CUresult cuMemAlloc_v2(uint64_t *ptr, size_t len) {
    void *p = malloc(len);
    if (!p) return ERR_OUT_OF_MEMORY;
    memset(p, 0xAB, len); /* device memory starts as garbage */
    *ptr = (uint64_t)(uintptr_t)p;
    return OK;
}
CUresult cuMemFree_v2(uint64_t ptr) { free((void *)(uintptr_t)ptr); return OK; }
CUresult cuMemHostAlloc(void **p, size_t len, unsigned flags) {
    (void)flags;
    return posix_memalign(p, 4096, len) ? ERR_OUT_OF_MEMORY : OK;
}
CUresult cuMemFreeHost(void *p) { free(p); return OK; }
CUresult cuMemcpyHtoDAsync_v2(uint64_t dst, const void *src, size_t len, void *stream) {
    if (special(stream)) {
        memcpy((void *)(uintptr_t)dst, src, len);
        return OK;
    }
    Op *op = calloc(1, sizeof *op);
    op->kind = OP_COPY;
    op->dst = (void *)(uintptr_t)dst;
    op->src = src;
    op->len = len;
    pthread_mutex_lock(&lock);
    enqueue(stream, op);
    pthread_mutex_unlock(&lock);
    return OK;
}
CUresult cuMemcpyDtoH_v2(void *dst, uint64_t src, size_t len) {
    memcpy(dst, (const void *)(uintptr_t)src, len);
    return OK;
}
