//! The transfer stage end to end through `stoker bench --device`, against a stand-in driver
//! (`fake_cuda.c`, built here with the system C compiler) that runs copies later on a worker
//! thread per stream. A host buffer reused before its copy completed, a copy into a slot the
//! consumer still holds, or lost batches would change the digest read back from "device" memory.
//! This checks stoker's ordering and bookkeeping in CI; it says nothing about a real GPU, which
//! `tests/gpu` covers on a GPU machine. The stand-in also models several devices behind
//! `CUDA_VISIBLE_DEVICES`, running out of device memory and a sticky driver error; the Python
//! side of those (context restoration, device choice, default-stream ordering) is in
//! `tests/python/test_fake_driver.py`.
//!
//! GPU decode runs against the stand-in driver and a stand-in libnvjpeg (`fake_nvjpeg.c`),
//! which serves the pixels libjpeg-turbo gives for each JPEG (decoded here beforehand) and runs
//! stoker's resampler kernel from its own source: the GPU-decoded batches must then be the CPU
//! path's, byte for byte.

use std::path::{Path, PathBuf};
use std::process::Command;

fn stoker() -> Command {
    Command::new(env!("CARGO_BIN_EXE_stoker"))
}

/// Builds the fake libcuda.so into `dir`; `None` (with the reason printed) when no C compiler.
fn build_fake_driver(dir: &Path) -> Option<PathBuf> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fake_cuda.c");
    let lib = dir.join("libcuda.so");
    for cc in ["cc", "gcc"] {
        let out = Command::new(cc)
            .args(["-shared", "-fPIC", "-O1", "-ffp-contract=off", "-pthread", "-o"])
            .arg(&lib)
            .arg(&src)
            .arg("-lm")
            .output();
        match out {
            Ok(o) if o.status.success() => return Some(lib),
            Ok(o) => panic!("{cc} failed to build the fake driver: {}", String::from_utf8_lossy(&o.stderr)),
            Err(_) => continue,
        }
    }
    eprintln!("skipped: no C compiler (cc/gcc) to build the fake CUDA driver");
    None
}

/// The stand-in driver and a demo dataset of `images` JPEGs under `tmp`: `(libcuda path, root)`;
/// `None` (with the reason printed) when no C compiler is here.
fn driver_and_demo(tmp: &Path, images: usize) -> Option<(PathBuf, PathBuf)> {
    let lib = build_fake_driver(tmp)?;
    let root = tmp.join("demo");
    let st =
        stoker().args(["demo", "--images", &images.to_string(), "--no-bench", "--out"]).arg(&root).status().unwrap();
    assert!(st.success());
    Some((lib, root))
}

fn bench_json(root: &Path, lib_dir: Option<&Path>, extra: &[&str]) -> Result<serde_json::Value, String> {
    let mut cmd = stoker();
    cmd.arg("bench").arg(root).args(["--json", "--epochs", "2", "--batch-size", "16", "--threads", "2"]);
    cmd.args(["--preset", "imagenet-train", "--dtype", "uint8"]).args(extra);
    if let Some(d) = lib_dir {
        cmd.env("LD_LIBRARY_PATH", d);
    }
    let out = cmd.output().expect("run stoker");
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    Ok(serde_json::from_slice(&out.stdout).expect("bench --json prints JSON"))
}

#[test]
fn device_batches_read_back_equal_host_batches_through_a_slow_asynchronous_driver() {
    let tmp = tempfile::tempdir().unwrap();
    let Some((lib, root)) = driver_and_demo(tmp.path(), 150) else { return };
    let lib_dir = lib.parent().unwrap();

    let host = bench_json(&root, None, &["--device", "cpu"]).unwrap();
    for prefetch in ["1", "3"] {
        let dev = bench_json(&root, Some(lib_dir), &["--device", "cuda", "--prefetch", prefetch]).unwrap();
        assert_eq!(dev["digest"], host["digest"], "prefetch {prefetch}: bytes on the device differ from the host's");
        assert_eq!(dev["images"], host["images"]);
        assert_eq!(dev["batches"], host["batches"]);
        assert_eq!(dev["device"]["used"], "cuda:0");
        let batches = dev["batches"].as_u64().unwrap();
        let t = &dev["transfer"];
        // The transfer thread has finished (and counted every copy) when the iteration ends.
        assert_eq!(t["batches"].as_u64().unwrap(), batches, "{t}");
        // uint8 crosses the bus: 3*224*224 bytes per image plus an 8-byte label.
        let images = dev["images"].as_u64().unwrap();
        assert!(t["bytes"].as_u64().unwrap() <= images * (3 * 224 * 224 + 8), "{t}");
        assert!(dev["stages"].as_array().unwrap().iter().any(|s| s["name"] == "transfer"));
    }

    // `auto` finds the (fake) device; `cuda:1` does not exist; without the library, `cuda` is a
    // clear error and `auto` falls back with a note.
    let auto = bench_json(&root, Some(lib_dir), &["--device", "auto", "--no-digest"]).unwrap();
    assert_eq!(auto["device"]["used"], "cuda:0");
    let e = bench_json(&root, Some(lib_dir), &["--device", "cuda:1"]).unwrap_err();
    assert!(e.contains("cuda:1 was asked for, but the driver sees 1 device(s)"), "{e}");
    let e = bench_json(&root, None, &["--device", "cuda"]).unwrap_err();
    assert!(e.contains("needs CUDA, which is not available"), "{e}");
    let fallback = bench_json(&root, None, &["--device", "auto", "--no-digest"]).unwrap();
    assert_eq!(fallback["device"]["used"], "cpu");
    assert!(fallback["device"]["note"].as_str().unwrap().contains("no usable GPU"));
    assert!(fallback["transfer"].is_null());
}

#[test]
fn doctor_measures_bandwidth_when_a_driver_answers() {
    let tmp = tempfile::tempdir().unwrap();
    let Some(lib) = build_fake_driver(tmp.path()) else { return };
    let out = stoker().args(["doctor", "--json"]).env("LD_LIBRARY_PATH", lib.parent().unwrap()).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let gpus = v["gpus"].as_array().unwrap();
    assert_eq!(gpus.len(), 1, "{v}");
    assert!(gpus[0]["h2d_pinned_gbps"].as_f64().unwrap() > 0.0, "{v}");
    assert!(gpus[0]["h2d_pageable_gbps"].as_f64().unwrap() > 0.0, "{v}");
}

/// Runs `cmd` to completion, or kills it after `secs` and fails (nothing may hang).
fn output_within(mut cmd: Command, secs: u64) -> std::process::Output {
    use std::process::Stdio;
    let mut child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("start stoker");
    let t0 = std::time::Instant::now();
    while child.try_wait().expect("wait").is_none() {
        if t0.elapsed().as_secs() > secs {
            let _ = child.kill();
            panic!("stoker did not finish within {secs} s");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    child.wait_with_output().expect("collect output")
}

#[test]
fn doctor_lists_cuda_ordinals_after_cuda_visible_devices() {
    let tmp = tempfile::tempdir().unwrap();
    let Some(lib) = build_fake_driver(tmp.path()) else { return };
    let mut cmd = stoker();
    cmd.args(["doctor", "--json", "--no-bandwidth"]).env("LD_LIBRARY_PATH", lib.parent().unwrap());
    cmd.env("FAKE_CUDA_DEVICES", "4").env("CUDA_VISIBLE_DEVICES", "3,1");
    let out = output_within(cmd, 60);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let gpus = v["gpus"].as_array().unwrap();
    // CUDA renumbers the visible devices from 0; the bus id says which physical GPU each is.
    let ids: Vec<_> = gpus.iter().map(|g| (g["index"].as_u64().unwrap(), g["pci_bus_id"].as_str().unwrap())).collect();
    assert_eq!(ids, [(0, "0000:13:00.0"), (1, "0000:11:00.0")], "{v}");
}

#[test]
fn out_of_device_memory_and_a_sticky_error_are_clear_errors() {
    let tmp = tempfile::tempdir().unwrap();
    let Some((lib, root)) = driver_and_demo(tmp.path(), 100) else { return };
    let bench = |env: (&str, &str)| {
        let mut cmd = stoker();
        cmd.arg("bench").arg(&root).args(["--json", "--epochs", "1", "--batch-size", "16", "--threads", "2"]);
        cmd.args(["--preset", "imagenet-val", "--dtype", "uint8", "--device", "cuda"]);
        cmd.env("LD_LIBRARY_PATH", lib.parent().unwrap()).env("FAKE_CUDA_COPY_DELAY_US", "2000").env(env.0, env.1);
        output_within(cmd, 120)
    };
    let out = bench(("FAKE_CUDA_MEM_LIMIT", "1000000"));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("cannot allocate") && err.contains("out of memory"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    let out = bench(("FAKE_CUDA_STICKY_AFTER", "6"));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("illegal memory access"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn bench_device_cuda_is_this_ranks_gpu_under_torchrun() {
    let tmp = tempfile::tempdir().unwrap();
    let Some((lib, root)) = driver_and_demo(tmp.path(), 20) else { return };
    let used = |local_rank: &str| {
        let mut cmd = stoker();
        cmd.arg("bench").arg(&root).args(["--json", "--batch-size", "8", "--preset", "imagenet-val"]);
        cmd.args(["--dtype", "uint8", "--device", "cuda"]).env("LD_LIBRARY_PATH", lib.parent().unwrap());
        cmd.env("FAKE_CUDA_DEVICES", "4").env("CUDA_VISIBLE_DEVICES", "2,3").env("LOCAL_RANK", local_rank);
        let out = output_within(cmd, 120);
        let err = String::from_utf8_lossy(&out.stderr).to_string();
        if !out.status.success() {
            return Err(err);
        }
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        Ok(v["device"]["used"].as_str().unwrap_or_default().to_string())
    };
    assert_eq!(used("1").unwrap(), "cuda:1");
    assert_eq!(used("0").unwrap(), "cuda:0");
    // Two GPUs are visible: rank 2 on this node has none, and says so.
    let err = used("2").unwrap_err();
    assert!(err.contains("cuda:2") && !err.contains("panicked"), "{err}");
}

/// The stand-in libnvjpeg next to the stand-in driver `lib` (linked against it, for its host
/// work on streams).
fn build_fake_nvjpeg(lib: &Path) -> PathBuf {
    let dir = lib.parent().unwrap();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fake_nvjpeg.c");
    let out = dir.join("libnvjpeg.so");
    let st = Command::new("cc")
        .args(["-shared", "-fPIC", "-O1", "-pthread", "-o"])
        .arg(&out)
        .arg(&src)
        .arg(format!("-L{}", dir.display()))
        .arg("-lcuda")
        .arg(format!("-Wl,-rpath,{}", dir.display()))
        .output()
        .expect("run cc");
    assert!(st.status.success(), "{}", String::from_utf8_lossy(&st.stderr));
    out
}

/// The pixels the stand-in nvJPEG serves: every JPEG under `root` decoded whole by
/// libjpeg-turbo (stoker's fallback decoder: full resolution, no EXIF rotation, as nvJPEG),
/// named by the FNV-1a hash of its bytes. Returns how many.
fn serve_pixels(root: &Path, out: &Path) -> usize {
    std::fs::create_dir_all(out).unwrap();
    let mut dec = stoker::image::gpu_job::fallback_decoder().unwrap();
    let mut n = 0;
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
                continue;
            }
            let data = std::fs::read(&p).unwrap();
            let Ok(info) = dec.info(&data, &p) else { continue };
            if !data.starts_with(&[0xFF, 0xD8]) {
                continue;
            }
            let whole = [0.0, 0.0, info.width as f64, info.height as f64];
            let r = dec.decode(&data, &p, &info, whole, (info.width, info.height)).unwrap();
            let hash = data.iter().fold(0xcbf29ce484222325u64, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x100000001b3));
            let mut f = (r.width as u32).to_le_bytes().to_vec();
            f.extend((r.height as u32).to_le_bytes());
            f.extend_from_slice(r.pixels);
            std::fs::write(out.join(format!("{hash:016x}.rgb")), f).unwrap();
            n += 1;
        }
    }
    n
}

#[test]
fn gpu_decoded_batches_are_the_cpu_paths_through_stand_in_nvjpeg_and_kernel() {
    let tmp = tempfile::tempdir().unwrap();
    let Some((lib, root)) = driver_and_demo(tmp.path(), 64) else { return };
    let lib_dir = lib.parent().unwrap().to_path_buf();
    build_fake_nvjpeg(&lib);
    let pixels = tmp.path().join("pixels");
    assert!(serve_pixels(&root, &pixels) > 32);
    let run = |args: &[&str], env: &[(&str, &str)]| -> Result<serde_json::Value, String> {
        let mut cmd = stoker();
        cmd.arg("bench").arg(&root).args(["--json", "--threads", "2"]);
        for (k, v) in [("--epochs", "2"), ("--batch-size", "16")] {
            if !args.contains(&k) {
                cmd.args([k, v]);
            }
        }
        // Full-resolution decodes on the CPU, as nvJPEG's: the pixels are then the same.
        cmd.args(["--dtype", "uint8", "--device", "cuda", "--no-dct-scaling", "--no-roi", "--seed", "7"]).args(args);
        cmd.env("LD_LIBRARY_PATH", &lib_dir).env("FAKE_CUDA_COPY_DELAY_US", "500").env("FAKE_NVJPEG_DIR", &pixels);
        for (k, v) in env {
            cmd.env(k, v);
        }
        let out = output_within(cmd, 180);
        if !out.status.success() {
            return Err(String::from_utf8_lossy(&out.stderr).into_owned());
        }
        Ok(serde_json::from_slice(&out.stdout).unwrap())
    };
    for (preset, layout) in [("imagenet-train", "nchw"), ("imagenet-val", "nhwc")] {
        let base = ["--preset", preset, "--layout", layout];
        let cpu = run(&[&base[..], &["--decode", "cpu"]].concat(), &[]).unwrap();
        assert!(cpu["gpu_decode"].is_null());
        for (decode, env) in [
            (&["--decode", "gpu"][..], &[][..]),
            (&["--decode", "gpu", "--gpu-share", "1"], &[]),
            // No JPEG engines: the default backend, image by image.
            (&["--decode", "gpu", "--gpu-share", "0.3"], &[("FAKE_NVJPEG_HARDWARE", "0")]),
            // The engine refuses the batch: the default backend takes it.
            (&["--decode", "gpu"], &[("FAKE_NVJPEG_BATCH_FAILS", "1")]),
        ] {
            let gpu = run(&[&base[..], decode].concat(), env).unwrap();
            let what = format!("{preset} {layout} {decode:?} {env:?}");
            assert_eq!(gpu["digest"], cpu["digest"], "{what}: GPU-decoded batches differ from the CPU's");
            assert_eq!(gpu["images"], cpu["images"], "{what}");
            let g = &gpu["gpu_decode"];
            let share = g["share"].as_f64().unwrap();
            assert!(g["images"].as_u64().unwrap() > 0 && share > 0.0 && share <= 1.0, "{what}: {g}");
            assert_eq!(g["cpu_fallback"], 0, "{what}: {g}");
            let backend = if env.iter().any(|e| e.0 == "FAKE_NVJPEG_HARDWARE") { "default" } else { "hardware" };
            assert_eq!(g["backend"], backend, "{what}: {g}");
        }
        // `auto` starts on the CPU and moves a share to the GPU only when that gives the
        // consumer batches sooner (its logic against a modelled training step: the split's
        // unit tests); whatever it does, the batches are the CPU path's. A consumer slower
        // than the loader (a 40 ms step; 2 passes of 16 batches, a window of each measured) is
        // fed by the CPU alone: the GPU is left alone.
        let auto = run(&[&base[..], &["--decode", "auto"]].concat(), &[]).unwrap();
        assert_eq!(auto["digest"], cpu["digest"], "{preset}: auto");
        let slow = ["--decode", "auto", "--consumer-ms", "40", "--batch-size", "4", "--no-digest"];
        let fed = run(&[&base[..], &slow[..]].concat(), &[]).unwrap();
        assert_eq!((fed["gpu_decode"]["share"].as_f64(), fed["gpu_decode"]["images"].as_u64()), (Some(0.0), Some(0)));
        // A fixed share takes floor(16 * share) positions of each full batch.
        let fixed =
            run(&[&base[..], &["--decode", "gpu", "--gpu-share", "0.25", "--no-digest"]].concat(), &[]).unwrap();
        let g = &fixed["gpu_decode"];
        let per_batch = g["images"].as_u64().unwrap() as f64 / fixed["batches"].as_f64().unwrap();
        assert!(per_batch > 2.0 && per_batch <= 4.0, "{g}");
    }

    // Bicubic (both pass orders: RandomResizedCrop's tall crops shrink the height more than
    // twice as much as the width, which Pillow 13 resamples vertically first) and nearest (a
    // soft Resize + CenterCrop box, whose scan continues the whole axis'): the kernel's
    // arithmetic is the CPU's for every filter.
    for (preset, layout, filter) in [
        ("imagenet-train", "nhwc", "bicubic"),
        ("imagenet-val", "nchw", "bicubic"),
        ("imagenet-val", "nhwc", "nearest"),
    ] {
        let base = ["--preset", preset, "--layout", layout, "--interpolation", filter];
        let cpu = run(&[&base[..], &["--decode", "cpu"]].concat(), &[]).unwrap();
        let gpu = run(&[&base[..], &["--decode", "gpu", "--gpu-share", "1"]].concat(), &[]).unwrap();
        assert_eq!(gpu["digest"], cpu["digest"], "{preset} {layout} {filter}: GPU-resampled batches differ");
        assert!(gpu["gpu_decode"]["images"].as_u64().unwrap() > 0, "{}", gpu["gpu_decode"]);
    }

    // JPEGs the stand-in cannot decode (its pixels are missing) are made on the CPU by the
    // transfer thread: nothing is lost, and the batches are the same.
    let mut removed = 0;
    for e in std::fs::read_dir(&pixels).unwrap().take(5) {
        std::fs::remove_file(e.unwrap().path()).unwrap();
        removed += 1;
    }
    assert_eq!(removed, 5);
    let base = ["--preset", "imagenet-train", "--layout", "nchw"];
    let cpu = run(&[&base[..], &["--decode", "cpu"]].concat(), &[]).unwrap();
    let gpu = run(&[&base[..], &["--decode", "gpu", "--gpu-share", "1"]].concat(), &[]).unwrap();
    assert_eq!(gpu["digest"], cpu["digest"]);
    let fallback = gpu["gpu_decode"]["cpu_fallback"].as_u64().unwrap();
    assert!(fallback > 0, "{}", gpu["gpu_decode"]);

    // `stoker doctor` names the library GPU decode uses.
    let doctor = |dir: &Path| {
        let mut cmd = stoker();
        cmd.args(["doctor", "--json", "--no-bandwidth"]).env("LD_LIBRARY_PATH", dir);
        let out = output_within(cmd, 60);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()
    };
    let v = doctor(&lib_dir);
    let found = &v["nvjpeg"];
    assert_eq!(found["version"], "12.3.0", "{found}");
    assert!(found["path"].as_str().unwrap().contains("libnvjpeg"), "{found}");
    let advice = v["recommendations"].as_array().unwrap();
    assert!(advice.iter().any(|a| a.as_str().unwrap().contains("decode='auto'")), "{advice:?}");

    // Where GPU decode cannot work: `gpu` is an error saying why, `auto` decodes on the CPU.
    let mut cmd = stoker();
    cmd.arg("bench").arg(&root).args(["--preset", "imagenet-val", "--decode", "gpu", "--device", "cpu"]);
    let e = String::from_utf8_lossy(&output_within(cmd, 60).stderr).into_owned();
    assert!(e.contains("decode='gpu' needs device='cuda'"), "{e}");
    let e = run(&["--preset", "imagenet-val", "--decode", "gpu", "--gpu-share", "1.5"], &[]).unwrap_err();
    assert!(e.contains("--gpu-share") && e.contains("(0, 1]") && e.contains("1.5"), "{e}");
    let no_nvjpeg = tmp.path().join("driver-only");
    std::fs::create_dir_all(&no_nvjpeg).unwrap();
    std::fs::copy(&lib, no_nvjpeg.join("libcuda.so")).unwrap();
    let only = |decode: &str| {
        let mut cmd = stoker();
        cmd.arg("bench").arg(&root).args(["--json", "--batch-size", "16", "--preset", "imagenet-val", "--no-digest"]);
        cmd.args(["--dtype", "uint8", "--device", "cuda", "--decode", decode]).env("LD_LIBRARY_PATH", &no_nvjpeg);
        output_within(cmd, 120)
    };
    let v = doctor(&no_nvjpeg);
    let missing = &v["nvjpeg"];
    assert!(!v["recommendations"].as_array().unwrap().iter().any(|a| a.as_str().unwrap().contains("decode='auto'")));
    assert!(missing["error"].as_str().unwrap().contains("libnvjpeg was not found"), "{missing}");
    let out = only("gpu");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("GPU decode is not available") && err.contains("libnvjpeg"), "{err}");
    let out = only("auto");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(v["gpu_decode"].is_null(), "{v}");
    assert!(v["device"]["note"].as_str().unwrap().contains("decode='auto' decodes on the CPU"), "{v}");
}
