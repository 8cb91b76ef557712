//! [`Batch`]: a delivered batch, a view of one pool buffer that returns to the pool on drop.

use super::*;

/// A finished batch: a view of one pool buffer. The buffer returns to the pool on drop.
pub struct Batch {
    pub(super) slot: crate::shell::grow::Lease<Arc<Slot>>,
    pub(super) sample_shape: [usize; 3],
    pub(super) dtype: DType,
    pub(super) layout: Layout,
    pub(super) epoch: u64,
    /// Ids per caption of an image-text pair batch (0: images alone).
    pub(super) context_length: usize,
    /// Classes per soft-label row of a mixed batch (0: hard labels only).
    pub(super) num_classes: usize,
}

impl std::fmt::Debug for Batch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Batch")
            .field("index", &self.index())
            .field("shape", &self.shape())
            .field("dtype", &self.dtype)
            .finish()
    }
}

impl Batch {
    pub(super) fn slot(&self) -> &Slot {
        &self.slot
    }

    /// Samples in this batch (shorter than the batch size when samples were skipped, or at
    /// the end of an epoch without `drop_last`).
    pub fn len(&self) -> usize {
        self.slot().len.load(Ordering::Acquire)
    }

    /// Whether the batch is empty (never, for delivered batches).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Batch number within the epoch.
    pub fn index(&self) -> usize {
        self.slot().batch.load(Ordering::Relaxed)
    }

    /// The epoch.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Shape `[N, C, H, W]` or `[N, H, W, C]`.
    pub fn shape(&self) -> [usize; 4] {
        let s = self.sample_shape;
        [self.len(), s[0], s[1], s[2]]
    }

    /// Element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Layout.
    pub fn layout(&self) -> Layout {
        self.layout
    }

    /// The batch's bytes (native-endian elements of [`Batch::dtype`]).
    pub fn data(&self) -> &[u8] {
        self.slot().data()
    }

    /// Address of the first byte (stable while the batch lives; for zero-copy hand-off).
    pub fn data_ptr(&self) -> *const u8 {
        self.slot().data.as_ptr()
    }

    /// Address of the labels (stable while the batch lives; for zero-copy hand-off).
    pub fn labels_ptr(&self) -> *const i64 {
        self.slot().labels().as_ptr()
    }

    /// The labels, one per sample.
    pub fn labels(&self) -> &[i64] {
        self.slot().labels()
    }

    /// The dataset indices of the samples, in batch order.
    pub fn indices(&self) -> Vec<u32> {
        self.slot().indices().collect()
    }

    /// Ids per caption row of an image-text pair batch; 0 for images alone.
    pub fn context_length(&self) -> usize {
        self.context_length
    }

    /// An image-text pair batch's caption ids, `[len, context_length]` row by row (start of
    /// text, the caption's ids, end of text, padding); empty for images alone.
    pub fn input_ids(&self) -> &[i32] {
        self.caption_rows(0)
    }

    /// An image-text pair batch's attention mask, `[len, context_length]` (1 for the caption's
    /// ids, 0 for padding); empty for images alone.
    pub fn attention_mask(&self) -> &[i32] {
        self.caption_rows(1)
    }

    /// Classes per row of [`Batch::targets`]; 0 without batch mixing.
    pub fn num_classes(&self) -> usize {
        self.num_classes
    }

    /// A mixed batch's soft labels (MixUp/CutMix, `batch_transform`): float32 `[len,
    /// num_classes]` row by row; empty without batch mixing.
    pub fn targets(&self) -> &[f32] {
        if self.num_classes == 0 {
            return &[];
        }
        let b = self.slot().extra(0);
        // SAFETY: the region holds `len * num_classes` float32 values written by the thread
        // that completed the batch (no writer now), at the start of a 64-aligned buffer.
        unsafe { std::slice::from_raw_parts(b.as_ptr().cast::<f32>(), b.len() / 4) }
    }

    fn caption_rows(&self, k: usize) -> &[i32] {
        if self.context_length == 0 {
            return &[];
        }
        let b = self.slot().extra(k);
        // SAFETY: the region holds `len * context_length` int32 values written by the workers
        // (a completed batch: no writer), at the start of a 64-aligned buffer.
        unsafe { std::slice::from_raw_parts(b.as_ptr().cast::<i32>(), b.len() / 4) }
    }
}

/// What a GPU image batch carries besides its bytes.
#[derive(Debug, Clone)]
pub struct ImageMeta {
    /// Batch number within the epoch.
    pub index: usize,
    /// The epoch.
    pub epoch: u64,
    /// Shape `[N, C, H, W]` or `[N, H, W, C]`.
    pub shape: [usize; 4],
    /// Element type of the images.
    pub dtype: DType,
    /// Layout of the images.
    pub layout: Layout,
    /// Dataset indices of the samples.
    pub indices: Vec<u32>,
    /// Ids per caption row of an image-text pair batch (0: images alone).
    pub context_length: usize,
    /// Classes per row of a mixed batch's soft labels (0: not mixed).
    pub num_classes: usize,
}

impl crate::shell::kind::HostBatch for Batch {
    type Meta = ImageMeta;

    fn regions(&self, out: &mut Vec<(*const u8, usize)>) {
        let data = self.data();
        out.push((data.as_ptr(), data.len()));
        out.push((self.labels_ptr().cast::<u8>(), self.len() * 8));
        if self.context_length > 0 {
            for rows in [self.input_ids(), self.attention_mask()] {
                out.push((rows.as_ptr().cast::<u8>(), rows.len() * 4));
            }
        }
        if self.num_classes > 0 {
            let t = self.targets();
            out.push((t.as_ptr().cast::<u8>(), t.len() * 4));
        }
    }

    fn deferred(&self, out: &mut Vec<std::ops::Range<usize>>) {
        let sb = self.slot().sample_bytes;
        out.extend(self.slot().deferred().map(|p| p * sb..(p + 1) * sb));
    }

    fn meta(&self) -> ImageMeta {
        ImageMeta {
            index: self.index(),
            epoch: self.epoch(),
            shape: self.shape(),
            dtype: self.dtype(),
            layout: self.layout(),
            indices: self.indices(),
            context_length: self.context_length,
            num_classes: self.num_classes,
        }
    }
}
