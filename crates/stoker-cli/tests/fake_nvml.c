/* A stand-in libnvidia-ml.so.1 for `stoker monitor`'s tests on machines without a GPU.
 *
 * It implements the NVML calls the monitor makes (through nvml-wrapper, which loads the library
 * at run time) for STOKER_FAKE_NVML_GPUS devices (default 1) of 80 GiB on a gen4 x16 link. What
 * it reports is scripted:
 *   STOKER_FAKE_NVML_STATE=FILE  re-read at every call: "UTIL MEM_USED_BYTES PID RX_KBPS"
 *                                (utilisation 0-100; PID is listed as a compute process on GPU 0;
 *                                a missing field or file reads as 0). A test job writes its
 *                                "GPU step" into it, so the utilisation follows what the job does.
 *   STOKER_FAKE_NVML_UTIL=a,b,c  otherwise: utilisation values cycled through per call.
 * Build: cc -shared -fPIC -o DIR/libnvidia-ml.so.1 fake_nvml.c; run with LD_LIBRARY_PATH=DIR. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int nvmlReturn_t;
typedef struct fake_dev *nvmlDevice_t;
struct fake_dev { unsigned index; };
static struct fake_dev devs[8] = {{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}};

#define OK 0
#define INVALID_ARG 2
#define INSUFFICIENT_SIZE 7

typedef struct { unsigned gpu, memory; } nvmlUtilization_t;
typedef struct { unsigned version; unsigned long long total, reserved, free, used; } nvmlMemory_v2_t;
typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef struct { unsigned pid; unsigned long long usedGpuMemory; unsigned gpuInstanceId, computeInstanceId; } nvmlProcessInfo_t;

static const unsigned long long TOTAL = 80ULL << 30;

static unsigned count(void) {
    const char *s = getenv("STOKER_FAKE_NVML_GPUS");
    unsigned n = s ? (unsigned)atoi(s) : 1;
    return n > 8 ? 8 : n;
}

struct state { unsigned util; unsigned long long mem; unsigned pid; unsigned rx; };

static struct state read_state(void) {
    struct state st = {0, 0, 0, 0};
    const char *path = getenv("STOKER_FAKE_NVML_STATE");
    if (path) {
        FILE *f = fopen(path, "r");
        if (f) {
            if (fscanf(f, "%u %llu %u %u", &st.util, &st.mem, &st.pid, &st.rx) < 1) st.util = 0;
            fclose(f);
        }
        return st;
    }
    const char *seq = getenv("STOKER_FAKE_NVML_UTIL");
    if (seq && *seq) {
        static unsigned calls;
        unsigned n = 1;
        for (const char *p = seq; *p; p++) n += *p == ',';
        unsigned k = calls++ % n;
        const char *p = seq;
        while (k--) p = strchr(p, ',') + 1;
        st.util = (unsigned)atoi(p);
    }
    return st;
}

nvmlReturn_t nvmlInit_v2(void) { return OK; }
nvmlReturn_t nvmlInitWithFlags(unsigned flags) { (void)flags; return OK; }
nvmlReturn_t nvmlShutdown(void) { return OK; }
const char *nvmlErrorString(nvmlReturn_t r) { return r == OK ? "Success" : "fake NVML error"; }

nvmlReturn_t nvmlSystemGetDriverVersion(char *buf, unsigned len) {
    snprintf(buf, len, "999.99-fake");
    return OK;
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned *n) { *n = count(); return OK; }

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned i, nvmlDevice_t *d) {
    if (i >= count()) return INVALID_ARG;
    *d = &devs[i];
    return OK;
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t d, char *buf, unsigned len) {
    snprintf(buf, len, "Fake GPU %u", d->index);
    return OK;
}

nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t d, nvmlUtilization_t *u) {
    struct state st = read_state();
    u->gpu = d->index == 0 ? st.util : 0;
    u->memory = u->gpu / 2;
    return OK;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t d, nvmlMemory_v2_t *m) {
    struct state st = read_state();
    m->total = TOTAL;
    m->reserved = 0;
    m->used = d->index == 0 ? st.mem : 0;
    m->free = TOTAL - m->used;
    return OK;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t d, nvmlMemory_t *m) {
    struct state st = read_state();
    m->total = TOTAL;
    m->used = d->index == 0 ? st.mem : 0;
    m->free = TOTAL - m->used;
    return OK;
}

/* counter 0: TX (device to host), 1: RX (host to device); KB/s. */
nvmlReturn_t nvmlDeviceGetPcieThroughput(nvmlDevice_t d, int counter, unsigned *kbps) {
    struct state st = read_state();
    *kbps = (d->index == 0 && counter == 1) ? st.rx : 0;
    return OK;
}

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t d, unsigned *n, nvmlProcessInfo_t *infos) {
    struct state st = read_state();
    unsigned want = (d->index == 0 && st.pid != 0) ? 1 : 0;
    if (*n < want || (want && !infos)) {
        *n = want;
        return INSUFFICIENT_SIZE;
    }
    *n = want;
    if (want) {
        infos[0].pid = st.pid;
        infos[0].usedGpuMemory = st.mem;
        infos[0].gpuInstanceId = 0xFFFFFFFFu;
        infos[0].computeInstanceId = 0xFFFFFFFFu;
    }
    return OK;
}

nvmlReturn_t nvmlDeviceGetCurrPcieLinkGeneration(nvmlDevice_t d, unsigned *g) { (void)d; *g = 4; return OK; }
nvmlReturn_t nvmlDeviceGetCurrPcieLinkWidth(nvmlDevice_t d, unsigned *w) { (void)d; *w = 16; return OK; }
nvmlReturn_t nvmlDeviceGetMaxPcieLinkGeneration(nvmlDevice_t d, unsigned *g) { (void)d; *g = 4; return OK; }
nvmlReturn_t nvmlDeviceGetMaxPcieLinkWidth(nvmlDevice_t d, unsigned *w) { (void)d; *w = 16; return OK; }
