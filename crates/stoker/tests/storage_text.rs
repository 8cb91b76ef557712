//! Text in an object store that dies or stalls mid-epoch: every remote call of the text path
//! (opening an object, its ranged reads) is bounded, and the first request that gets no
//! answer (after its retries: about two request bounds) ends the pass with one error naming
//! the object, whatever the failure policy (skipping documents would silently drop the rest
//! of the epoch),
//! for JSON Lines, `.jsonl.zst` and tar text shards, a killed server (connections refused)
//! and a stalled one (accepts, never answers). Its own test binary: it sets
//! `STOKER_OBJECT_TIMEOUT` for the whole process.

mod common;

use common::http::Server;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use stoker::source::tar;
use stoker::tokens::{TextTokenizer, TokenConfig, TokenLoader};
use stoker::{Error, Next};

/// The request bound of every test here, in seconds.
const TIMEOUT_S: u64 = 1;
/// Objects served: more than the reader gets ahead of the consumer (8 chunks of at most 64
/// documents), so the fault lands in the middle of the epoch.
const FILES: usize = 40;
const DOCS_PER_FILE: usize = 16;

fn data(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/text").join(name)
}

/// Real English documents (the shared Wikipedia sample) as JSON Lines.
fn lines() -> Vec<Vec<u8>> {
    let raw = zstd::decode_all(std::fs::File::open(data("wiki-sample.jsonl.zst")).unwrap()).unwrap();
    raw.split(|&b| b == b'\n').filter(|l| !l.is_empty()).map(<[u8]>::to_vec).collect()
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Format {
    Jsonl,
    JsonlZst,
    TarTxt,
    /// Megatron's indexed dataset: `X.bin` (uint16 ids) beside `X.idx`.
    Megatron,
}

/// Megatron's `.idx` for documents of `lens` tokens (uint16), one sequence each.
fn megatron_idx(lens: &[usize]) -> Vec<u8> {
    let mut b = b"MMIDIDX\x00\x00".to_vec();
    b.extend(1u64.to_le_bytes());
    b.push(8); // uint16
    b.extend((lens.len() as u64).to_le_bytes());
    b.extend((lens.len() as u64 + 1).to_le_bytes());
    lens.iter().for_each(|&n| b.extend((n as i32).to_le_bytes()));
    let mut at = 0i64;
    for &n in lens {
        b.extend(at.to_le_bytes());
        at += 2 * n as i64;
    }
    (0..=lens.len() as i64).for_each(|d| b.extend(d.to_le_bytes()));
    b
}

/// The objects of one format, by name.
fn objects(format: Format) -> HashMap<String, Vec<u8>> {
    let all = lines();
    let mut out = HashMap::new();
    for f in 0..FILES {
        let docs: Vec<&Vec<u8>> = (0..DOCS_PER_FILE).map(|d| &all[(f * DOCS_PER_FILE + d) % all.len()]).collect();
        let jsonl = docs.iter().flat_map(|l| l.iter().copied().chain([b'\n'])).collect::<Vec<u8>>();
        if format == Format::Megatron {
            // Token ids of the documents' bytes (any ids do here: no tokenizer reads them).
            let ids: Vec<Vec<u16>> = docs.iter().map(|l| l.iter().map(|&b| b as u16).collect()).collect();
            let bin: Vec<u8> = ids.iter().flatten().flat_map(|t| t.to_le_bytes()).collect();
            out.insert(format!("part-{f:03}.idx"), megatron_idx(&ids.iter().map(Vec::len).collect::<Vec<_>>()));
            out.insert(format!("part-{f:03}.bin"), bin);
            continue;
        }
        let (name, body) = match format {
            Format::Jsonl => (format!("part-{f:03}.jsonl"), jsonl),
            Format::JsonlZst => (format!("part-{f:03}.jsonl.zst"), zstd::encode_all(&jsonl[..], 3).unwrap()),
            Format::Megatron => unreachable!("above"),
            Format::TarTxt => {
                let mut t = vec![];
                for (d, l) in docs.iter().enumerate() {
                    let v: serde_json::Value = serde_json::from_slice(l).unwrap();
                    tar::append_member(&mut t, &format!("doc{d:04}.txt"), v["text"].as_str().unwrap().as_bytes());
                }
                tar::finish(&mut t);
                (format!("part-{f:03}.tar"), t)
            }
        };
        out.insert(name, body);
    }
    out
}

fn loader(server: &Server, names: &[String], format: Format) -> TokenLoader {
    std::env::set_var("STOKER_OBJECT_TIMEOUT", TIMEOUT_S.to_string());
    // Read and applied by `args`, as a loader config built there would (sources read no variable).
    stoker::args::apply_env().unwrap();
    static TOK: std::sync::OnceLock<TextTokenizer> = std::sync::OnceLock::new();
    let urls: Vec<PathBuf> = names.iter().map(|n| PathBuf::from(server.url(n))).collect();
    let mut c = TokenConfig::new(2, 128);
    c.threads = Some(1);
    c.prefetch = 1;
    c.index_dir = None;
    if format == Format::Megatron {
        return TokenLoader::new(&urls, None, c).unwrap();
    }
    let tok = TOK.get_or_init(|| TextTokenizer::from_file(&data("tokenizer-gpt2.json")).unwrap()).clone();
    TokenLoader::new(&urls, Some(tok), c).unwrap()
}

#[derive(Clone, Copy, Debug)]
enum Fault {
    Killed,
    Stalled,
}

/// Takes one batch from a healthy store, then breaks it: the pass must end with one
/// `Error::Unavailable` naming the object within a few request bounds, and dropping the
/// iteration must be prompt.
fn dies_mid_epoch(format: Format, fault: Fault) {
    let files = objects(format);
    let mut names: Vec<String> = files.keys().filter(|n| !n.ends_with(".idx")).cloned().collect();
    names.sort();
    let server = Server::start(files);
    let l = loader(&server, &names, format);
    let mut it = l.iter().unwrap();
    assert!(it.next().unwrap().is_ok(), "{format:?}: a healthy store gives a batch");
    match fault {
        Fault::Killed => server.kill(),
        Fault::Stalled => server.stall.store(true, Ordering::Release),
    }
    // What the reader had read before the fault is still delivered (its tokenizing takes a
    // while here); the bound is on the wait after the last batch: no batch and no error.
    let t0 = Instant::now();
    let mut last = t0;
    let err = loop {
        assert!(t0.elapsed() < Duration::from_secs(120), "{format:?}/{fault:?}: no end 120 s after the fault");
        match it.next_timeout(Duration::from_millis(100)) {
            Next::NotYet => continue,
            Next::End => panic!("{format:?}/{fault:?}: the epoch ended without an error"),
            Next::Item(Ok(_)) => last = Instant::now(),
            Next::Item(Err(e)) => break e,
        }
    };
    let waited = last.elapsed();
    // One request that gets no answer ends the pass: about 3 request bounds at most (the
    // request, a retry started within 2 bounds); a wide margin for a loaded machine.
    assert!(waited < Duration::from_secs(8 * TIMEOUT_S), "{format:?}/{fault:?}: the error took {waited:?}");
    let text = err.to_string();
    assert!(matches!(err, Error::Unavailable(_)), "{format:?}/{fault:?}: {text}");
    let base = format!("storage not answering: http://127.0.0.1:{}/part-", server.port);
    assert!(text.starts_with(&base), "{format:?}/{fault:?}: {text}");
    let cause = match fault {
        Fault::Killed => "Connection refused",
        Fault::Stalled => "timed out",
    };
    assert!(text.contains(cause), "{format:?}/{fault:?}: {text}");
    let t1 = Instant::now();
    drop(it);
    assert!(t1.elapsed() < Duration::from_secs(2), "{format:?}/{fault:?}: the drop took {:?}", t1.elapsed());
}

/// One test per format and fault (each its own store, run in parallel).
macro_rules! dies_mid_epoch {
    ($($name:ident: $format:ident, $fault:ident;)*) => {$(
        #[test]
        fn $name() {
            dies_mid_epoch(Format::$format, Fault::$fault);
        }
    )*};
}

dies_mid_epoch! {
    jsonl_from_a_killed_store: Jsonl, Killed;
    jsonl_from_a_stalled_store: Jsonl, Stalled;
    zstd_jsonl_from_a_killed_store: JsonlZst, Killed;
    zstd_jsonl_from_a_stalled_store: JsonlZst, Stalled;
    megatron_tokens_from_a_killed_store: Megatron, Killed;
    megatron_tokens_from_a_stalled_store: Megatron, Stalled;
}

/// Megatron's `.bin`/`.idx` read from the store give the batches they give from a local disk.
#[test]
fn megatron_tokens_from_a_store_are_the_local_batches() {
    let files = objects(Format::Megatron);
    let dir = tempfile::tempdir().unwrap();
    for (name, body) in &files {
        std::fs::write(dir.path().join(name), body).unwrap();
    }
    let mut names: Vec<String> = files.keys().filter(|n| n.ends_with(".bin")).cloned().collect();
    names.sort();
    let server = Server::start(files);
    let rows =
        |l: TokenLoader| -> Vec<Vec<i32>> { l.iter().unwrap().map(|b| b.unwrap().input_ids().to_vec()).collect() };
    let remote = rows(loader(&server, &names, Format::Megatron));
    let paths: Vec<PathBuf> = names.iter().map(|n| dir.path().join(n)).collect();
    let mut c = TokenConfig::new(2, 128);
    c.threads = Some(1);
    c.prefetch = 1;
    c.index_dir = None;
    let local = rows(TokenLoader::new(&paths, None, c).unwrap());
    assert!(local.len() > 100);
    assert_eq!(remote, local);
}

#[test]
fn tar_text_from_a_killed_store() {
    dies_mid_epoch(Format::TarTxt, Fault::Killed);
}

#[test]
fn tar_text_from_a_stalled_store() {
    dies_mid_epoch(Format::TarTxt, Fault::Stalled);
}

/// Bytes of one block of a token file in object storage: one ranged request each.
const BLOCK: usize = 8 << 20;

/// Documents of 20 to 2000 uint16 ids in 1..=50000 (a fixed generator), about `bytes` bytes.
fn token_docs(bytes: usize) -> Vec<Vec<u16>> {
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let (mut docs, mut total) = (vec![], 0);
    while total < bytes {
        let n = 20 + (next() % 1981) as usize;
        docs.push((0..n).map(|_| (next() % 50_000) as u16 + 1).collect::<Vec<u16>>());
        total += 2 * n;
    }
    docs
}

/// A token loader of 16 rows of 512 tokens over `paths` (`eos`: nanoGPT's end of document).
fn token_loader(paths: &[PathBuf], eos: Option<u32>, shuffle: bool, (rank, world): (usize, usize)) -> TokenLoader {
    let mut c = TokenConfig::new(16, 512);
    c.threads = Some(1);
    c.prefetch = 1;
    c.index_dir = None;
    c.eos_id = eos;
    c.shuffle = shuffle;
    c.seed = 7;
    (c.rank, c.world_size) = (rank, world);
    TokenLoader::new(paths, None, c).unwrap()
}

/// A token file of several blocks read from the store (Megatron's `.bin`/`.idx`, and a
/// nanoGPT `.bin` whose documents end at an EOS id) gives the rows it gives from a local disk,
/// and a pass costs one ranged request per block of the file, not one per document: in file
/// order, shuffled (windows of a file, each read in file order) on one rank of two, and
/// resumed near the end of a pass (the blocks from the resume point on, not the file again).
#[test]
fn token_files_from_a_store_cost_a_request_per_block() {
    let docs = token_docs(7 * BLOCK / 2);
    let bin: Vec<u8> = docs.iter().flatten().flat_map(|t| t.to_le_bytes()).collect();
    let nano: Vec<u8> = docs.iter().flat_map(|d| d.iter().chain([&0u16])).flat_map(|t| t.to_le_bytes()).collect();
    let lens: Vec<usize> = docs.iter().map(Vec::len).collect();
    let sizes = [("mega.bin", bin.len()), ("nano.bin", nano.len())];
    let files = HashMap::from([
        ("mega.bin".to_string(), bin),
        ("mega.idx".to_string(), megatron_idx(&lens)),
        ("nano.bin".to_string(), nano),
    ]);
    let dir = tempfile::tempdir().unwrap();
    for (name, body) in &files {
        std::fs::write(dir.path().join(name), body).unwrap();
    }
    let server = Server::start(files);
    let count = || server.ranged.load(Ordering::SeqCst);
    let rows =
        |l: &TokenLoader| -> Vec<Vec<i32>> { l.iter().unwrap().map(|b| b.unwrap().input_ids().to_vec()).collect() };
    for (name, size) in sizes {
        let blocks = size.div_ceil(BLOCK);
        let eos = (name == "nano.bin").then_some(0);
        let url = [PathBuf::from(server.url(name))];
        // Opening: the `.idx` (one block), or a scan of the `.bin` for EOS ids (every block).
        let at = count();
        let l = token_loader(&url, eos, false, (0, 1));
        let opened = count() - at;
        let at = count();
        let remote = rows(&l);
        let pass = count() - at;
        let local = rows(&token_loader(&[dir.path().join(name)], eos, false, (0, 1)));
        assert!(local.len() > 1000, "{name}: {} batches", local.len());
        assert!(remote == local, "{name}: the store's rows differ from the local file's");
        // Shuffled (a window order), rank 1 of 2.
        let s = token_loader(&url, eos, true, (1, 2));
        let at = count();
        let shuffled = rows(&s);
        let shuffled_pass = count() - at;
        assert_eq!(Some(shuffled.len()), s.batches_per_epoch(), "{name}");
        // Resumed after 90% of the pass in file order.
        let k = remote.len() * 9 / 10;
        let mut states = vec![];
        let mut it = l.iter().unwrap();
        for _ in 0..=k {
            it.next().unwrap().unwrap();
        }
        states.push(l.state());
        drop(it);
        let r = token_loader(&url, eos, false, (0, 1));
        r.load_state(states.pop().unwrap()).unwrap();
        let at = count();
        let rest = rows(&r);
        let resumed = count() - at;
        assert!(rest[..] == remote[k + 1..], "{name}: a resumed pass differs");
        assert_eq!(opened, if eos.is_some() { blocks } else { 1 }, "{name}: requests to open it");
        assert_eq!(pass, blocks, "{name}: requests of a pass in file order");
        assert_eq!(shuffled_pass, blocks, "{name}: requests of a shuffled pass of rank 1 of 2");
        // From the resume point's block on (the last, or the one before where its document
        // starts), not the file again.
        assert!(resumed <= 2, "{name}: {resumed} requests of a resumed pass");
        eprintln!(
            "{name}: {size} bytes, {blocks} blocks of {BLOCK}, {} documents; ranged requests: open {opened}, \
             pass {pass}, shuffled rank 1 of 2 {shuffled_pass}, resumed at batch {} of {} {resumed}",
            docs.len(),
            k + 1,
            remote.len()
        );
    }
}
