//! Where shard bytes come from ([`Storage`]): local files (positioned reads, one `preadv` for
//! a member's header and data) or objects in a store (see [`super::remote`]), and why a read
//! failed ([`ReadFailure`]).
//!
//! Owns: reads of byte ranges of shards. May not touch: what the bytes mean (see
//! [`super::shards`]).

use super::fetch::{PartFetch, ReadFailure};
use super::storage_stats::StorageStats;
use std::os::unix::fs::FileExt;
use std::sync::Arc;

/// Where shard bytes come from: local files, or objects in a store.
pub(crate) trait Storage: Send + Sync {
    /// Reads exactly `buf.len()` bytes of shard `shard` at `offset`.
    fn read_at(&self, shard: usize, offset: u64, buf: &mut [u8]) -> std::result::Result<(), ReadFailure>;
    /// Reads exactly `head.len() + data.len()` bytes of shard `shard` at `offset`, the first
    /// into `head` and the rest into `data`, in one request; `None` where the storage has no
    /// such read (the caller then reads into one buffer and moves the data).
    fn read_split_at(
        &self,
        shard: usize,
        offset: u64,
        head: &mut [u8],
        data: &mut [u8],
    ) -> Option<std::result::Result<(), ReadFailure>> {
        let _ = (shard, offset, head, data);
        None
    }
    /// The shard's name for messages (a path or a URL).
    fn name(&self, shard: usize) -> &str;
    /// Whether each read is a request worth saving (an object store): a sample's image and
    /// caption, close together in the shard, are then read in one request.
    fn coalesce(&self) -> bool {
        false
    }
    /// Gives up the reads in flight (see [`Source::abandon_reads`]).
    fn abandon_reads(&self) {}
    /// Where parts of shards are fetched from, and the counters of the requests, when reads
    /// are worth planning (an object store: [`super::readahead`]); local files need none.
    fn parts(&self) -> Option<(Arc<dyn PartFetch>, Arc<StorageStats>)> {
        None
    }
}

/// The message for a read that ended before the bytes the index promised.
fn short_read(e: &std::io::Error) -> String {
    format!("{e}: the shard is shorter than its index says (truncated?)")
}

pub(crate) struct LocalFiles {
    pub(crate) names: Vec<String>,
    pub(crate) files: Vec<std::fs::File>,
}

impl Storage for LocalFiles {
    fn read_at(&self, shard: usize, offset: u64, buf: &mut [u8]) -> std::result::Result<(), ReadFailure> {
        self.files[shard].read_exact_at(buf, offset).map_err(|e| {
            ReadFailure::Failed(match e.kind() {
                std::io::ErrorKind::UnexpectedEof => short_read(&e),
                _ => e.to_string(),
            })
        })
    }

    /// One `preadv` into both buffers (repeated for what a short read left), so that a
    /// member's data lands where it is used without being moved past its tar header.
    #[cfg(target_os = "linux")]
    fn read_split_at(
        &self,
        shard: usize,
        offset: u64,
        head: &mut [u8],
        data: &mut [u8],
    ) -> Option<std::result::Result<(), ReadFailure>> {
        use std::os::fd::AsRawFd;
        let fd = self.files[shard].as_raw_fd();
        let total = head.len() + data.len();
        let mut done = 0;
        while done < total {
            let iov = |b: &mut [u8]| libc::iovec { iov_base: b.as_mut_ptr().cast(), iov_len: b.len() };
            let (vecs, count) = if done < head.len() {
                ([iov(&mut head[done..]), iov(&mut *data)], 2)
            } else {
                ([iov(&mut data[done - head.len()..]), iov(&mut [])], 1)
            };
            let Ok(at) = libc::off_t::try_from(offset + done as u64) else {
                return Some(Err(format!("offset {} is past what this system can read", offset + done as u64).into()));
            };
            // SAFETY: the first `count` iovecs point into `head` and `data`, which are
            // exclusively borrowed here and outlive the call; `fd` is an open file of `self`.
            let n = unsafe { libc::preadv(fd, vecs.as_ptr(), count, at) };
            if n < 0 {
                let e = std::io::Error::last_os_error();
                if e.kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                return Some(Err(e.to_string().into()));
            }
            if n == 0 {
                let e = std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "failed to fill whole buffer");
                return Some(Err(short_read(&e).into()));
            }
            done += n as usize;
        }
        Some(Ok(()))
    }

    fn name(&self, shard: usize) -> &str {
        &self.names[shard]
    }
}

/// One shard's metadata for [`ShardSource::assemble`].
pub(crate) struct ShardMeta {
    /// Shard name (path or URL).
    pub name: String,
    /// Shard size in bytes.
    pub size: u64,
    /// Index name (path or URL) and its bytes, or why it could not be read.
    pub index: (String, std::result::Result<Vec<u8>, String>),
}
