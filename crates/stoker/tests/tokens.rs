//! `TokenLoader` end to end on real text and the real GPT-2 tokenizer (`tests/data/text`):
//! every token exactly once, the same batches whatever the thread count, resume at every
//! batch, rank shards, bad documents counted with their file and line.

use std::path::{Path, PathBuf};
use stoker::tokens::pack::IGNORE;
use stoker::tokens::{PackMode, TextTokenizer, TokenConfig, TokenLoader};

/// `v` as JSON, as Python and `--json` read it.
fn json(v: impl serde::Serialize) -> serde_json::Value {
    serde_json::to_value(v).unwrap()
}

fn data(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/text").join(name)
}

/// The GPT-2 tokenizer, loaded once (its fast path's tables take a while to build unoptimised).
fn gpt2() -> TextTokenizer {
    static TOK: std::sync::OnceLock<TextTokenizer> = std::sync::OnceLock::new();
    TOK.get_or_init(|| TextTokenizer::from_file(&data("tokenizer-gpt2.json")).unwrap()).clone()
}

/// The sample's documents, decompressed into a plain `.jsonl` (random access) in `dir`;
/// also returns the texts.
fn corpus(dir: &Path, docs: usize) -> (PathBuf, Vec<String>) {
    let raw = zstd::decode_all(std::fs::File::open(data("wiki-sample.jsonl.zst")).unwrap()).unwrap();
    let lines: Vec<&[u8]> = raw.split(|&b| b == b'\n').filter(|l| !l.is_empty()).take(docs).collect();
    let texts = lines
        .iter()
        .map(|l| serde_json::from_slice::<serde_json::Value>(l).unwrap()["text"].as_str().unwrap().to_string())
        .collect();
    let p = dir.join("wiki.jsonl");
    std::fs::write(&p, lines.join(&b'\n')).unwrap();
    (p, texts)
}

struct Got {
    rows: Vec<Vec<i32>>,
    labels: Vec<Vec<i32>>,
    positions: Vec<Vec<i32>>,
    cu: Vec<Vec<i32>>,
}

fn collect(l: &TokenLoader) -> Got {
    let mut g = Got { rows: vec![], labels: vec![], positions: vec![], cu: vec![] };
    for b in l.iter().unwrap() {
        let b = b.unwrap();
        let n = b.seq_len();
        g.rows.extend(b.input_ids().chunks(n).map(<[i32]>::to_vec));
        g.labels.extend(b.labels().chunks(n).map(<[i32]>::to_vec));
        g.positions.extend(b.position_ids().chunks(n).map(<[i32]>::to_vec));
        g.cu.push(b.cu_seqlens().to_vec());
    }
    g
}

fn config(threads: usize) -> TokenConfig {
    let mut c = TokenConfig::new(4, 256);
    c.threads = Some(threads);
    c
}

#[test]
fn concat_holds_every_token_of_the_reference_in_order() {
    let d = tempfile::tempdir().unwrap();
    let (p, texts) = corpus(d.path(), 12);
    let tok = gpt2();
    let mut stream = vec![];
    let mut doc_ends = vec![];
    for t in &texts {
        tok.encode_into(t, &mut stream).unwrap();
        stream.push(50256);
        doc_ends.push(stream.len());
    }
    let l = TokenLoader::new(std::slice::from_ref(&p), Some(tok), config(2)).unwrap();
    let g = collect(&l);
    let flat: Vec<u32> = g.rows.concat().iter().map(|&t| t as u32).collect();
    assert_eq!(flat[..], stream[..flat.len()], "ids in order");
    assert!(stream.len() - flat.len() < 256, "only the tail is dropped");
    let labels = g.labels.concat();
    for (i, &lab) in labels.iter().enumerate() {
        let want = if doc_ends.contains(&(i + 1)) { IGNORE } else { stream[i + 1] as i32 };
        assert_eq!(lab, want, "label {i}");
    }
    // Positions restart at each document and at each row; cu_seqlens mark the same places.
    for (r, pos) in g.positions.iter().enumerate() {
        let starts: Vec<usize> = (0..256).filter(|&k| pos[k] == 0).collect();
        let base = r * 256;
        let want: Vec<usize> = (0..256).filter(|&k| k == 0 || doc_ends.contains(&(base + k))).collect();
        assert_eq!(starts, want, "row {r}");
    }
    for (b, cu) in g.cu.iter().enumerate() {
        let rows = if b + 1 < g.cu.len() { 4 } else { g.rows.len() - 4 * b };
        assert_eq!((cu[0], *cu.last().unwrap()), (0, (rows * 256) as i32));
        assert!(cu.windows(2).all(|w| w[0] < w[1]));
    }
    let st = json(l.stats().counts(l.consumer_wait()));
    assert_eq!(st["documents"], 12);
    assert_eq!(st["tokens"], flat.len() as u64);
}

#[test]
fn batches_do_not_depend_on_the_thread_count() {
    let d = tempfile::tempdir().unwrap();
    let (p, _) = corpus(d.path(), 20);
    for pack in [PackMode::Concat, PackMode::BestFit] {
        let run = |threads| {
            let mut c = config(threads);
            c.pack = pack;
            c.pack_window = 7;
            c.shuffle = true;
            c.seed = 5;
            collect(&TokenLoader::new(std::slice::from_ref(&p), Some(gpt2()), c).unwrap()).rows
        };
        let one = run(1);
        assert!(one.len() > 20);
        assert_eq!(run(2), one, "{pack:?}");
        assert_eq!(run(8), one, "{pack:?}");
    }
}

#[test]
fn resume_at_every_batch_equals_the_uninterrupted_run() {
    let d = tempfile::tempdir().unwrap();
    let (p, _) = corpus(d.path(), 8);
    // The compressed sample too: streamed, shuffled within windows.
    for (path, pack) in [
        (p.clone(), PackMode::Concat),
        (p.clone(), PackMode::BestFit),
        (data("wiki-sample.jsonl.zst"), PackMode::Concat),
    ] {
        let mut c = config(2);
        c.pack = pack;
        c.pack_window = 3;
        c.shuffle = true;
        c.shuffle_window = 5;
        c.seed = 1;
        c.batch_size = 2;
        c.seq_len = 512;
        let l = TokenLoader::new(std::slice::from_ref(&path), Some(gpt2()), c.clone()).unwrap();
        l.set_epoch(3);
        let mut states = vec![];
        let mut whole = vec![];
        for b in l.iter().unwrap() {
            let b = b.unwrap();
            whole.push(b.input_ids().to_vec());
            states.push(l.state());
        }
        assert!(whole.len() >= 4, "{}", whole.len());
        for k in (0..whole.len()).step_by(if path == p { 1 } else { 7 }) {
            let r = TokenLoader::new(std::slice::from_ref(&path), Some(gpt2()), c.clone()).unwrap();
            r.load_state(states[k].clone()).unwrap();
            let rest: Vec<Vec<i32>> = r.iter().unwrap().map(|b| b.unwrap().input_ids().to_vec()).collect();
            assert_eq!(rest[..], whole[k + 1..], "{pack:?} {path:?} after batch {k}");
        }
    }
}

#[test]
fn ranks_share_the_documents_once() {
    let d = tempfile::tempdir().unwrap();
    let (p, _) = corpus(d.path(), 30);
    let tokens = |rank, world| {
        let mut c = config(2);
        c.pack = PackMode::BestFit;
        c.shuffle = true;
        c.rank = rank;
        c.world_size = world;
        c.seq_len = 4096;
        let l = TokenLoader::new(std::slice::from_ref(&p), Some(gpt2()), c).unwrap();
        let mut v: Vec<i32> = collect(&l).rows.concat().into_iter().filter(|&t| t != 50256).collect();
        v.sort_unstable();
        v
    };
    let all = tokens(0, 1);
    let mut parts: Vec<i32> = (0..3).flat_map(|r| tokens(r, 3)).collect();
    parts.sort_unstable();
    assert_eq!(parts, all, "3 ranks hold every token of the whole, once");
}

#[test]
fn bad_documents_are_counted_with_their_file_and_line() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("bad.jsonl");
    let mut text = b"{\"text\": \"good one\"}\n{\"text\": \"unterminated\n{\"id\": 3}\n".to_vec();
    text.extend_from_slice(b"{\"text\": \"\xff\xfe\"}\n{\"text\": \"\"}\n");
    text.extend_from_slice(format!("{{\"text\": \"{}\"}}\n", "x".repeat(5000)).as_bytes());
    text.extend_from_slice(b"{\"text\": \"good two\"}\n");
    std::fs::write(&p, &text).unwrap();
    let mut c = TokenConfig::new(1, 4);
    c.max_document_bytes = 1000;
    c.threads = Some(2);
    let l = TokenLoader::new(std::slice::from_ref(&p), Some(gpt2()), c.clone()).unwrap();
    let rows = collect(&l).rows.concat();
    let tok = gpt2();
    let mut want = vec![];
    for t in ["good one", "", "good two"] {
        tok.encode_into(t, &mut want).unwrap();
        want.push(50256);
    }
    let n = want.len() / 4 * 4;
    assert_eq!(rows.iter().map(|&t| t as u32).collect::<Vec<_>>(), want[..n]);
    let st = json(l.stats().counts(l.consumer_wait()));
    assert_eq!((st["documents"].as_u64(), st["failed_documents"].as_u64()), (Some(7), Some(4)));
    // Strict: the first bad document is the error, naming the file and the line.
    c.raise = true;
    let l = TokenLoader::new(std::slice::from_ref(&p), Some(gpt2()), c).unwrap();
    let err = l.iter().unwrap().find_map(|b| b.err()).unwrap().to_string();
    assert!(err.contains("bad.jsonl") && err.contains("line 2"), "{err}");
}

#[test]
fn token_files_pack_like_their_text() {
    let d = tempfile::tempdir().unwrap();
    let (p, texts) = corpus(d.path(), 6);
    let tok = gpt2();
    let mut stream = vec![];
    for t in &texts {
        tok.encode_into(t, &mut stream).unwrap();
        stream.push(50256);
    }
    let bin = d.path().join("wiki.bin");
    std::fs::write(&bin, stream.iter().flat_map(|&t| (t as u16).to_le_bytes()).collect::<Vec<_>>()).unwrap();
    let mut c = config(2);
    c.eos_id = Some(50256);
    c.pack = PackMode::BestFit;
    let from_bin = collect(&TokenLoader::new(&[bin], None, c.clone()).unwrap());
    let from_text = collect(&TokenLoader::new(&[p], Some(tok), c).unwrap());
    assert_eq!(from_bin.rows, from_text.rows);
    assert_eq!(from_bin.labels, from_text.labels);
}

#[test]
fn token_files_give_every_rank_the_same_batch_count() {
    let d = tempfile::tempdir().unwrap();
    // Documents of very different lengths, so that ranks' token counts differ.
    let mut toks: Vec<u32> = vec![];
    for i in 0..97u32 {
        toks.extend((0..(i * 31 % 200 + 1)).map(|k| 1 + (i + k) % 1000));
        toks.push(0);
    }
    let bin = d.path().join("t.bin");
    std::fs::write(&bin, toks.iter().flat_map(|&t| t.to_le_bytes()).collect::<Vec<_>>()).unwrap();
    for pack in [PackMode::Concat, PackMode::BestFit] {
        let mut counts = vec![];
        for rank in 0..4 {
            let mut c = TokenConfig::new(3, 64);
            c.token_bytes = 4;
            c.eos_id = Some(0);
            c.pack = pack;
            c.pack_window = 10;
            c.shuffle = true;
            c.rank = rank;
            c.world_size = 4;
            let l = TokenLoader::new(std::slice::from_ref(&bin), None, c).unwrap();
            let n = l.iter().unwrap().count();
            assert_eq!(Some(n), l.batches_per_epoch(), "{pack:?} rank {rank}");
            counts.push(n);
        }
        assert!(counts.iter().all(|&n| n == counts[0] && n > 5), "{pack:?} {counts:?}");
    }
}

/// A run of 4 ranks stopped at different batches continues on 3 ranks: every token (all
/// unique here) is delivered once, by the old run or the new one; the new ranks have equal
/// batch counts.
#[test]
fn elastic_resume_from_four_ranks_to_three() {
    for pack in [PackMode::Concat, PackMode::BestFit] {
        elastic_chain(pack);
    }
}

/// Four ranks stop part-way through an epoch; three continue from their states and stop
/// part-way; two finish it from the three's states. No token is delivered twice, and only the
/// epoch-end rows that equal batch counts cut are missing.
fn elastic_chain(pack: PackMode) {
    let d = tempfile::tempdir().unwrap();
    let mut toks: Vec<u32> = vec![];
    let mut next = 1u32;
    for i in 0..300u32 {
        for _ in 0..(i * 37 % 90 + 5) {
            toks.push(next);
            next += 1;
        }
        toks.push(0);
    }
    let bin = d.path().join("t.bin");
    std::fs::write(&bin, toks.iter().flat_map(|&t| t.to_le_bytes()).collect::<Vec<_>>()).unwrap();
    let loader = |rank, world| {
        let mut c = TokenConfig::new(2, 50);
        c.token_bytes = 4;
        c.eos_id = Some(0);
        c.shuffle = true;
        c.seed = 9;
        c.rank = rank;
        c.world_size = world;
        c.add_eos = false;
        c.pack = pack;
        c.pack_window = 16;
        let l = TokenLoader::new(std::slice::from_ref(&bin), None, c).unwrap();
        l.set_epoch(1);
        l
    };
    let mut seen: Vec<u32> = vec![];
    let mut states = vec![];
    for rank in 0..4 {
        let l = loader(rank, 4);
        let mut it = l.iter().unwrap();
        for _ in 0..(3 + rank * 4) {
            seen.extend(it.next().unwrap().unwrap().input_ids().iter().map(|&t| t as u32));
        }
        drop(it);
        states.push((l.state(), rank, 4));
    }
    let before = seen.len();
    let mut middle = vec![];
    for rank in 0..3 {
        let l = loader(rank, 3);
        l.load_states(states.clone()).unwrap();
        let mut it = l.iter().unwrap();
        for _ in 0..(2 + rank * 3) {
            seen.extend(it.next().unwrap().unwrap().input_ids().iter().map(|&t| t as u32));
        }
        drop(it);
        middle.push((l.state(), rank, 3));
    }
    assert!(middle.iter().all(|(st, _, _)| st.elastic.is_some()), "{pack:?}: the states carry their base");
    let mut counts = vec![];
    for rank in 0..2 {
        let l = loader(rank, 2);
        l.load_states(middle.clone()).unwrap();
        let n = l.batches_per_epoch().unwrap();
        let mut k = 0;
        for b in l.iter().unwrap() {
            seen.extend(b.unwrap().input_ids().iter().map(|&t| t as u32));
            k += 1;
        }
        assert_eq!(k, n, "{pack:?}");
        counts.push(k);
    }
    assert!(counts.iter().all(|&c| c == counts[0] && c > 10), "{pack:?}: {counts:?}");
    assert!(seen.len() > before);
    let real: Vec<u32> = seen.iter().copied().filter(|&t| t != 0).collect();
    let mut uniq = real.clone();
    uniq.sort_unstable();
    uniq.dedup();
    assert_eq!(uniq.len(), real.len(), "{pack:?}: no token delivered twice");
    let total = toks.iter().filter(|&&t| t != 0).count();
    assert!(total - real.len() < total / 20, "{pack:?}: {} of {total} tokens missing", total - real.len());
    // States of different resumes do not mix.
    let mixed = vec![states[0].clone(), middle[1].clone()];
    assert!(loader(0, 2).load_states(mixed).is_err());
}

/// `stoker tokenize`'s cache serves the same batches as the text it was made from, with equal
/// batch counts per rank, and refuses another tokenizer and a damaged index.
#[test]
fn the_token_cache_serves_the_same_batches_as_its_text() {
    let d = tempfile::tempdir().unwrap();
    let (p, _) = corpus(d.path(), 25);
    let out = d.path().join("cache");
    let mut c = TokenConfig::new(1, 1);
    (c.add_eos, c.threads) = (false, Some(2));
    let writer = TokenLoader::new(std::slice::from_ref(&p), Some(gpt2()), c).unwrap();
    let meta = stoker::tools::tokenize::write_cache(&writer, std::slice::from_ref(&p), &out, |_, _| {}).unwrap();
    assert_eq!((meta.documents, meta.token_bytes, meta.eos_id), (25, 2, Some(50256)));
    for (pack, bos) in [(PackMode::Concat, false), (PackMode::BestFit, true)] {
        let mut c = config(2);
        (c.pack, c.add_bos, c.bos_token) = (pack, bos, Some("<|endoftext|>".into()));
        let text = collect(&TokenLoader::new(std::slice::from_ref(&p), Some(gpt2()), c.clone()).unwrap());
        let cached = TokenLoader::new(std::slice::from_ref(&out), None, c.clone()).unwrap();
        let got = collect(&cached);
        assert_eq!((got.rows, got.labels, got.positions), (text.rows, text.labels, text.positions), "{pack:?}");
        assert_eq!(cached.batches_per_epoch(), Some(got.cu.len()));
        // With the tokenizer given too: the same.
        assert!(TokenLoader::new(std::slice::from_ref(&out), Some(gpt2()), c).is_ok());
    }
    let counts: Vec<usize> = (0..3)
        .map(|rank| {
            let mut c = config(1);
            (c.shuffle, c.rank, c.world_size) = (true, rank, 3);
            TokenLoader::new(std::slice::from_ref(&out), None, c).unwrap().iter().unwrap().count()
        })
        .collect();
    assert!(counts.iter().all(|&n| n == counts[0] && n > 3), "{counts:?}");
    // Another tokenizer: refused, naming both.
    let other = TextTokenizer::from_json(
        &std::fs::read(data("tokenizer-gpt2.json")).unwrap().iter().copied().chain(*b" ").collect::<Vec<_>>(),
        Path::new("other.json"),
    )
    .unwrap();
    let err = TokenLoader::new(std::slice::from_ref(&out), Some(other), config(1)).unwrap_err().to_string();
    assert!(err.contains("another tokenizer") && err.contains("other.json"), "{err}");
    // A damaged index: refused when opened.
    let idx = out.join("index.bin");
    let mut raw = std::fs::read(&idx).unwrap();
    raw[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
    std::fs::write(&idx, raw).unwrap();
    let err = TokenLoader::new(std::slice::from_ref(&out), None, config(1)).unwrap_err().to_string();
    assert!(err.contains("index.bin") && err.contains("damaged"), "{err}");
    // Writing over a folder that holds something: refused.
    let again = TokenLoader::new(std::slice::from_ref(&p), Some(gpt2()), {
        let mut c = TokenConfig::new(1, 1);
        c.add_eos = false;
        c
    })
    .unwrap();
    let err = stoker::tools::tokenize::write_cache(&again, &[p], &out, |_, _| {}).unwrap_err().to_string();
    assert!(err.contains("not empty"), "{err}");
}

/// A Parquet file of `groups` row groups with the documents in an optional string column
/// `text` (`None`: a null) and an id column, zstd-compressed.
fn write_parquet(path: &Path, groups: &[Vec<Option<String>>]) {
    use parquet::data_type::{ByteArray, ByteArrayType, Int64Type};
    use parquet::file::properties::WriterProperties;
    use parquet::file::writer::SerializedFileWriter;
    let schema = parquet::schema::parser::parse_message_type(
        "message doc { REQUIRED INT64 id; OPTIONAL BYTE_ARRAY text (UTF8); }",
    )
    .unwrap();
    let props =
        WriterProperties::builder().set_compression(parquet::basic::Compression::ZSTD(Default::default())).build();
    let mut w = SerializedFileWriter::new(std::fs::File::create(path).unwrap(), schema.into(), props.into()).unwrap();
    let mut id = 0i64;
    for g in groups {
        let mut rg = w.next_row_group().unwrap();
        let mut c = rg.next_column().unwrap().unwrap();
        let ids: Vec<i64> = g
            .iter()
            .map(|_| {
                id += 1;
                id
            })
            .collect();
        c.typed::<Int64Type>().write_batch(&ids, None, None).unwrap();
        c.close().unwrap();
        let mut c = rg.next_column().unwrap().unwrap();
        let values: Vec<ByteArray> = g.iter().flatten().map(|t| ByteArray::from(t.as_str())).collect();
        let defs: Vec<i16> = g.iter().map(|t| i16::from(t.is_some())).collect();
        c.typed::<ByteArrayType>().write_batch(&values, Some(&defs), None).unwrap();
        c.close().unwrap();
        rg.close().unwrap();
    }
    w.close().unwrap();
}

/// Parquet row groups give the same tokens as the same documents in JSON Lines; a null text
/// is a counted skip naming the row; shuffled, every document once.
#[test]
fn parquet_text_columns_read_by_row_group() {
    let d = tempfile::tempdir().unwrap();
    let (p, texts) = corpus(d.path(), 20);
    let groups: Vec<Vec<Option<String>>> = texts.chunks(7).map(|c| c.iter().cloned().map(Some).collect()).collect();
    let pq = d.path().join("wiki.parquet");
    write_parquet(&pq, &groups);
    let from_json = collect(&TokenLoader::new(std::slice::from_ref(&p), Some(gpt2()), config(2)).unwrap()).rows;
    let l = TokenLoader::new(std::slice::from_ref(&pq), Some(gpt2()), config(2)).unwrap();
    assert_eq!(l.documents(), 20);
    assert_eq!(collect(&l).rows, from_json);
    // Shuffled (row groups permuted, rows within windows): the same tokens, in another order.
    let mut c = config(2);
    (c.shuffle, c.shuffle_window, c.seq_len) = (true, 3, 64);
    let mut a: Vec<i32> =
        collect(&TokenLoader::new(std::slice::from_ref(&pq), Some(gpt2()), c.clone()).unwrap()).rows.concat();
    c.shuffle = false;
    let mut b: Vec<i32> = collect(&TokenLoader::new(std::slice::from_ref(&pq), Some(gpt2()), c).unwrap()).rows.concat();
    assert_ne!(a, b);
    a.sort_unstable();
    b.sort_unstable();
    let common = a.len().min(b.len());
    assert!(a.len().abs_diff(b.len()) < 64 && common > 1000);
    // A null text and a missing column.
    let bad = d.path().join("bad.parquet");
    write_parquet(&bad, &[vec![Some("one".into()), None, Some("three".into())]]);
    let mut c = TokenConfig::new(1, 2);
    c.threads = Some(1);
    let l = TokenLoader::new(std::slice::from_ref(&bad), Some(gpt2()), c.clone()).unwrap();
    let _ = collect(&l);
    assert_eq!(json(l.stats().counts(l.consumer_wait()))["failed_documents"], 1);
    c.raise = true;
    let err = TokenLoader::new(std::slice::from_ref(&bad), Some(gpt2()), c.clone())
        .unwrap()
        .iter()
        .unwrap()
        .find_map(|b| b.err())
        .unwrap();
    assert!(err.to_string().contains("bad.parquet") && err.to_string().contains("row 2: the text is null"), "{err}");
    c.text_key = "body".into();
    let mut skip = c.clone();
    skip.raise = false;
    let err =
        TokenLoader::new(std::slice::from_ref(&bad), Some(gpt2()), skip).unwrap().iter().unwrap().find_map(|b| b.err());
    assert!(err.unwrap().to_string().contains("every sample of this pass failed (3)"));
    let err = TokenLoader::new(std::slice::from_ref(&bad), Some(gpt2()), c)
        .unwrap()
        .iter()
        .unwrap()
        .find_map(|b| b.err())
        .unwrap();
    assert!(err.to_string().contains("no column `body`") && err.to_string().contains("id, text"), "{err}");
}

/// Every batch of `epochs` epochs of `l`, in order.
fn epochs(l: &TokenLoader, epochs: u64) -> Vec<Vec<Vec<i32>>> {
    (0..epochs)
        .map(|e| {
            l.set_epoch(e);
            collect(l).rows
        })
        .collect()
}

fn cache_counts(l: &TokenLoader) -> (u64, u64, u64, u64) {
    let r = &json(l.report())["cache"];
    let n = |k: &str| r[k].as_u64().unwrap_or_else(|| panic!("{k} in {r}"));
    (n("hits"), n("misses"), n("stored"), n("documents_cached"))
}

#[test]
fn the_automatic_token_cache_serves_later_epochs_and_other_loaders_the_same_batches() {
    use stoker::shell::store::{CacheLocation, StoreSpec};
    let d = tempfile::tempdir().unwrap();
    let (p, _) = corpus(d.path(), 40);
    let zst = data("wiki-sample.jsonl.zst");
    let spec =
        |bytes: Option<u64>| StoreSpec { location: CacheLocation::Dir(d.path().join("cache")), bytes, ttl: None };
    let mut c = config(2);
    (c.shuffle, c.seed, c.add_bos, c.bos_token) = (true, 7, true, Some("<|endoftext|>".into()));
    for file in [&p, &zst] {
        let files = std::slice::from_ref(file);
        let want = epochs(&TokenLoader::new(files, Some(gpt2()), c.clone()).unwrap(), 2);
        let docs = TokenLoader::new(files, Some(gpt2()), c.clone()).unwrap().documents();
        let mut cached = c.clone();
        cached.cache = Some(spec(None));
        let first = TokenLoader::new(files, Some(gpt2()), cached.clone()).unwrap();
        assert_eq!(epochs(&first, 1), want[..1], "{file:?}: the filling epoch");
        assert_eq!(cache_counts(&first), (0, docs, 0, 0), "stored when the next epoch starts");
        first.set_epoch(1);
        assert_eq!(collect(&first).rows, want[1], "{file:?}: an epoch from the cache");
        assert_eq!(cache_counts(&first), (docs, docs, docs, docs));
        drop(first);
        // Another loader (another process, as far as the cache knows): hits from the start.
        let other = TokenLoader::new(files, Some(gpt2()), cached.clone()).unwrap();
        assert_eq!(epochs(&other, 2), want, "{file:?}: a second loader");
        assert_eq!(cache_counts(&other), (2 * docs, 0, 0, docs));
    }
    // Flipped bytes in a segment: misses, tokenized again; the batches do not change.
    let files = std::slice::from_ref(&p);
    let mut cached = c.clone();
    cached.cache = Some(spec(None));
    let want = epochs(&TokenLoader::new(files, Some(gpt2()), c.clone()).unwrap(), 1);
    let group = PathBuf::from(
        TokenLoader::new(files, Some(gpt2()), cached.clone()).unwrap().report().kind.cache.unwrap().group.dir,
    );
    let seg = std::fs::read_dir(&group)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "tok"))
        .unwrap();
    let mut raw = std::fs::read(&seg).unwrap();
    raw[100] ^= 0x40;
    std::fs::write(&seg, raw).unwrap();
    let l = TokenLoader::new(files, Some(gpt2()), cached.clone()).unwrap();
    assert_eq!(epochs(&l, 1), want);
    assert!(json(l.report())["cache"]["verify_failures"].as_u64().unwrap() >= 1);
    // Another tokenizer is another group; so is a changed file.
    let other = TextTokenizer::from_json(
        &std::fs::read(data("tokenizer-gpt2.json")).unwrap().iter().copied().chain(*b" ").collect::<Vec<_>>(),
        Path::new("other.json"),
    )
    .unwrap();
    let l = TokenLoader::new(files, Some(other), cached.clone()).unwrap();
    assert_ne!(json(l.report())["cache"]["dir"], serde_json::json!(group.display().to_string()));
    assert_eq!(cache_counts(&l).3, 0);
    let mut text = std::fs::read(&p).unwrap();
    text.extend_from_slice(b"\n{\"text\": \"one more document\"}");
    std::fs::write(&p, text).unwrap();
    let l = TokenLoader::new(files, Some(gpt2()), cached.clone()).unwrap();
    assert_eq!(cache_counts(&l).3, 0, "a changed file is another dataset");
    // A budget too small for anything: nothing stored, counted; batches as without a cache.
    let small = tempfile::tempdir().unwrap();
    cached.cache = Some(StoreSpec { location: CacheLocation::Dir(small.path().to_path_buf()), ..spec(Some(4096)) });
    let want = epochs(&TokenLoader::new(files, Some(gpt2()), c.clone()).unwrap(), 2);
    let l = TokenLoader::new(files, Some(gpt2()), cached.clone()).unwrap();
    assert_eq!(epochs(&l, 2), want);
    let r = json(l.report());
    assert_eq!(r["cache"]["stored"], 0, "{r}");
    assert!(r["cache"]["not_stored_budget"].as_u64().unwrap() > 0, "{r}");
    // Token files are tokens already: refused.
    let bin = d.path().join("t.bin");
    std::fs::write(&bin, [1u8, 0, 2, 0]).unwrap();
    let mut tc = config(1);
    tc.cache = Some(spec(None));
    let err = TokenLoader::new(&[bin], None, tc).unwrap_err().to_string();
    assert!(err.contains("`cache`") && err.contains("for text"), "{err}");
}

/// A 1 GiB single line (a sparse file: no disk used) is indexed, then skipped unread as longer
/// than `max_document_bytes` and counted with its file and line; the documents after it load.
#[test]
fn a_one_gigabyte_line_is_skipped_unread_and_counted() {
    use std::io::{Seek, Write};
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("big.jsonl");
    let mut f = std::fs::File::create(&p).unwrap();
    f.write_all(b"{\"text\": \"").unwrap();
    f.set_len(10 + (1 << 30)).unwrap(); // a hole: reads as zero bytes
    f.seek(std::io::SeekFrom::End(0)).unwrap();
    f.write_all(b"\"}\n{\"text\": \"after the big one\"}\n").unwrap();
    drop(f);
    let mut c = TokenConfig::new(1, 2);
    c.threads = Some(2);
    let l = TokenLoader::new(std::slice::from_ref(&p), Some(gpt2()), c).unwrap();
    assert_eq!(l.documents(), 2);
    let rows = collect(&l).rows.concat();
    let mut want = vec![];
    gpt2().encode_into("after the big one", &mut want).unwrap();
    want.push(50256);
    let n = want.len() / 2 * 2;
    assert_eq!(rows.iter().map(|&t| t as u32).collect::<Vec<_>>(), want[..n]);
    let st = json(l.stats().counts(l.consumer_wait()));
    assert_eq!(st["failed_documents"], 1, "{st}");
    assert!(st["bytes_read"].as_u64().unwrap() < 1 << 27, "not read: {st}");
}
