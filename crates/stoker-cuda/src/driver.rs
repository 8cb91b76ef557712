//! Thin owners of CUDA driver objects: the device's primary context, a stream, events, device
//! memory and page-locked host memory. Every raw driver call of stoker lives in this file, each
//! with its `// SAFETY:` argument; the rest of the crate uses the safe methods.
//!
//! The primary context is the one PyTorch and the CUDA runtime use, so device pointers, streams
//! and events are shared with them without translation. Calls made on a thread stoker does not
//! own (a Python thread dropping a tensor) bind the context only for the call and restore the
//! thread's previous context afterwards ([`CtxGuard`]).

use crate::CudaError;
use cudarc::driver::sys::{self, CUresult};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

static DEVICE_BYTES: AtomicU64 = AtomicU64::new(0);
static PINNED_BYTES: AtomicU64 = AtomicU64::new(0);

/// `(device bytes, page-locked host bytes)` currently allocated by stoker in this process.
pub fn memory_in_use() -> (u64, u64) {
    (DEVICE_BYTES.load(Ordering::Acquire), PINNED_BYTES.load(Ordering::Acquire))
}

/// `CU_STREAM_LEGACY`: the legacy default stream as a stream handle.
pub const STREAM_LEGACY: usize = 0x1;
/// `CU_STREAM_PER_THREAD`: the per-thread default stream as a stream handle.
pub const STREAM_PER_THREAD: usize = 0x2;

const CU_MEMHOSTALLOC_PORTABLE: u32 = 0x1;
const CU_EVENT_BLOCKING_SYNC: u32 = 0x1;
const CU_EVENT_DISABLE_TIMING: u32 = 0x2;
const CU_STREAM_NON_BLOCKING: u32 = 0x1;

/// Turns a driver status into an error naming the call.
pub(crate) fn check(r: CUresult, call: &str) -> Result<(), stoker::Error> {
    if r == CUresult::CUDA_SUCCESS {
        return Ok(());
    }
    let mut msg: *const std::ffi::c_char = std::ptr::null();
    // SAFETY: cuGetErrorString writes a pointer to a static string (or leaves it null).
    let text = unsafe {
        if sys::cuGetErrorString(r, &mut msg) == CUresult::CUDA_SUCCESS && !msg.is_null() {
            std::ffi::CStr::from_ptr(msg).to_string_lossy().into_owned()
        } else {
            String::new()
        }
    };
    Err(stoker::Error::Device(format!("{call} failed: {r:?} {text}")))
}

/// One GPU: its CUDA ordinal, name, PCI bus id and retained primary context.
///
/// The primary context is retained with `cuDevicePrimaryCtxRetain`, which does not touch the
/// calling thread's current context, and released on drop with `cuDevicePrimaryCtxRelease`,
/// which does not either (cudarc's `CudaContext` binds itself on creation and on drop, and
/// never restores what was current: that changed PyTorch's current device).
pub struct Gpu {
    ctx: sys::CUcontext,
    dev: sys::CUdevice,
    ordinal: u32,
    name: String,
    pci_bus_id: String,
    count: u32,
}

// SAFETY: a context handle may be used from any thread of the process; it is never mutated
// after `open`, and it stays valid until `drop` releases it.
unsafe impl Send for Gpu {}
// SAFETY: as above.
unsafe impl Sync for Gpu {}

impl std::fmt::Debug for Gpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gpu")
            .field("ordinal", &self.ordinal)
            .field("name", &self.name)
            .field("pci_bus_id", &self.pci_bus_id)
            .finish()
    }
}

/// A C string written by the driver into `buf`.
fn c_text(buf: &[std::ffi::c_char]) -> String {
    let bytes: Vec<u8> = buf.iter().take_while(|&&c| c != 0).map(|&c| c as u8).collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// Name and PCI bus id (`domain:bus:device.function`) of CUDA device `dev`; the driver must be
/// initialised (any successful `cuda_device_count`).
pub(crate) fn device_identity(dev: sys::CUdevice) -> Result<(String, String), stoker::Error> {
    let mut name = [0 as std::ffi::c_char; 256];
    // SAFETY: the driver is initialised; writes at most `len` bytes, NUL-terminated.
    check(unsafe { sys::cuDeviceGetName(name.as_mut_ptr(), name.len() as i32, dev) }, "cuDeviceGetName")?;
    let mut bus = [0 as std::ffi::c_char; 64];
    // SAFETY: as above.
    check(unsafe { sys::cuDeviceGetPCIBusId(bus.as_mut_ptr(), bus.len() as i32, dev) }, "cuDeviceGetPCIBusId")?;
    Ok((c_text(&name), c_text(&bus)))
}

/// The CUDA device of ordinal `ordinal` (the driver must be initialised).
pub(crate) fn device_handle(ordinal: u32) -> Result<sys::CUdevice, stoker::Error> {
    let mut dev: sys::CUdevice = 0;
    // SAFETY: the driver is initialised; writes one handle.
    check(unsafe { sys::cuDeviceGet(&mut dev, ordinal as i32) }, "cuDeviceGet")?;
    Ok(dev)
}

impl Gpu {
    /// Opens device `ordinal` (a CUDA ordinal: after `CUDA_VISIBLE_DEVICES`), retaining its
    /// primary context without making it current. Without a driver, or with fewer devices, the
    /// error says so; this never panics (cudarc's lazy loader is gated and caught).
    pub fn open(ordinal: u32) -> Result<Arc<Gpu>, CudaError> {
        // The gated driver check `probe` uses: the library, cuInit, the device count.
        let (_, count) = crate::cuda_device_count().map_err(CudaError::Unavailable)?;
        let count = count as u32;
        if count == 0 {
            return Err(CudaError::Unavailable("the driver reports no CUDA device".into()));
        }
        if ordinal >= count {
            return Err(CudaError::NoSuchDevice { ordinal, count });
        }
        let r = catch_unwind(AssertUnwindSafe(|| -> Result<Arc<Gpu>, stoker::Error> {
            let dev = device_handle(ordinal)?;
            let (name, pci_bus_id) = device_identity(dev)?;
            let mut ctx: sys::CUcontext = std::ptr::null_mut();
            // SAFETY: the driver is initialised and `dev` is valid; writes one handle. Retaining
            // does not change any thread's current context.
            check(unsafe { sys::cuDevicePrimaryCtxRetain(&mut ctx, dev) }, "cuDevicePrimaryCtxRetain")?;
            Ok(Arc::new(Gpu { ctx, dev, ordinal, name, pci_bus_id, count }))
        }));
        match r {
            Ok(Ok(gpu)) => Ok(gpu),
            Ok(Err(e)) => Err(CudaError::Unavailable(format!("cannot open cuda:{ordinal}: {e}"))),
            Err(_) => Err(CudaError::Unavailable(
                "libcuda lacks a required symbol (a stub or mismatched driver library)".into(),
            )),
        }
    }

    /// The CUDA ordinal.
    pub fn ordinal(&self) -> u32 {
        self.ordinal
    }

    /// The product name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The PCI bus id as CUDA reports it (`domain:bus:device.function`, hexadecimal).
    pub fn pci_bus_id(&self) -> &str {
        &self.pci_bus_id
    }

    /// Devices the driver sees.
    pub fn device_count(&self) -> u32 {
        self.count
    }

    /// Makes this GPU's context current on the calling thread until the guard is dropped,
    /// then restores whatever was current before (pushed on the thread's context stack and
    /// popped again, so the caller's stack is left exactly as it was).
    pub(crate) fn bind(&self) -> Result<CtxGuard, stoker::Error> {
        let mut prev: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: writes one context handle.
        check(unsafe { sys::cuCtxGetCurrent(&mut prev) }, "cuCtxGetCurrent")?;
        if prev == self.ctx {
            return Ok(CtxGuard { pushed: false, _not_send: std::marker::PhantomData });
        }
        // SAFETY: `self.ctx` is the retained primary context, alive as long as `self`.
        check(unsafe { sys::cuCtxPushCurrent_v2(self.ctx) }, "cuCtxPushCurrent")?;
        Ok(CtxGuard { pushed: true, _not_send: std::marker::PhantomData })
    }

    /// Makes this GPU's context current on the calling thread for good (threads stoker owns).
    pub(crate) fn bind_forever(&self) -> Result<(), stoker::Error> {
        // SAFETY: `self.ctx` is the retained primary context, alive as long as `self`.
        check(unsafe { sys::cuCtxSetCurrent(self.ctx) }, "cuCtxSetCurrent")
    }

    /// Waits until every stream of this context is idle.
    pub(crate) fn synchronize(&self) -> Result<(), stoker::Error> {
        let _g = self.bind()?;
        // SAFETY: a context is current (bound above).
        check(unsafe { sys::cuCtxSynchronize() }, "cuCtxSynchronize")
    }
}

impl Drop for Gpu {
    fn drop(&mut self) {
        // SAFETY: retained once in `open`, released once here; releasing does not change the
        // calling thread's current context.
        let _ = unsafe { sys::cuDevicePrimaryCtxRelease_v2(self.dev) };
    }
}

/// Restores the thread's previous context on drop (pops what [`Gpu::bind`] pushed).
pub(crate) struct CtxGuard {
    pushed: bool,
    /// A context stack is per thread: the guard must be dropped where it was made.
    _not_send: std::marker::PhantomData<*const ()>,
}

impl Drop for CtxGuard {
    fn drop(&mut self) {
        if self.pushed {
            let mut popped: sys::CUcontext = std::ptr::null_mut();
            // SAFETY: `bind` pushed one context on this thread's stack (guards are not Send,
            // so this runs on the same thread); popping it restores the caller's.
            let _ = unsafe { sys::cuCtxPopCurrent_v2(&mut popped) };
        }
    }
}

/// A non-blocking stream owned by stoker (no implicit synchronisation with stream 0).
pub(crate) struct Stream {
    raw: sys::CUstream,
    gpu: Arc<Gpu>,
}

// SAFETY: a stream handle may be used from any thread of the process (CUDA is thread-safe).
unsafe impl Send for Stream {}
// SAFETY: as above; the handle is never mutated.
unsafe impl Sync for Stream {}

impl Stream {
    pub(crate) fn new(gpu: &Arc<Gpu>) -> Result<Self, stoker::Error> {
        let _g = gpu.bind()?;
        let mut raw: sys::CUstream = std::ptr::null_mut();
        // SAFETY: a context is current; writes one handle.
        check(unsafe { sys::cuStreamCreate(&mut raw, CU_STREAM_NON_BLOCKING) }, "cuStreamCreate")?;
        Ok(Stream { raw, gpu: gpu.clone() })
    }

    pub(crate) fn raw(&self) -> sys::CUstream {
        self.raw
    }

    pub(crate) fn synchronize(&self) -> Result<(), stoker::Error> {
        // SAFETY: the stream is alive (owned by self).
        check(unsafe { sys::cuStreamSynchronize(self.raw) }, "cuStreamSynchronize")
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        if let Ok(_g) = self.gpu.bind() {
            // SAFETY: the stream is ours and destroyed once; pending work completes first
            // (cuStreamDestroy returns at once and releases the stream when its work is done).
            unsafe {
                let _ = sys::cuStreamSynchronize(self.raw);
                let _ = sys::cuStreamDestroy_v2(self.raw);
            }
        }
    }
}

/// A CUDA event. `timing` events can measure elapsed time; all of them block (rather than
/// spin) a host thread that synchronises on them.
pub(crate) struct Event {
    raw: sys::CUevent,
    gpu: Arc<Gpu>,
}

// SAFETY: event handles may be used from any thread.
unsafe impl Send for Event {}
// SAFETY: as above.
unsafe impl Sync for Event {}

impl Event {
    pub(crate) fn new(gpu: &Arc<Gpu>, timing: bool) -> Result<Self, stoker::Error> {
        let _g = gpu.bind()?;
        let flags = CU_EVENT_BLOCKING_SYNC | if timing { 0 } else { CU_EVENT_DISABLE_TIMING };
        let mut raw: sys::CUevent = std::ptr::null_mut();
        // SAFETY: a context is current; writes one handle.
        check(unsafe { sys::cuEventCreate(&mut raw, flags) }, "cuEventCreate")?;
        Ok(Event { raw, gpu: gpu.clone() })
    }

    /// Records the event on `stream` (a stoker stream or a consumer's raw handle).
    pub(crate) fn record(&self, stream: sys::CUstream) -> Result<(), stoker::Error> {
        let _g = self.gpu.bind()?;
        // SAFETY: the event is alive; the stream handle is a live stream of this context (or a
        // special handle such as CU_STREAM_LEGACY), per the callers.
        check(unsafe { sys::cuEventRecord(self.raw, stream) }, "cuEventRecord")
    }

    /// Makes `stream` wait (on the GPU) until the work captured by this event is done.
    pub(crate) fn wait_on(&self, stream: sys::CUstream) -> Result<(), stoker::Error> {
        let _g = self.gpu.bind()?;
        // SAFETY: the event is alive; the stream handle comes from the consumer (checked to be
        // non-null by the caller, or a special handle).
        check(unsafe { sys::cuStreamWaitEvent(stream, self.raw, 0) }, "cuStreamWaitEvent")
    }

    /// Whether the captured work is done (`Ok(false)`: not yet).
    pub(crate) fn is_done(&self) -> Result<bool, stoker::Error> {
        // SAFETY: the event is alive.
        match unsafe { sys::cuEventQuery(self.raw) } {
            CUresult::CUDA_SUCCESS => Ok(true),
            CUresult::CUDA_ERROR_NOT_READY => Ok(false),
            r => check(r, "cuEventQuery").map(|_| false),
        }
    }

    pub(crate) fn synchronize(&self) -> Result<(), stoker::Error> {
        // SAFETY: the event is alive.
        check(unsafe { sys::cuEventSynchronize(self.raw) }, "cuEventSynchronize")
    }

    /// Milliseconds between `start` and `self` (both timing events, both completed).
    pub(crate) fn elapsed_since(&self, start: &Event) -> Result<f32, stoker::Error> {
        let mut ms = 0f32;
        // SAFETY: both events are alive and were created with timing enabled.
        check(unsafe { sys::cuEventElapsedTime(&mut ms, start.raw, self.raw) }, "cuEventElapsedTime")?;
        Ok(ms)
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        if let Ok(_g) = self.gpu.bind() {
            // SAFETY: ours, destroyed once (an incomplete event is released when it completes).
            let _ = unsafe { sys::cuEventDestroy_v2(self.raw) };
        }
    }
}

/// Device memory from `cuMemAlloc`, freed on drop.
pub(crate) struct DeviceMem {
    ptr: sys::CUdeviceptr,
    len: usize,
    gpu: Arc<Gpu>,
}

impl DeviceMem {
    pub(crate) fn new(gpu: &Arc<Gpu>, len: usize) -> Result<Self, stoker::Error> {
        let _g = gpu.bind()?;
        let mut ptr: sys::CUdeviceptr = 0;
        // SAFETY: a context is current; writes one device pointer.
        check(unsafe { sys::cuMemAlloc_v2(&mut ptr, len.max(1)) }, "cuMemAlloc").map_err(|e| {
            stoker::Error::Device(format!(
                "cannot allocate {len} bytes on cuda:{} ({e}); lower prefetch, batch_size or memory_limit",
                gpu.ordinal
            ))
        })?;
        DEVICE_BYTES.fetch_add(len.max(1) as u64, Ordering::AcqRel);
        Ok(DeviceMem { ptr, len, gpu: gpu.clone() })
    }

    pub(crate) fn ptr(&self) -> u64 {
        self.ptr
    }

    /// Bytes allocated.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Copies the first `dst.len()` bytes of this buffer to the host (synchronous; the caller
    /// has waited for the copy that filled it).
    pub(crate) fn read_into(&self, dst: &mut [u8]) -> Result<(), stoker::Error> {
        if dst.len() > self.len {
            return Err(stoker::Error::Internal(format!("read of {} bytes from a buffer of {}", dst.len(), self.len)));
        }
        let _g = self.gpu.bind()?;
        // SAFETY: both ranges are in bounds and `dst` is a live, exclusive host slice.
        check(unsafe { sys::cuMemcpyDtoH_v2(dst.as_mut_ptr().cast(), self.ptr, dst.len()) }, "cuMemcpyDtoH")
    }

    /// Enqueues a copy of `len` bytes from host `src` into this buffer on `stream`.
    ///
    /// # Safety
    /// `src..src + len` must stay valid and unmodified until the copy completes (the caller
    /// waits on an event recorded after it); for an asynchronous copy it should be page-locked.
    pub(crate) unsafe fn copy_from_host(
        &self,
        src: *const u8,
        len: usize,
        stream: &Stream,
    ) -> Result<(), stoker::Error> {
        if len > self.len {
            return Err(stoker::Error::Internal(format!("copy of {len} bytes into a device buffer of {}", self.len)));
        }
        // SAFETY: destination in bounds (checked); source validity per the caller's contract;
        // the stream is alive.
        check(unsafe { sys::cuMemcpyHtoDAsync_v2(self.ptr, src.cast(), len, stream.raw()) }, "cuMemcpyHtoDAsync")
    }
}

impl Drop for DeviceMem {
    fn drop(&mut self) {
        if let Ok(_g) = self.gpu.bind() {
            // SAFETY: allocated by cuMemAlloc in `new`, freed once; callers make sure no pending
            // GPU work reads it (release events are waited for before a slot is dropped).
            let _ = unsafe { sys::cuMemFree_v2(self.ptr) };
        }
        DEVICE_BYTES.fetch_sub(self.len.max(1) as u64, Ordering::AcqRel);
    }
}

/// Enqueues a copy of `len` bytes from host `src` to device address `dst` on `stream`.
///
/// # Safety
/// `dst..dst + len` must be device memory of the stream's context that stays allocated until
/// the copy completes; `src..src + len` must stay valid and unmodified until then.
pub(crate) unsafe fn copy_to_device(
    dst: u64,
    src: *const u8,
    len: usize,
    stream: &Stream,
) -> Result<(), stoker::Error> {
    // SAFETY: per the caller's contract; the stream is alive.
    check(unsafe { sys::cuMemcpyHtoDAsync_v2(dst, src.cast(), len, stream.raw()) }, "cuMemcpyHtoDAsync")
}

/// Page-locked host memory from `cuMemHostAlloc` (portable, not write-combined: the CPU reads
/// it at normal speed), zeroed, freed on drop.
pub(crate) struct PinnedMem {
    ptr: std::ptr::NonNull<u8>,
    len: usize,
    gpu: Arc<Gpu>,
}

// SAFETY: plain host memory usable from any thread.
unsafe impl Send for PinnedMem {}
// SAFETY: `&PinnedMem` only exposes the pointer; access is coordinated by the pool's users.
unsafe impl Sync for PinnedMem {}

impl PinnedMem {
    pub(crate) fn new(gpu: &Arc<Gpu>, len: usize) -> Result<Self, stoker::Error> {
        let _g = gpu.bind()?;
        let mut p: *mut std::ffi::c_void = std::ptr::null_mut();
        // SAFETY: a context is current; writes one pointer.
        check(unsafe { sys::cuMemHostAlloc(&mut p, len.max(1), CU_MEMHOSTALLOC_PORTABLE) }, "cuMemHostAlloc").map_err(
            |e| {
                stoker::Error::Memory(format!(
                    "cannot page-lock {len} bytes of host memory ({e}); lower prefetch, batch_size or memory_limit"
                ))
            },
        )?;
        let ptr = std::ptr::NonNull::new(p.cast::<u8>())
            .ok_or_else(|| stoker::Error::Device("cuMemHostAlloc returned null".into()))?;
        // SAFETY: `len` bytes were just allocated at `ptr` and nothing else refers to them.
        unsafe { std::ptr::write_bytes(ptr.as_ptr(), 0, len) };
        PINNED_BYTES.fetch_add(len.max(1) as u64, Ordering::AcqRel);
        Ok(PinnedMem { ptr, len, gpu: gpu.clone() })
    }

    pub(crate) fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }
}

// SAFETY: zeroed in `new`, page-aligned by the driver (so ALIGN-aligned; checked again by the
// pool), stable until drop, usable from any thread.
unsafe impl stoker::buffer::HostMemory for PinnedMem {
    fn ptr(&self) -> std::ptr::NonNull<u8> {
        self.ptr
    }
    fn len(&self) -> usize {
        self.len
    }
}

impl Drop for PinnedMem {
    fn drop(&mut self) {
        if let Ok(_g) = self.gpu.bind() {
            // SAFETY: allocated by cuMemHostAlloc, freed once; copies from it have completed
            // (the transfer stage waits for each copy's event before releasing a host buffer).
            let _ = unsafe { sys::cuMemFreeHost(self.ptr.as_ptr().cast()) };
        }
        PINNED_BYTES.fetch_sub(self.len.max(1) as u64, Ordering::AcqRel);
    }
}

/// A module of device code loaded from PTX (`cuModuleLoadData`: the driver compiles it for
/// this GPU), and one kernel of it. Unloaded on drop.
pub(crate) struct Kernel {
    module: sys::CUmodule,
    function: sys::CUfunction,
    gpu: Arc<Gpu>,
}

// SAFETY: module and function handles may be used from any thread of the context's process;
// they are never mutated after `load`.
unsafe impl Send for Kernel {}
// SAFETY: as above.
unsafe impl Sync for Kernel {}

impl Kernel {
    /// Loads `ptx` (NUL-terminated text) on `gpu` and finds the kernel `name`.
    pub(crate) fn load(gpu: &Arc<Gpu>, ptx: &std::ffi::CStr, name: &std::ffi::CStr) -> Result<Self, stoker::Error> {
        let _g = gpu.bind()?;
        let mut module: sys::CUmodule = std::ptr::null_mut();
        // SAFETY: a context is current; `ptx` is a NUL-terminated PTX text that outlives the
        // call (the driver copies what it needs); writes one handle.
        check(unsafe { sys::cuModuleLoadData(&mut module, ptx.as_ptr().cast()) }, "cuModuleLoadData")?;
        let mut function: sys::CUfunction = std::ptr::null_mut();
        // SAFETY: `module` was just loaded; `name` is NUL-terminated; writes one handle.
        let found =
            check(unsafe { sys::cuModuleGetFunction(&mut function, module, name.as_ptr()) }, "cuModuleGetFunction");
        let kernel = Kernel { module, function, gpu: gpu.clone() };
        found.map(|()| kernel)
    }

    /// Enqueues the kernel on `stream` over `grid` blocks of `block` threads, with one
    /// by-value parameter `param`.
    ///
    /// # Safety
    /// `P` must be the kernel's one parameter type, laid out as the device code declares it,
    /// and every device address in it must stay valid until the launch completes.
    pub(crate) unsafe fn launch<P>(
        &self,
        grid: [u32; 2],
        block: [u32; 2],
        param: &P,
        stream: &Stream,
    ) -> Result<(), stoker::Error> {
        let mut args = [(param as *const P).cast_mut().cast::<std::ffi::c_void>()];
        // SAFETY: the function is alive; the argument array holds one pointer to a value of
        // the kernel's parameter type (the caller's contract), which the driver copies before
        // returning; the stream is alive.
        check(
            unsafe {
                sys::cuLaunchKernel(
                    self.function,
                    grid[0],
                    grid[1],
                    1,
                    block[0],
                    block[1],
                    1,
                    0,
                    stream.raw(),
                    args.as_mut_ptr(),
                    std::ptr::null_mut(),
                )
            },
            "cuLaunchKernel",
        )
    }
}

impl Drop for Kernel {
    fn drop(&mut self) {
        if let Ok(_g) = self.gpu.bind() {
            // SAFETY: loaded in `load`, unloaded once; the owner synchronised its stream.
            let _ = unsafe { sys::cuModuleUnload(self.module) };
        }
    }
}
