//! Crash simulator (README, "How crash safety is shown"): a [`Space`] over shadow memory that can
//! produce the images a machine could hold after a crash.
//!
//! # Model (x86 persistency, one cache line = 64 bytes)
//!
//! The simulator keeps two byte arrays of the same length:
//!
//! - *current*: what the program sees through `load`/`read`, i.e. the CPU
//!   caches plus memory;
//! - *persisted*: what is certain to survive a power failure.
//!
//! A line is *in flight* once it is stored to (`store`, `write`, `zero`) and
//! stays so until a fence has made its current content persistent. A `flush`
//! (`clwb`) of an in-flight line takes a *snapshot* of the line as it is at
//! that moment, tagged with the flushing thread and a global flush sequence
//! number; flushing a line with no stores since it was last persisted does
//! nothing. A `fence` (`sfence`) by thread T copies into *persisted* the
//! snapshots taken by T, and only those: a fence by another thread does not
//! order T's flushes. Stores after a flush are not covered by it: the fence
//! persists the flush-time snapshot and the line stays in flight with its
//! newer content. When two threads' snapshots of one line are pending, a
//! fence never lets an older snapshot overwrite a newer persisted one (the
//! newer write-back contains everything the older one did).
//!
//! Until persisted, an in-flight line may or may not have reached memory, so
//! after a crash it may hold its persisted content, its current content, or
//! any pending flush-time snapshot; and since only 8-byte stores are
//! failure-atomic, a partly written-back line may mix persisted and current
//! words.
//!
//! # Crash images
//!
//! With capture on ([`SimSpace::set_capture`]), every fence (before it takes
//! effect) and every [`Space::op_boundary`] generates crash images into a
//! queue drained by [`SimSpace::take_images`]:
//!
//! - [`ImageKind::Persisted`]: persisted data only;
//! - [`ImageKind::AllInFlight`]: every in-flight line at its current content
//!   (equals current memory: the process-crash model);
//! - [`ImageKind::Subset`]: each in-flight line at one of its possible
//!   contents: every combination when at most four lines are in flight,
//!   otherwise [`CaptureConfig::random_subsets`] seeded random ones;
//! - [`ImageKind::Torn`]: each 8-byte word of each in-flight line chosen
//!   independently between persisted and current.
//!
//! Images are deduplicated across the whole campaign by a 64-bit hash of
//! their contents ([`image_hash`]). The hash is a wrapping sum of per-line
//! hashes, so the hash of a candidate image is computed from the persisted
//! image's hash and the few lines it changes, and a duplicate is skipped
//! before it is ever built: a capture costs O(in-flight lines) plus one copy
//! of the space per new image. All randomness derives from
//! [`CaptureConfig::seed`] and the capture sequence number, so a campaign
//! is reproducible from its seed.
//!
//! # Checking the checker
//!
//! [`SimSpace::set_drop`] names one [`Point`]: every flush or fence with that
//! name does nothing, and [`SimSpace::drop_hits`] counts how often that
//! happened, so a campaign can tell whether the dropped point was exercised
//! at all. [`SimSpace::points_seen`] lists every point that was reached.

#![forbid(unsafe_code)]

mod capture;
mod hash;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fmt;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

use super::{counters, FlushKind, MappingKind, Point, Space, LINE};
use crate::error::Result;
pub use hash::image_hash;
use hash::{line_hash, lines_sum};

const LINE_BYTES: usize = LINE as usize;
const WORD: usize = 8;

/// The `point` of images captured at [`Space::op_boundary`].
pub const OP_BOUNDARY: &str = "op-boundary";

/// Up to this many varying in-flight lines, every combination is imaged.
const EXHAUSTIVE_LINES: usize = 4;
/// ... as long as the combinations (with snapshot choices) stay this few.
const EXHAUSTIVE_MAX_IMAGES: usize = 256;

static NEXT_THREAD: AtomicU64 = AtomicU64::new(1);

thread_local! {
    static THREAD_ID: u64 = NEXT_THREAD.fetch_add(1, Ordering::Relaxed);
}

/// A small process-unique id of the calling thread (flush ownership).
fn thread_id() -> u64 {
    THREAD_ID.with(|t| *t)
}

/// Which crash model produced an image.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ImageKind {
    /// Only persisted data survived.
    Persisted,
    /// Every in-flight line reached memory (process crash).
    AllInFlight,
    /// Some in-flight lines reached memory, whole lines at a time.
    Subset,
    /// In-flight lines reached memory partly, 8-byte word by word.
    Torn,
}

impl ImageKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ImageKind::Persisted => "persisted",
            ImageKind::AllInFlight => "all-in-flight",
            ImageKind::Subset => "subset",
            ImageKind::Torn => "torn",
        }
    }
}

impl fmt::Display for ImageKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One possible content of the space after a crash.
#[derive(Clone, PartialEq, Eq)]
pub struct CrashImage {
    pub kind: ImageKind,
    /// Name of the fence the image was captured before, or [`OP_BOUNDARY`].
    pub point: &'static str,
    /// Capture sequence number (1 for the first capture of this space).
    pub seq: u64,
    /// The whole space, `size()` bytes.
    pub data: Vec<u8>,
}

impl fmt::Debug for CrashImage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CrashImage")
            .field("kind", &self.kind)
            .field("point", &self.point)
            .field("seq", &self.seq)
            .field("len", &self.data.len())
            .field("hash", &format_args!("{:016x}", image_hash(&self.data)))
            .finish()
    }
}

/// What crash images to generate at each capture.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CaptureConfig {
    /// Seed of every random choice.
    pub seed: u64,
    /// Random subset images per capture when more than four lines are in
    /// flight (with four or fewer, all combinations are generated).
    pub random_subsets: usize,
    /// Torn-word images per capture.
    pub torn: usize,
}

impl Default for CaptureConfig {
    fn default() -> Self {
        CaptureConfig {
            seed: 0,
            random_subsets: 8,
            torn: 4,
        }
    }
}

impl CaptureConfig {
    /// Default settings with this seed.
    pub fn new(seed: u64) -> CaptureConfig {
        CaptureConfig {
            seed,
            ..CaptureConfig::default()
        }
    }
}

/// A line's content at the time one thread flushed it.
struct Snapshot {
    thread: u64,
    /// Global flush sequence number: orders snapshots of one line.
    seq: u64,
    /// The line's bytes (the line's length when flushed: the last line of a
    /// space whose size is not a multiple of 64 may be short).
    bytes: Vec<u8>,
}

/// An in-flight line.
#[derive(Default)]
struct LineState {
    /// Flushed, not yet fenced: at most one per thread. Every pending
    /// snapshot is newer than the line's persisted content (persisting one
    /// discards the older ones), so a fence never moves a line back in time.
    pending: Vec<Snapshot>,
}

// Model: `cur` is what the program sees, `persisted` what survives any crash.
// Invariant: every line whose `cur` bytes differ from its `persisted` bytes,
// or that has a pending snapshot, is a key of `lines`; a line leaves `lines`
// only when a fence leaves it with no pending snapshot and `cur == persisted`.
// `pending_by_thread[t]` lists (possibly with repeats or stale entries) the
// lines where thread `t` has a pending snapshot, so a fence visits only
// those. `persisted_sum`, when known, is the wrapping sum of `line_hash` over
// every line of `persisted`, kept up to date as lines persist.
struct State {
    cur: Vec<u8>,
    persisted: Vec<u8>,
    lines: BTreeMap<u64, LineState>,
    pending_by_thread: HashMap<u64, Vec<u64>>,
    flush_seq: u64,
    persisted_sum: Option<u64>,

    drop: Option<String>,
    drop_hits: u64,
    points_seen: BTreeSet<&'static str>,

    capture: Option<CaptureConfig>,
    capture_seq: u64,
    seen: HashSet<u64>,
    queue: Vec<CrashImage>,
    images_generated: u64,
    images_duplicate: u64,
}

/// Shadow-memory [`Space`] that tracks persistence per cache line and
/// generates crash images (see the module documentation).
pub struct SimSpace {
    state: Mutex<State>,
}

impl SimSpace {
    /// A space of `size` zero bytes, all persisted.
    pub fn new(size: u64) -> SimSpace {
        SimSpace::from_image(vec![0; to_usize(size)])
    }

    /// A space holding `data`, both current and persisted: a freshly
    /// recovered machine (e.g. one booted from a crash image).
    pub fn from_image(data: Vec<u8>) -> SimSpace {
        SimSpace {
            state: Mutex::new(State {
                cur: data.clone(),
                persisted: data,
                lines: BTreeMap::new(),
                pending_by_thread: HashMap::new(),
                flush_seq: 0,
                persisted_sum: None,
                drop: None,
                drop_hits: 0,
                points_seen: BTreeSet::new(),
                capture: None,
                capture_seq: 0,
                seen: HashSet::new(),
                queue: Vec::new(),
                images_generated: 0,
                images_duplicate: 0,
            }),
        }
    }

    /// Makes every flush and fence named `name` do nothing (`None`: drop
    /// nothing). Resets [`SimSpace::drop_hits`].
    pub fn set_drop(&self, name: Option<String>) {
        let mut s = self.state.lock();
        s.drop = name;
        s.drop_hits = 0;
    }

    /// How many flushes and fences were dropped since the last `set_drop`.
    pub fn drop_hits(&self) -> u64 {
        self.state.lock().drop_hits
    }

    /// Every point name passed to `flush` or `fence` so far.
    pub fn points_seen(&self) -> BTreeSet<&'static str> {
        self.state.lock().points_seen.clone()
    }

    /// Turns crash-image capture on (with these settings) or off. The set of
    /// already seen image hashes is kept; see [`SimSpace::reset_dedup`].
    pub fn set_capture(&self, cfg: Option<CaptureConfig>) {
        self.state.lock().capture = cfg;
    }

    /// Forgets which images were already generated.
    pub fn reset_dedup(&self) {
        self.state.lock().seen.clear();
    }

    /// Drains the queue of captured images, oldest first.
    pub fn take_images(&self) -> Vec<CrashImage> {
        std::mem::take(&mut self.state.lock().queue)
    }

    /// Images queued so far (each distinct from all earlier ones).
    pub fn images_generated(&self) -> u64 {
        self.state.lock().images_generated
    }

    /// Candidate images skipped because an identical one was generated before.
    pub fn images_duplicate(&self) -> u64 {
        self.state.lock().images_duplicate
    }

    /// Number of lines currently in flight (stored to and not yet persisted).
    pub fn in_flight_lines(&self) -> usize {
        self.state.lock().lines.len()
    }

    /// Captures now, as at an operation boundary but with this point name.
    /// Does nothing when capture is off.
    pub fn capture_now(&self, point: &'static str) {
        self.state.lock().capture(point);
    }

    /// What survives a crash for certain.
    pub fn persisted_image(&self) -> Vec<u8> {
        self.state.lock().persisted.clone()
    }

    /// What the program currently sees.
    pub fn current_image(&self) -> Vec<u8> {
        self.state.lock().cur.clone()
    }
}

impl Space for SimSpace {
    fn size(&self) -> u64 {
        self.state.lock().cur.len() as u64
    }

    fn load(&self, off: u64) -> u64 {
        let s = self.state.lock();
        let r = s.word_range("load", off);
        u64::from_le_bytes(s.cur[r].try_into().expect("8-byte word"))
    }

    fn store(&self, off: u64, val: u64) {
        let mut s = self.state.lock();
        let r = s.word_range("store", off);
        s.cur[r].copy_from_slice(&val.to_le_bytes());
        s.touch(off, 8);
    }

    fn read(&self, off: u64, buf: &mut [u8]) {
        let s = self.state.lock();
        let r = s.range("read", off, buf.len() as u64);
        buf.copy_from_slice(&s.cur[r]);
    }

    fn write(&self, off: u64, data: &[u8]) {
        let mut s = self.state.lock();
        let r = s.range("write", off, data.len() as u64);
        s.cur[r].copy_from_slice(data);
        s.touch(off, data.len() as u64);
    }

    fn zero(&self, off: u64, len: u64) {
        let mut s = self.state.lock();
        let r = s.range("zero", off, len);
        s.cur[r].fill(0);
        s.touch(off, len);
    }

    fn flush(&self, off: u64, len: u64, point: Point) {
        let mut s = self.state.lock();
        s.points_seen.insert(point.name);
        if s.dropped(point.name) {
            s.drop_hits += 1;
            return;
        }
        s.range("flush", off, len);
        if len == 0 {
            return;
        }
        let (first, last) = (off / LINE, (off + len - 1) / LINE);
        counters::add_flushes(last - first + 1);
        s.flush_lines(first..last + 1, thread_id());
    }

    fn fence(&self, point: Point) {
        let mut s = self.state.lock();
        s.points_seen.insert(point.name);
        // A crash just before the fence: its flushes are still pending. A
        // dropped fence is captured too (the crash point exists all the same).
        s.capture(point.name);
        if s.dropped(point.name) {
            s.drop_hits += 1;
            return;
        }
        counters::add_fence();
        s.fence_thread(thread_id());
    }

    fn grow(&self, new_size: u64) -> Result<()> {
        let mut s = self.state.lock();
        let old = s.cur.len();
        let new = to_usize(new_size);
        if new <= old {
            return Ok(());
        }
        s.cur.resize(new, 0);
        s.persisted.resize(new, 0);
        if let Some(mut sum) = s.persisted_sum {
            // The old partial last line hashes the same (it was zero padded),
            // so only whole new lines add to the sum.
            let first_new = old.div_ceil(LINE_BYTES);
            for idx in first_new..new.div_ceil(LINE_BYTES) {
                let r = line_range(new, idx as u64);
                sum = sum.wrapping_add(line_hash(idx as u64, &s.persisted[r]));
            }
            s.persisted_sum = Some(sum);
        }
        Ok(())
    }

    fn op_boundary(&self) {
        self.state.lock().capture(OP_BOUNDARY);
    }

    fn flush_kind(&self) -> FlushKind {
        FlushKind::None
    }

    fn mapping(&self) -> MappingKind {
        MappingKind::Simulated
    }
}

impl State {
    fn dropped(&self, name: &str) -> bool {
        self.drop.as_deref() == Some(name)
    }

    /// Byte range `[off, off+len)`, panicking if it is out of bounds.
    fn range(&self, what: &str, off: u64, len: u64) -> Range<usize> {
        let size = self.cur.len() as u64;
        match off.checked_add(len) {
            Some(end) if end <= size => off as usize..end as usize,
            _ => {
                panic!("SimSpace::{what}: access [{off}, {off}+{len}) beyond the space size {size}")
            }
        }
    }

    /// The aligned 8-byte word at `off`, panicking if unaligned or out of bounds.
    fn word_range(&self, what: &str, off: u64) -> Range<usize> {
        assert!(off & 7 == 0, "SimSpace::{what}: offset {off} is not 8-byte aligned");
        self.range(what, off, 8)
    }

    /// Marks every line overlapping `[off, off+len)` in flight.
    fn touch(&mut self, off: u64, len: u64) {
        if len == 0 {
            return;
        }
        for idx in off / LINE..=(off + len - 1) / LINE {
            self.lines.entry(idx).or_default();
        }
    }

    /// Snapshots the in-flight lines among `lines` for thread `tid`.
    fn flush_lines(&mut self, lines: Range<u64>, tid: u64) {
        let State {
            cur,
            lines: tracked,
            pending_by_thread,
            flush_seq,
            ..
        } = self;
        // Only in-flight lines matter: flushing a clean line is harmless.
        for (&idx, ls) in tracked.range_mut(lines) {
            *flush_seq += 1;
            let bytes = cur[line_range(cur.len(), idx)].to_vec();
            match ls.pending.iter_mut().find(|p| p.thread == tid) {
                Some(p) => {
                    p.seq = *flush_seq;
                    p.bytes = bytes;
                }
                None => {
                    ls.pending.push(Snapshot {
                        thread: tid,
                        seq: *flush_seq,
                        bytes,
                    });
                    pending_by_thread.entry(tid).or_default().push(idx);
                }
            }
        }
    }

    /// Persists thread `tid`'s pending snapshots.
    fn fence_thread(&mut self, tid: u64) {
        let Some(idxs) = self.pending_by_thread.remove(&tid) else {
            return;
        };
        let size = self.cur.len();
        for idx in idxs {
            let Some(ls) = self.lines.get_mut(&idx) else {
                continue;
            };
            let Some(pos) = ls.pending.iter().position(|p| p.thread == tid) else {
                continue; // repeated entry, or made stale by a newer snapshot
            };
            let snap = ls.pending.swap_remove(pos);
            let r = line_range(size, idx);
            if let Some(sum) = self.persisted_sum.as_mut() {
                *sum = sum.wrapping_sub(line_hash(idx, &self.persisted[r.clone()]));
            }
            let start = r.start;
            self.persisted[start..start + snap.bytes.len()].copy_from_slice(&snap.bytes);
            if let Some(sum) = self.persisted_sum.as_mut() {
                *sum = sum.wrapping_add(line_hash(idx, &self.persisted[r.clone()]));
            }
            // Older snapshots of other threads can no longer land: the
            // newer write-back contains everything they did.
            ls.pending.retain(|p| p.seq > snap.seq);
            if ls.pending.is_empty() && self.cur[r.clone()] == self.persisted[r] {
                self.lines.remove(&idx);
            }
        }
    }

    fn persisted_sum(&mut self) -> u64 {
        if let Some(sum) = self.persisted_sum {
            return sum;
        }
        let sum = lines_sum(&self.persisted);
        self.persisted_sum = Some(sum);
        sum
    }
}

/// Byte range of line `idx` in a space of `size` bytes.
fn line_range(size: usize, idx: u64) -> Range<usize> {
    let start = idx as usize * LINE_BYTES;
    start..(start + LINE_BYTES).min(size)
}

fn to_usize(v: u64) -> usize {
    usize::try_from(v).unwrap_or_else(|_| panic!("SimSpace: size {v} does not fit in memory"))
}
