//! A tiny HTTP object server on 127.0.0.1 that can be told to stall, and a shard to serve:
//! for the tests of object-store faults.

use super::*;
use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use stoker::source::shards::{encode_index, index_members};
use stoker::source::tar;

/// A tiny HTTP/1.1 object server on 127.0.0.1: HEAD, GET and ranged GET of the files it was
/// given, until `stall` is set; from then on it accepts connections and reads requests but
/// never answers (a hung server behind a live socket).
pub struct Server {
    pub port: u16,
    pub stall: Arc<AtomicBool>,
    pub stop: Arc<AtomicBool>,
    pub ranged: Arc<AtomicUsize>,
    /// Requests read while stalled (held without an answer).
    pub held: Arc<AtomicUsize>,
}

impl Server {
    pub fn start(files: HashMap<String, Vec<u8>>) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let stall = Arc::new(AtomicBool::new(false));
        let stop = Arc::new(AtomicBool::new(false));
        let ranged = Arc::new(AtomicUsize::new(0));
        let held = Arc::new(AtomicUsize::new(0));
        let files = Arc::new(files);
        let (st, sp, rg, hd) = (stall.clone(), stop.clone(), ranged.clone(), held.clone());
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                if sp.load(Ordering::Acquire) {
                    return;
                }
                let Ok(conn) = conn else { continue };
                let (files, st, sp, rg, hd) = (files.clone(), st.clone(), sp.clone(), rg.clone(), hd.clone());
                std::thread::spawn(move || serve(conn, &files, &st, &sp, &rg, &hd));
            }
        });
        Server { port, stall, stop, ranged, held }
    }

    pub fn url(&self, name: &str) -> String {
        format!("http://127.0.0.1:{}/{name}", self.port)
    }

    /// The server dies: it stops listening (new connections are refused) and closes each
    /// open connection at its next request, without an answer.
    pub fn kill(&self) {
        self.stop.store(true, Ordering::Release);
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
    }
}

/// One connection: requests in a row (keep-alive) until the client closes it.
fn serve(
    conn: TcpStream,
    files: &HashMap<String, Vec<u8>>,
    stall: &AtomicBool,
    stop: &AtomicBool,
    ranged: &AtomicUsize,
    held: &AtomicUsize,
) {
    let mut out = conn.try_clone().unwrap();
    let mut r = BufReader::new(conn);
    loop {
        let mut line = String::new();
        if r.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let mut range = None;
        loop {
            let mut h = String::new();
            if r.read_line(&mut h).unwrap_or(0) == 0 {
                return;
            }
            let h = h.trim_end();
            if h.is_empty() {
                break;
            }
            if let Some(v) = h.to_ascii_lowercase().strip_prefix("range: bytes=") {
                let (a, b) = v.split_once('-').unwrap();
                range = Some((a.parse::<usize>().unwrap(), b.parse::<usize>().unwrap()));
            }
        }
        if stop.load(Ordering::Acquire) {
            return; // killed: the connection closes without an answer
        }
        if stall.load(Ordering::Acquire) {
            held.fetch_add(1, Ordering::Relaxed);
            // Hold the connection open and say nothing.
            while !stop.load(Ordering::Acquire) {
                std::thread::sleep(Duration::from_millis(50));
            }
            return;
        }
        let mut parts = line.split_whitespace();
        let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or("/"));
        let reply = match files.get(target.trim_start_matches('/')) {
            None => "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n".as_bytes().to_vec(),
            Some(body) => {
                let (status, bytes, extra) = match range {
                    Some((a, b)) => {
                        ranged.fetch_add(1, Ordering::Relaxed);
                        let b = b.min(body.len() - 1);
                        (
                            "206 Partial Content",
                            &body[a..=b],
                            format!("Content-Range: bytes {a}-{b}/{}\r\n", body.len()),
                        )
                    }
                    None => ("200 OK", &body[..], String::new()),
                };
                let mut m = format!("HTTP/1.1 {status}\r\nContent-Length: {}\r\n{extra}\r\n", bytes.len()).into_bytes();
                if method != "HEAD" {
                    m.extend_from_slice(bytes);
                }
                m
            }
        };
        if out.write_all(&reply).is_err() {
            return;
        }
    }
}

/// A shard of `n` small JPEG samples with labels, and its index.
pub fn shard(n: usize) -> (Vec<u8>, Vec<u8>) {
    let img = jpeg(&photo_sized("coffee", 32, 24), 32, 24, 80);
    let mut data = vec![];
    for i in 0..n {
        tar::append_member(&mut data, &format!("s{i:05}.jpg"), &img);
        tar::append_member(&mut data, &format!("s{i:05}.cls"), format!("{}", i % 3).as_bytes());
    }
    tar::finish(&mut data);
    let entries = index_members(&data, Path::new("shard.tar")).unwrap();
    assert_eq!(entries.len(), n);
    let idx = encode_index(&entries, data.len() as u64);
    (data, idx)
}
