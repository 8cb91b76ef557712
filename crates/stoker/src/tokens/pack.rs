//! Packing tokenized documents into rows of `seq_len` tokens.
//!
//! Both packers write, per row: `input_ids`; `labels`, where `labels[i]` is the token that
//! follows `input_ids[i]` in its document (`-100` after a document's last token and on
//! padding); `position_ids`, restarting at 0 at each segment (a document, or the part of one
//! that a row starts with); and the segment lengths (`cu_seqlens`, FlashAttention's
//! variable-length boundaries: padding is a segment of its own, so the last boundary is the
//! batch's token count).
//!
//! - [`Concat`]: documents joined (each already ends with the EOS token when `add_eos`) and
//!   cut into rows; nothing is padded, only the epoch's tail (less than a row) is dropped.
//! - [`BestFit`]: whole documents placed into rows by best-fit decreasing over a block of
//!   `window` consecutive documents (one longer than a row is split into row-long pieces);
//!   the rest of each row is padding.
//!
//! Packing is a pure function of the document stream, so batches do not depend on the thread
//! count, and a [`Resume`] point (where the next row starts) continues bit for bit.

use std::collections::VecDeque;

/// The label of a position that predicts nothing.
pub const IGNORE: i32 = -100;

/// A tokenized document in the stream (failed documents come as empty ones: they still take
/// their place in the order).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Doc {
    /// The epoch whose order it belongs to.
    pub epoch: u64,
    /// Its position in this rank's order of that epoch.
    pub cursor: u64,
    /// Its tokens (BOS/EOS included).
    pub tokens: Vec<u32>,
}

/// Where the next row starts: the document at `cursor` of `epoch`'s order, and `offset`: the
/// tokens of it already used ([`Concat`]) or the rows of its block already delivered
/// ([`BestFit`], whose `cursor` is a block's first document).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Resume {
    /// The epoch.
    pub epoch: u64,
    /// The document position in this rank's order.
    pub cursor: u64,
    /// Tokens or rows already used, see above.
    pub offset: u64,
}

/// One row's destination.
pub struct RowOut<'a> {
    /// `input_ids` of the row (`seq_len`).
    pub input: &'a mut [i32],
    /// `labels`.
    pub labels: &'a mut [i32],
    /// `position_ids`.
    pub positions: &'a mut [i32],
    /// Segment lengths of the row are appended here.
    pub segments: &'a mut Vec<u32>,
}

/// What a row holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RowInfo {
    /// Document tokens in it.
    pub tokens: usize,
    /// Padding tokens.
    pub pad: usize,
    /// Documents split because they were longer than a row ([`BestFit`]).
    pub split: usize,
}

/// Writes `tokens[from..from + n]` at `at`: ids, next-token labels within the document, and
/// positions from 0.
fn write_piece(out: &mut RowOut<'_>, at: usize, tokens: &[u32], from: usize, n: usize) {
    let input = &mut out.input[at..at + n];
    for (o, &t) in input.iter_mut().zip(&tokens[from..from + n]) {
        *o = t as i32;
    }
    // Each label is the next token; only the document's last token has none.
    let next = &tokens[(from + 1).min(tokens.len())..(from + n + 1).min(tokens.len())];
    let labels = &mut out.labels[at..at + n];
    for (o, &t) in labels.iter_mut().zip(next) {
        *o = t as i32;
    }
    labels[next.len()..].fill(IGNORE);
    for (k, p) in out.positions[at..at + n].iter_mut().enumerate() {
        *p = k as i32;
    }
    out.segments.push(n as u32);
}

/// Fills `out` from `at` to the end with padding: one segment.
fn pad(out: &mut RowOut<'_>, at: usize, pad_id: u32) -> usize {
    let n = out.input.len() - at;
    if n > 0 {
        out.input[at..].fill(pad_id as i32);
        out.labels[at..].fill(IGNORE);
        for (k, p) in out.positions[at..].iter_mut().enumerate() {
            *p = k as i32;
        }
        out.segments.push(n as u32);
    }
    n
}

/// The document stream a packer pulls from; `None` at its end.
pub type Pull<'a> = dyn FnMut() -> Option<Doc> + 'a;

/// Documents joined and cut into rows.
#[derive(Debug)]
pub struct Concat {
    /// Documents (and the tokens of each already used) not yet fully in rows.
    queue: VecDeque<(Doc, usize)>,
    /// Where the document after the last pulled one is.
    after: Resume,
    /// Tokens of the first pulled document to skip (a resumed stream).
    skip: usize,
}

impl Concat {
    /// A packer whose stream starts at `from` (the reader starts at `from.cursor`).
    pub fn new(from: Resume) -> Self {
        Concat { queue: VecDeque::new(), after: from, skip: from.offset as usize }
    }

    /// Where the next row starts.
    pub fn resume(&self) -> Resume {
        match self.queue.front() {
            Some((d, used)) => Resume { epoch: d.epoch, cursor: d.cursor, offset: *used as u64 },
            None => self.after,
        }
    }

    /// Packs the next row; `None` at the end of the stream (a partial row is dropped: the
    /// tokens it would have held are returned in the `Err`).
    pub fn row(&mut self, pull: &mut Pull<'_>, mut out: RowOut<'_>) -> Result<RowInfo, usize> {
        let len = out.input.len();
        let mut at = 0;
        while at < len {
            while self.queue.front().is_none_or(|(d, used)| *used >= d.tokens.len()) {
                if self.queue.pop_front().is_some() {
                    continue;
                }
                let Some(d) = pull() else {
                    out.segments.clear();
                    return Err(at);
                };
                self.after = Resume { epoch: d.epoch, cursor: d.cursor + 1, offset: 0 };
                let used = std::mem::take(&mut self.skip).min(d.tokens.len());
                self.queue.push_back((d, used));
            }
            let (d, used) = self.queue.front_mut().expect("a document");
            let n = (len - at).min(d.tokens.len() - *used);
            write_piece(&mut out, at, &d.tokens, *used, n);
            *used += n;
            at += n;
        }
        Ok(RowInfo { tokens: len, pad: 0, split: 0 })
    }
}

/// A piece of a document in a row: `(document in the block, first token, tokens)`.
pub type Piece = (usize, usize, usize);

/// Best-fit decreasing of one block of documents of `lens` tokens into rows of `len`: pieces
/// of at most a row, longest first (ties keep the stream's order), each into the row with the
/// least room that holds it, else a new row. Rows in the order they were opened.
pub fn plan_rows(lens: &[usize], len: usize) -> Vec<Vec<Piece>> {
    let mut items: Vec<Piece> = Vec::new();
    for (k, &n) in lens.iter().enumerate() {
        let mut s = 0;
        while s < n {
            let m = (n - s).min(len);
            items.push((k, s, m));
            s += m;
        }
    }
    items.sort_by_key(|&(_, _, n)| std::cmp::Reverse(n));
    let mut bins: Vec<(usize, Vec<Piece>)> = Vec::new();
    for it in items {
        let best = bins.iter().enumerate().filter(|(_, (free, _))| *free >= it.2).min_by_key(|(_, (free, _))| *free);
        match best {
            Some((i, _)) => {
                bins[i].0 -= it.2;
                bins[i].1.push(it);
            }
            None => bins.push((len - it.2, vec![it])),
        }
    }
    bins.into_iter().map(|(_, r)| r).collect()
}

/// Whole documents placed into rows by best-fit decreasing over blocks of documents.
#[derive(Debug)]
pub struct BestFit {
    window: u64,
    pad_id: u32,
    /// The documents of the current block.
    docs: Vec<Doc>,
    /// Rows of the current block not yet delivered.
    rows: VecDeque<Vec<Piece>>,
    /// The current block's start and rows delivered from it.
    block: Resume,
    /// The first document of the next block, pulled while looking for the end of this one.
    ahead: Option<Doc>,
    /// Where the stream continues when nothing is pulled ahead.
    after: Resume,
    /// Rows of the first block to skip (a resumed stream).
    skip: u64,
    ended: bool,
}

impl BestFit {
    /// A packer over blocks of `window` documents whose stream starts at `from`, a block's
    /// start; rows are padded with `pad_id`.
    pub fn new(window: u64, pad_id: u32, from: Resume) -> Self {
        BestFit {
            window: window.max(1),
            pad_id,
            docs: Vec::new(),
            rows: VecDeque::new(),
            block: Resume { offset: 0, ..from },
            ahead: None,
            after: from,
            skip: from.offset,
            ended: false,
        }
    }

    /// Where the next row starts.
    pub fn resume(&self) -> Resume {
        if !self.rows.is_empty() {
            return self.block;
        }
        match &self.ahead {
            Some(d) => Resume { epoch: d.epoch, cursor: d.cursor / self.window * self.window, offset: 0 },
            None => self.after,
        }
    }

    /// Pulls the next block and packs it into rows; false at the end of the stream.
    fn next_block(&mut self, pull: &mut Pull<'_>, len: usize) -> bool {
        self.docs.clear();
        let first = match self.ahead.take().or_else(|| if self.ended { None } else { pull() }) {
            Some(d) => d,
            None => {
                self.ended = true;
                return false;
            }
        };
        let (epoch, b) = (first.epoch, first.cursor / self.window);
        self.block = Resume { epoch, cursor: b * self.window, offset: 0 };
        self.after = Resume { epoch, cursor: first.cursor + 1, offset: 0 };
        self.docs.push(first);
        while !self.ended {
            match pull() {
                Some(d) if d.epoch == epoch && d.cursor / self.window == b => {
                    self.after = Resume { epoch, cursor: d.cursor + 1, offset: 0 };
                    self.docs.push(d);
                }
                Some(d) => {
                    self.ahead = Some(d);
                    break;
                }
                None => self.ended = true,
            }
        }
        let lens: Vec<usize> = self.docs.iter().map(|d| d.tokens.len()).collect();
        self.rows = plan_rows(&lens, len).into();
        let skip = std::mem::take(&mut self.skip).min(self.rows.len() as u64);
        self.rows.drain(..skip as usize);
        self.block.offset = skip;
        true
    }

    /// Packs the next row; `Err(0)` at the end of the stream.
    pub fn row(&mut self, pull: &mut Pull<'_>, mut out: RowOut<'_>) -> Result<RowInfo, usize> {
        let len = out.input.len();
        while self.rows.is_empty() {
            if !self.next_block(pull, len) {
                return Err(0);
            }
        }
        let row = self.rows.pop_front().expect("a row");
        self.block.offset += 1;
        let mut info = RowInfo::default();
        let mut at = 0;
        for (k, s, n) in row {
            let d = &self.docs[k];
            write_piece(&mut out, at, &d.tokens, s, n);
            if s == 0 && n < d.tokens.len() {
                info.split += 1;
            }
            at += n;
        }
        info.tokens = at;
        info.pad = pad(&mut out, at, self.pad_id);
        Ok(info)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn docs(lens: &[usize]) -> Vec<Doc> {
        let mut next = 0u32;
        lens.iter()
            .enumerate()
            .map(|(c, &n)| {
                let tokens = (0..n).map(|_| {
                    next += 1;
                    next
                });
                Doc { epoch: 0, cursor: c as u64, tokens: tokens.collect() }
            })
            .collect()
    }

    struct Rows {
        input: Vec<Vec<i32>>,
        labels: Vec<Vec<i32>>,
        positions: Vec<Vec<i32>>,
        segments: Vec<Vec<u32>>,
    }

    /// Every row of a packer over `stream`, and the resume point before each.
    fn run(
        stream: &[Doc],
        len: usize,
        mut row: impl FnMut(&mut Pull<'_>, RowOut<'_>) -> Result<RowInfo, usize>,
    ) -> Rows {
        let mut it = stream.iter().cloned();
        let mut pull = move || it.next();
        let mut r = Rows { input: vec![], labels: vec![], positions: vec![], segments: vec![] };
        loop {
            let (mut i, mut l, mut p, mut s) = (vec![0; len], vec![0; len], vec![0; len], vec![]);
            let out = RowOut { input: &mut i, labels: &mut l, positions: &mut p, segments: &mut s };
            if row(&mut pull, out).is_err() {
                return r;
            }
            r.input.push(i);
            r.labels.push(l);
            r.positions.push(p);
            r.segments.push(s);
        }
    }

    #[test]
    fn concat_hand_checked() {
        // Documents [1 2 3] [4 5] [6 7 8 9 10] cut into rows of 4; the tail [9 10] is dropped.
        let stream = docs(&[3, 2, 5]);
        let mut c = Concat::new(Resume::default());
        let r = run(&stream, 4, |p, o| c.row(p, o));
        assert_eq!(r.input, vec![vec![1, 2, 3, 4], vec![5, 6, 7, 8]]);
        assert_eq!(r.labels, vec![vec![2, 3, -100, 5], vec![-100, 7, 8, 9]]);
        assert_eq!(r.positions, vec![vec![0, 1, 2, 0], vec![0, 0, 1, 2]]);
        assert_eq!(r.segments, vec![vec![3, 1], vec![1, 3]]);
    }

    #[test]
    fn best_fit_hand_checked() {
        // Rows of 4, one block: [1..=5] splits into [1 2 3 4] + [5]; longest first: [1 2 3 4]
        // fills row 0, [6 7 8] opens row 1, [9 10] opens row 2 (row 1 has room for 1), [5]
        // goes where the least room is left (row 1), [11] into row 2, padded.
        let stream = docs(&[5, 3, 2, 1]);
        let mut b = BestFit::new(16, 0, Resume::default());
        let r = run(&stream, 4, |p, o| b.row(p, o));
        assert_eq!(r.input, vec![vec![1, 2, 3, 4], vec![6, 7, 8, 5], vec![9, 10, 11, 0]]);
        assert_eq!(r.labels, vec![vec![2, 3, 4, 5], vec![7, 8, -100, -100], vec![10, -100, -100, -100]]);
        assert_eq!(r.positions, vec![vec![0, 1, 2, 3], vec![0, 1, 2, 0], vec![0, 1, 0, 0]]);
        assert_eq!(r.segments, vec![vec![4], vec![3, 1], vec![2, 1, 1]]);
    }

    /// Every token of the stream, in some row exactly once (concat: but the tail).
    #[test]
    fn no_token_lost_or_repeated() {
        let lens: Vec<usize> = (0..200).map(|i| (i * 37 % 23) + (i % 5) * 11).collect();
        let stream = docs(&lens);
        let total: usize = lens.iter().sum();
        for len in [1, 7, 64] {
            let mut c = Concat::new(Resume::default());
            let r = run(&stream, len, |p, o| c.row(p, o));
            let got: Vec<i32> = r.input.concat();
            assert_eq!(got, (1..=got.len() as i32).collect::<Vec<_>>());
            assert!(total - got.len() < len, "only the tail is dropped");
            for window in [1, 8, 1000] {
                let mut b = BestFit::new(window, 0, Resume::default());
                let r = run(&stream, len, |p, o| b.row(p, o));
                let mut got: Vec<i32> = r.input.concat().into_iter().filter(|&t| t != 0).collect();
                got.sort();
                assert_eq!(got, (1..=total as i32).collect::<Vec<_>>(), "window {window}");
            }
        }
    }

    /// Resuming at every row gives the rows an uninterrupted stream gives from there.
    #[test]
    fn resume_at_every_row() {
        let lens: Vec<usize> = (0..40).map(|i| (i * 13 % 17) + 1).collect();
        let stream = docs(&lens);
        for best_fit in [false, true] {
            let make = |from: Resume| -> Packer<'static> {
                if best_fit {
                    let mut b = BestFit::new(6, 0, from);
                    Box::new(move |p, o| {
                        let r = b.row(p, o);
                        (r, b.resume())
                    })
                } else {
                    let mut c = Concat::new(from);
                    Box::new(move |p, o| {
                        let r = c.row(p, o);
                        (r, c.resume())
                    })
                }
            };
            let whole = rows_with_resumes(&stream, make(Resume::default()), Resume::default());
            for (k, from) in whole.1.iter().enumerate() {
                let rest = rows_with_resumes(&stream, make(*from), *from);
                assert_eq!(rest.0[..], whole.0[k + 1..], "best_fit {best_fit}, after row {k}");
            }
        }
    }

    type Packer<'a> = Box<dyn FnMut(&mut Pull<'_>, RowOut<'_>) -> (Result<RowInfo, usize>, Resume) + 'a>;

    /// Rows `(input, labels, positions)` from `from` (the stream read from `from.cursor`), and
    /// the resume point after each.
    fn rows_with_resumes(stream: &[Doc], mut p: Packer<'_>, from: Resume) -> (Vec<[Vec<i32>; 3]>, Vec<Resume>) {
        let mut it = stream.iter().filter(|d| d.cursor >= from.cursor).cloned();
        let mut pull = move || it.next();
        let (mut rows, mut resumes) = (vec![], vec![]);
        loop {
            let (mut i, mut l, mut q, mut s) = (vec![0; 5], vec![0; 5], vec![0; 5], vec![]);
            let (r, at) = p(&mut pull, RowOut { input: &mut i, labels: &mut l, positions: &mut q, segments: &mut s });
            if r.is_err() {
                return (rows, resumes);
            }
            rows.push([i, l, q]);
            resumes.push(at);
        }
    }
}
