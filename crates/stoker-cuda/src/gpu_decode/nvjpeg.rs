//! nvJPEG, loaded at run time like libcuda (no link-time CUDA): the library, its handles and
//! the two decode calls stoker makes. Every raw nvJPEG call of stoker lives in this file, each
//! with its `// SAFETY:` argument.
//!
//! Two handles: the hardware backend (the JPEG engines of A100, H100, H200, ...) decodes a
//! batch with `nvjpegDecodeBatched`; where the GPU has no engine, or the engine refuses a batch,
//! the default backend (GPU-assisted hybrid) decodes image by image with `nvjpegDecode`.

use libloading::Library;
use std::ffi::c_void;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};

type Status = i32;
type Handle = *mut c_void;
type State = *mut c_void;

const BACKEND_DEFAULT: i32 = 0;
const BACKEND_HARDWARE: i32 = 3;
/// `NVJPEG_OUTPUT_RGBI`: interleaved RGB8.
const OUTPUT_RGBI: i32 = 5;

/// `nvjpegImage_t`: up to four planes and their pitches (RGBI uses the first).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub(crate) struct Image {
    pub(crate) channel: [*mut u8; 4],
    pub(crate) pitch: [usize; 4],
}

impl Image {
    /// Interleaved RGB8 rows of `pitch` bytes at device address `ptr`.
    pub(crate) fn rgbi(ptr: u64, pitch: usize) -> Self {
        let null = std::ptr::null_mut();
        Image { channel: [ptr as *mut u8, null, null, null], pitch: [pitch, 0, 0, 0] }
    }
}

/// The entry points stoker uses, resolved once.
struct Api {
    create_ex: unsafe extern "C" fn(i32, *mut c_void, *mut c_void, u32, *mut Handle) -> Status,
    destroy: unsafe extern "C" fn(Handle) -> Status,
    state_create: unsafe extern "C" fn(Handle, *mut State) -> Status,
    state_destroy: unsafe extern "C" fn(State) -> Status,
    batched_init: unsafe extern "C" fn(Handle, State, i32, i32, i32) -> Status,
    batched: unsafe extern "C" fn(Handle, State, *const *const u8, *const usize, *mut Image, *mut c_void) -> Status,
    decode: unsafe extern "C" fn(Handle, State, *const u8, usize, i32, *mut Image, *mut c_void) -> Status,
    get_property: unsafe extern "C" fn(i32, *mut i32) -> Status,
    /// Where the library was found.
    path: String,
    /// Kept loaded for the process's life (the function pointers above point into it).
    _lib: Library,
}

static CANDIDATES: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());
static API: OnceLock<Result<Arc<Api>, String>> = OnceLock::new();

/// Further places to look for libnvjpeg before the system's library path (the Python front
/// passes the copies that PyTorch's and torchvision's wheels install). Only calls made before
/// the library is first loaded count.
pub fn add_candidates(paths: impl IntoIterator<Item = PathBuf>) {
    CANDIDATES.lock().unwrap_or_else(|p| p.into_inner()).extend(paths);
}

/// The sonames tried after the candidates, newest first.
const SONAMES: [&str; 4] = ["libnvjpeg.so.13", "libnvjpeg.so.12", "libnvjpeg.so.11", "libnvjpeg.so"];

fn api() -> Result<Arc<Api>, String> {
    API.get_or_init(|| {
        let mut tried = Vec::new();
        let candidates = CANDIDATES.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let names = candidates.into_iter().map(|p| p.into_os_string()).chain(SONAMES.iter().map(|s| s.into()));
        for name in names {
            // SAFETY: loading a shared library runs its initialisers; libnvjpeg's only set up
            // its own state. The library is kept loaded for the process's life.
            match unsafe { Library::new(&name) } {
                Ok(lib) => return resolve(lib, name.to_string_lossy().into_owned()).map(Arc::new),
                Err(e) => tried.push(format!("{}: {e}", name.to_string_lossy())),
            }
        }
        Err(format!("libnvjpeg was not found (tried {})", tried.join("; ")))
    })
    .clone()
}

fn resolve(lib: Library, path: String) -> Result<Api, String> {
    macro_rules! sym {
        ($name:literal) => {
            // SAFETY: the symbol is nvJPEG's documented C function of this name, and the field
            // it is stored in has that function's signature (nvjpeg.h).
            *unsafe { lib.get(concat!($name, "\0").as_bytes()) }
                .map_err(|e| format!("{path} lacks {} ({e}): not a usable libnvjpeg", $name))?
        };
    }
    Ok(Api {
        create_ex: sym!("nvjpegCreateEx"),
        destroy: sym!("nvjpegDestroy"),
        state_create: sym!("nvjpegJpegStateCreate"),
        state_destroy: sym!("nvjpegJpegStateDestroy"),
        batched_init: sym!("nvjpegDecodeBatchedInitialize"),
        batched: sym!("nvjpegDecodeBatched"),
        decode: sym!("nvjpegDecode"),
        get_property: sym!("nvjpegGetProperty"),
        path: path.clone(),
        _lib: lib,
    })
}

/// nvJPEG's name for a status.
fn status_name(s: Status) -> &'static str {
    match s {
        0 => "NVJPEG_STATUS_SUCCESS",
        1 => "NVJPEG_STATUS_NOT_INITIALIZED",
        2 => "NVJPEG_STATUS_INVALID_PARAMETER",
        3 => "NVJPEG_STATUS_BAD_JPEG",
        4 => "NVJPEG_STATUS_JPEG_NOT_SUPPORTED",
        5 => "NVJPEG_STATUS_ALLOCATOR_FAILURE",
        6 => "NVJPEG_STATUS_EXECUTION_FAILED",
        7 => "NVJPEG_STATUS_ARCH_MISMATCH",
        8 => "NVJPEG_STATUS_INTERNAL_ERROR",
        9 => "NVJPEG_STATUS_IMPLEMENTATION_NOT_SUPPORTED",
        10 => "NVJPEG_STATUS_INCOMPLETE_BITSTREAM",
        _ => "an unknown nvJPEG status",
    }
}

fn check(s: Status, call: &str) -> Result<(), String> {
    if s == 0 {
        Ok(())
    } else {
        Err(format!("{call} failed: {} ({s})", status_name(s)))
    }
}

/// What `stoker doctor` says of nvJPEG: the library's path and version, or why it is not
/// usable.
pub fn describe() -> Result<(String, String), String> {
    let api = api()?;
    let mut v = [0i32; 3];
    for (k, out) in v.iter_mut().enumerate() {
        // SAFETY: `nvjpegGetProperty(MAJOR_VERSION=0 | MINOR_VERSION=1 | PATCH_LEVEL=2, int*)`
        // writes one int; it needs no handle or GPU.
        check(unsafe { (api.get_property)(k as i32, out) }, "nvjpegGetProperty")?;
    }
    Ok((api.path.clone(), format!("{}.{}.{}", v[0], v[1], v[2])))
}

/// One handle and its decode state.
struct Backend {
    handle: Handle,
    state: State,
    /// The batch size `nvjpegDecodeBatchedInitialize` was last called with.
    batch: i32,
}

/// nvJPEG on one GPU: the hardware backend when the GPU has JPEG engines, and the default one.
/// Used by one thread at a time (the transfer thread); the caller binds the GPU's context.
pub(crate) struct NvJpeg {
    api: Arc<Api>,
    hardware: Option<Backend>,
    default: Backend,
}

// SAFETY: nvJPEG handles and states may be used from any thread, one call at a time; `NvJpeg`
// is only reached through `&mut` (one thread at a time).
unsafe impl Send for NvJpeg {}

impl NvJpeg {
    /// Opens nvJPEG's backends (the GPU's context must be current on this thread).
    pub(crate) fn new() -> Result<Self, String> {
        let api = api()?;
        let open = |backend: i32| -> Result<Backend, String> {
            let mut handle: Handle = std::ptr::null_mut();
            let null = std::ptr::null_mut();
            // SAFETY: null allocators select nvJPEG's own; writes one handle.
            let r = unsafe { (api.create_ex)(backend, null, null, 0, &mut handle) };
            check(r, "nvjpegCreateEx")?;
            let mut state: State = std::ptr::null_mut();
            // SAFETY: `handle` was just created; writes one state.
            if let Err(e) = check(unsafe { (api.state_create)(handle, &mut state) }, "nvjpegJpegStateCreate") {
                // SAFETY: created above, destroyed once.
                unsafe { (api.destroy)(handle) };
                return Err(e);
            }
            Ok(Backend { handle, state, batch: 0 })
        };
        // No JPEG engine (or an older library): NVJPEG_STATUS_ARCH_MISMATCH or NOT_SUPPORTED.
        let hardware = open(BACKEND_HARDWARE).ok();
        let default = open(BACKEND_DEFAULT)?;
        Ok(NvJpeg { api, hardware, default })
    }

    /// Which backend decodes batches: `hardware` or `default`.
    pub(crate) fn backend(&self) -> &'static str {
        if self.hardware.is_some() {
            "hardware"
        } else {
            "default"
        }
    }

    /// Decodes `jpegs` into `out` (RGBI device images sized for each) on `stream`: one
    /// batched call on the hardware backend when there is one and it takes the batch, else one
    /// call per image on the default backend. Returns the images nvJPEG refused, with why.
    ///
    /// # Safety
    /// Every `out` image must address device memory of at least `pitch * height` bytes for its
    /// JPEG's height, valid until the stream has passed this work; `stream` must be a live
    /// stream of the current context, and the `jpegs` stay valid until this returns.
    pub(crate) unsafe fn decode(
        &mut self,
        jpegs: &[&[u8]],
        out: &mut [Image],
        stream: *mut c_void,
    ) -> Vec<(usize, String)> {
        let n = jpegs.len();
        if n == 0 {
            return vec![];
        }
        if let Some(hw) = &mut self.hardware {
            let ptrs: Vec<*const u8> = jpegs.iter().map(|j| j.as_ptr()).collect();
            let lens: Vec<usize> = jpegs.iter().map(|j| j.len()).collect();
            let mut ok = true;
            if hw.batch != n as i32 {
                // SAFETY: handle and state are alive; one CPU thread for the host stages.
                let r = unsafe { (self.api.batched_init)(hw.handle, hw.state, n as i32, 1, OUTPUT_RGBI) };
                ok = check(r, "nvjpegDecodeBatchedInitialize").is_ok();
                hw.batch = if ok { n as i32 } else { 0 };
            }
            if ok {
                let (p, l, o) = (ptrs.as_ptr(), lens.as_ptr(), out.as_mut_ptr());
                // SAFETY: `n` pointers, lengths and output images, valid per the caller's
                // contract.
                let r = unsafe { (self.api.batched)(hw.handle, hw.state, p, l, o, stream) };
                if check(r, "nvjpegDecodeBatched").is_ok() {
                    return vec![];
                }
            }
        }
        let mut refused = vec![];
        for (i, (jpeg, img)) in jpegs.iter().zip(out.iter_mut()).enumerate() {
            let d = &self.default;
            let (p, len) = (jpeg.as_ptr(), jpeg.len());
            // SAFETY: one JPEG and one output image, valid per the caller's contract.
            let r = unsafe { (self.api.decode)(d.handle, d.state, p, len, OUTPUT_RGBI, img, stream) };
            if let Err(e) = check(r, "nvjpegDecode") {
                refused.push((i, e));
            }
        }
        refused
    }
}

impl Drop for NvJpeg {
    fn drop(&mut self) {
        for b in self.hardware.iter().chain(std::iter::once(&self.default)) {
            // SAFETY: created in `new`, destroyed once; the owner synchronised the stream.
            unsafe {
                (self.api.state_destroy)(b.state);
                (self.api.destroy)(b.handle);
            }
        }
    }
}
