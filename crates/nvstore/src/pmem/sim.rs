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

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fmt;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::{counters, FlushKind, MappingKind, Point, Space, LINE};
use crate::error::Result;

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

    /// Generates this moment's crash images (when capture is on).
    fn capture(&mut self, point: &'static str) {
        let Some(cfg) = self.capture else {
            return;
        };
        self.capture_seq += 1;
        let seq = self.capture_seq;
        let base = self.persisted_sum();
        let size = self.cur.len();

        // Every in-flight line with more than one possible content.
        let mut vars: Vec<VarLine> = Vec::new();
        for (&idx, ls) in &self.lines {
            let r = line_range(size, idx);
            let p = &self.persisted[r.clone()];
            let c = &self.cur[r.clone()];
            let mut cands = vec![Cand::new(idx, p.to_vec())];
            let mut current = 0;
            if c != p {
                cands.push(Cand::new(idx, c.to_vec()));
                current = 1;
            }
            for snap in &ls.pending {
                let mut b = p.to_vec();
                b[..snap.bytes.len()].copy_from_slice(&snap.bytes);
                if cands.iter().all(|x| x.bytes != b) {
                    cands.push(Cand::new(idx, b));
                }
            }
            if cands.len() > 1 {
                vars.push(VarLine {
                    idx,
                    start: r.start,
                    cands,
                    current,
                });
            }
        }

        let mut rng = StdRng::seed_from_u64(cfg.seed ^ seq.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let mut em = Emitter {
            state: self,
            point,
            seq,
            base,
            vars: &vars,
        };

        // (a) persisted only, (b) everything in flight.
        em.emit(ImageKind::Persisted, &vec![0; vars.len()]);
        let all: Vec<usize> = vars.iter().map(|v| v.current).collect();
        em.emit(ImageKind::AllInFlight, &all);

        // (c) subsets of whole lines.
        if !vars.is_empty() {
            let combos = vars.iter().try_fold(1usize, |acc, v| acc.checked_mul(v.cands.len()));
            match combos {
                Some(n) if vars.len() <= EXHAUSTIVE_LINES && n <= EXHAUSTIVE_MAX_IMAGES => {
                    let mut pick = vec![0; vars.len()];
                    for mut k in 0..n {
                        for (slot, v) in pick.iter_mut().zip(&vars) {
                            *slot = k % v.cands.len();
                            k /= v.cands.len();
                        }
                        em.emit(ImageKind::Subset, &pick);
                    }
                }
                _ => {
                    for _ in 0..cfg.random_subsets {
                        let pick: Vec<usize> = vars.iter().map(|v| rng.gen_range(0..v.cands.len())).collect();
                        em.emit(ImageKind::Subset, &pick);
                    }
                }
            }
        }

        // (d) torn words between persisted and current.
        if vars.iter().any(|v| v.current != 0) {
            for _ in 0..cfg.torn {
                let lines: Vec<Cand> = vars
                    .iter()
                    .map(|v| {
                        let p = &v.cands[0].bytes;
                        if v.current == 0 {
                            return Cand::new(v.idx, p.clone());
                        }
                        let c = &v.cands[v.current].bytes;
                        let mut b = p.clone();
                        for (w, cw) in b.chunks_mut(WORD).zip(c.chunks(WORD)) {
                            if rng.gen::<bool>() {
                                w.copy_from_slice(cw);
                            }
                        }
                        Cand::new(v.idx, b)
                    })
                    .collect();
                em.emit_lines(ImageKind::Torn, &lines);
            }
        }
    }
}

/// One possible content of a line, with its hash.
struct Cand {
    bytes: Vec<u8>,
    hash: u64,
}

impl Cand {
    fn new(idx: u64, bytes: Vec<u8>) -> Cand {
        Cand {
            hash: line_hash(idx, &bytes),
            bytes,
        }
    }
}

/// An in-flight line with its possible contents: `cands[0]` is the
/// persisted content, `cands[current]` the current one, the rest pending
/// flush-time snapshots; all distinct.
struct VarLine {
    idx: u64,
    start: usize,
    cands: Vec<Cand>,
    current: usize,
}

/// Builds, deduplicates and queues the images of one capture.
struct Emitter<'a> {
    state: &'a mut State,
    point: &'static str,
    seq: u64,
    base: u64,
    vars: &'a [VarLine],
}

impl Emitter<'_> {
    /// The image with line `vars[i]` at its candidate `pick[i]`.
    fn emit(&mut self, kind: ImageKind, pick: &[usize]) {
        let chosen: Vec<&Cand> = self.vars.iter().zip(pick).map(|(v, &k)| &v.cands[k]).collect();
        self.emit_chosen(kind, &chosen);
    }

    /// The image with line `vars[i]` holding `lines[i]`.
    fn emit_lines(&mut self, kind: ImageKind, lines: &[Cand]) {
        let chosen: Vec<&Cand> = lines.iter().collect();
        self.emit_chosen(kind, &chosen);
    }

    fn emit_chosen(&mut self, kind: ImageKind, chosen: &[&Cand]) {
        let s = &mut *self.state;
        let mut sum = self.base;
        for (v, c) in self.vars.iter().zip(chosen) {
            sum = sum.wrapping_sub(v.cands[0].hash).wrapping_add(c.hash);
        }
        if !s.seen.insert(finish_hash(sum, s.persisted.len())) {
            s.images_duplicate += 1;
            return;
        }
        let mut data = s.persisted.clone();
        for (v, c) in self.vars.iter().zip(chosen) {
            data[v.start..v.start + c.bytes.len()].copy_from_slice(&c.bytes);
        }
        s.queue.push(CrashImage {
            kind,
            point: self.point,
            seq: self.seq,
            data,
        });
        s.images_generated += 1;
    }
}

/// The 64-bit content hash used to deduplicate crash images: a wrapping sum
/// of per-line hashes (each mixing the line index), finished with the length.
pub fn image_hash(data: &[u8]) -> u64 {
    finish_hash(lines_sum(data), data.len())
}

fn lines_sum(data: &[u8]) -> u64 {
    data.chunks(LINE_BYTES)
        .enumerate()
        .fold(0u64, |sum, (idx, line)| sum.wrapping_add(line_hash(idx as u64, line)))
}

/// FxHash-style word mixer over the line's eight words (a short last line
/// is zero padded, so growing the space leaves its hash unchanged), seeded
/// with the line index and finished with a strong avalanche so that sums of
/// line hashes do not collide structurally.
fn line_hash(idx: u64, bytes: &[u8]) -> u64 {
    const K: u64 = 0x517c_c1b7_2722_0a95;
    debug_assert!(bytes.len() <= LINE_BYTES);
    let mut h = fmix64(idx ^ 0x2545_f491_4f6c_dd1d);
    for i in 0..LINE_BYTES / WORD {
        let mut w = [0u8; WORD];
        if let Some(chunk) = bytes.get(i * WORD..) {
            let n = chunk.len().min(WORD);
            w[..n].copy_from_slice(&chunk[..n]);
        }
        h = (h.rotate_left(5) ^ u64::from_le_bytes(w)).wrapping_mul(K);
    }
    fmix64(h)
}

fn finish_hash(sum: u64, len: usize) -> u64 {
    fmix64(sum ^ fmix64(len as u64 ^ 0x6a09_e667_f3bc_c908))
}

/// MurmurHash3's 64-bit finalizer.
fn fmix64(mut h: u64) -> u64 {
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

/// Byte range of line `idx` in a space of `size` bytes.
fn line_range(size: usize, idx: u64) -> Range<usize> {
    let start = idx as usize * LINE_BYTES;
    start..(start + LINE_BYTES).min(size)
}

fn to_usize(v: u64) -> usize {
    usize::try_from(v).unwrap_or_else(|_| panic!("SimSpace: size {v} does not fit in memory"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pmem::ThreadCounters;

    const F: Point = Point::new("test.flush");
    const N: Point = Point::new("test.fence");

    fn word(img: &[u8], off: usize) -> u64 {
        u64::from_le_bytes(img[off..off + 8].try_into().unwrap())
    }

    fn capture_cfg(torn: usize) -> Option<CaptureConfig> {
        Some(CaptureConfig {
            seed: 7,
            random_subsets: 8,
            torn,
        })
    }

    fn of_kind(imgs: &[CrashImage], kind: ImageKind) -> Vec<&CrashImage> {
        imgs.iter().filter(|i| i.kind == kind).collect()
    }

    #[test]
    fn space_is_send_and_sync() {
        fn check<T: Space>() {}
        check::<SimSpace>();
    }

    #[test]
    fn unpersisted_store_is_only_in_all_in_flight() {
        let s = SimSpace::new(4096);
        s.set_capture(capture_cfg(0));
        s.store(128, 42);
        assert_eq!(s.load(128), 42);
        assert_eq!(s.in_flight_lines(), 1);
        s.op_boundary();
        let imgs = s.take_images();
        let p = of_kind(&imgs, ImageKind::Persisted);
        let a = of_kind(&imgs, ImageKind::AllInFlight);
        assert_eq!((p.len(), a.len()), (1, 1), "{imgs:?}");
        assert_eq!(word(&p[0].data, 128), 0);
        assert_eq!(word(&a[0].data, 128), 42);
        assert_eq!(a[0].data, s.current_image());
        assert_eq!(p[0].data, s.persisted_image());
        assert!(imgs.iter().all(|i| i.point == OP_BOUNDARY && i.seq == 1));
        assert_eq!(word(&s.persisted_image(), 128), 0);
    }

    #[test]
    fn flush_and_fence_by_same_thread_persists() {
        let s = SimSpace::new(4096);
        s.store(64, 7);
        s.write(200, &[1, 2, 3]);
        s.persist(64, 8, F, N);
        assert_eq!(word(&s.persisted_image(), 64), 7);
        assert_eq!(&s.persisted_image()[200..203], &[0, 0, 0]);
        s.persist(200, 3, F, N);
        assert_eq!(&s.persisted_image()[200..203], &[1, 2, 3]);
        assert_eq!(s.in_flight_lines(), 0);
        assert_eq!(s.persisted_image(), s.current_image());
    }

    #[test]
    fn fence_alone_or_flush_alone_does_not_persist() {
        let s = SimSpace::new(4096);
        s.store(64, 7);
        s.fence(N);
        assert_eq!(word(&s.persisted_image(), 64), 0);
        s.flush(64, 8, F);
        assert_eq!(word(&s.persisted_image(), 64), 0);
        s.fence(N);
        assert_eq!(word(&s.persisted_image(), 64), 7);
    }

    #[test]
    fn fence_by_other_thread_does_not_persist() {
        let s = SimSpace::new(4096);
        s.store(64, 7);
        s.flush(64, 8, F);
        std::thread::scope(|sc| {
            sc.spawn(|| s.fence(N)).join().unwrap();
        });
        assert_eq!(word(&s.persisted_image(), 64), 0);
        assert_eq!(s.in_flight_lines(), 1);
        s.fence(N);
        assert_eq!(word(&s.persisted_image(), 64), 7);
    }

    #[test]
    fn other_thread_flush_and_fence_persists_its_snapshot() {
        let s = SimSpace::new(4096);
        s.store(64, 7);
        std::thread::scope(|sc| {
            sc.spawn(|| s.persist(64, 8, F, N)).join().unwrap();
        });
        assert_eq!(word(&s.persisted_image(), 64), 7);
        assert_eq!(s.in_flight_lines(), 0);
    }

    #[test]
    fn older_snapshot_never_overwrites_newer_persisted_one() {
        let s = SimSpace::new(4096);
        s.store(64, 1);
        s.flush(64, 8, F); // this thread: snapshot with 1
        std::thread::scope(|sc| {
            sc.spawn(|| {
                s.store(72, 2);
                s.persist(64, 16, F, N); // snapshot with 1 and 2, persisted
            })
            .join()
            .unwrap();
        });
        let p = s.persisted_image();
        assert_eq!((word(&p, 64), word(&p, 72)), (1, 2));
        // The stale snapshot (72 = 0) is gone: nothing is in flight and no
        // crash image can hold it.
        assert_eq!(s.in_flight_lines(), 0);
        s.set_capture(capture_cfg(4));
        s.op_boundary();
        let imgs = s.take_images();
        assert!(imgs.iter().all(|i| i.data == p), "{imgs:?}");
        s.fence(N); // and it must not land
        let p = s.persisted_image();
        assert_eq!((word(&p, 64), word(&p, 72)), (1, 2));
        assert_eq!(s.in_flight_lines(), 0);
    }

    #[test]
    fn store_after_flush_is_not_covered() {
        let s = SimSpace::new(4096);
        s.store(64, 1);
        s.flush(64, 8, F);
        s.store(64, 2);
        s.store(80, 3);
        s.fence(N);
        let p = s.persisted_image();
        assert_eq!((word(&p, 64), word(&p, 80)), (1, 0));
        assert_eq!(s.load(64), 2);
        assert_eq!(s.in_flight_lines(), 1);
        s.persist(64, 64, F, N);
        let p = s.persisted_image();
        assert_eq!((word(&p, 64), word(&p, 80)), (2, 3));
        assert_eq!(s.in_flight_lines(), 0);
    }

    #[test]
    fn reflush_before_fence_takes_the_newer_snapshot() {
        let s = SimSpace::new(4096);
        s.store(64, 1);
        s.flush(64, 8, F);
        s.store(64, 2);
        s.flush(64, 8, F);
        s.fence(N);
        assert_eq!(word(&s.persisted_image(), 64), 2);
        assert_eq!(s.in_flight_lines(), 0);
    }

    #[test]
    fn flushing_a_clean_line_is_harmless() {
        let s = SimSpace::new(4096);
        s.persist(0, 4096, F, N);
        assert_eq!(s.in_flight_lines(), 0);
        assert_eq!(s.persisted_image(), vec![0; 4096]);
    }

    #[test]
    fn dropped_flush_leaves_line_unpersisted_and_counts_hit() {
        let s = SimSpace::new(4096);
        s.set_drop(Some("test.flush".into()));
        s.store(64, 9);
        s.persist(64, 8, F, N);
        assert_eq!(word(&s.persisted_image(), 64), 0);
        assert_eq!(s.drop_hits(), 1);
        // Another flush point still works.
        s.persist(64, 8, Point::new("other.flush"), N);
        assert_eq!(word(&s.persisted_image(), 64), 9);
        assert_eq!(s.drop_hits(), 1);
        let seen = s.points_seen();
        assert!(seen.contains("test.flush") && seen.contains("other.flush"));
        assert!(seen.contains("test.fence"));
        s.set_drop(None);
        assert_eq!(s.drop_hits(), 0);
    }

    #[test]
    fn dropped_fence_does_not_persist() {
        let s = SimSpace::new(4096);
        s.set_drop(Some("test.fence".into()));
        s.store(64, 9);
        s.persist(64, 8, F, N);
        assert_eq!(word(&s.persisted_image(), 64), 0);
        assert_eq!(s.drop_hits(), 1);
        s.fence(Point::new("other.fence"));
        assert_eq!(word(&s.persisted_image(), 64), 9);
    }

    #[test]
    fn counters_count_lines_and_fences() {
        let s = SimSpace::new(4096);
        let before = ThreadCounters::get();
        s.flush(60, 8, F); // two lines
        s.fence(N);
        s.set_drop(Some("test.flush".into()));
        s.flush(0, 64, F); // dropped: not counted
        let d = ThreadCounters::get().since(before);
        assert_eq!((d.flushes, d.fences), (2, 1));
    }

    #[test]
    fn three_lines_give_all_eight_subsets() {
        let s = SimSpace::new(4096);
        s.set_capture(capture_cfg(0));
        for l in 0..3u64 {
            s.store(l * 64 + 8, l + 1);
        }
        s.op_boundary();
        let imgs = s.take_images();
        assert!(of_kind(&imgs, ImageKind::Torn).is_empty());
        let distinct: HashSet<&Vec<u8>> = imgs.iter().map(|i| &i.data).collect();
        assert_eq!(distinct.len(), 8);
        assert_eq!(imgs.len(), 8, "dedup must leave only distinct images");
        for mask in 0..8u64 {
            let found = imgs.iter().any(|i| {
                (0..3u64).all(|l| {
                    let want = if mask & (1 << l) != 0 { l + 1 } else { 0 };
                    word(&i.data, (l * 64 + 8) as usize) == want
                })
            });
            assert!(found, "combination {mask:03b} missing");
        }
    }

    #[test]
    fn many_lines_give_seeded_random_subsets() {
        let run = |seed| {
            let s = SimSpace::new(8192);
            s.set_capture(Some(CaptureConfig {
                seed,
                random_subsets: 8,
                torn: 4,
            }));
            for l in 0..10u64 {
                s.store(l * 64, !0);
            }
            s.op_boundary();
            s.take_images()
        };
        let a = run(1);
        assert_eq!(a, run(1), "same seed, same images");
        assert_ne!(a, run(2));
        let subsets = of_kind(&a, ImageKind::Subset);
        assert!(!subsets.is_empty() && subsets.len() <= 8);
        assert!(a.len() <= 2 + 8 + 4);
    }

    #[test]
    fn flushed_snapshot_is_a_subset_choice() {
        let s = SimSpace::new(4096);
        s.set_capture(capture_cfg(0));
        s.store(64, 1);
        s.flush(64, 8, F);
        s.store(64, 2);
        s.op_boundary();
        let vals: BTreeSet<u64> = s.take_images().iter().map(|i| word(&i.data, 64)).collect();
        assert_eq!(vals, BTreeSet::from([0, 1, 2]));
    }

    #[test]
    fn fence_captures_before_taking_effect() {
        let s = SimSpace::new(4096);
        s.set_capture(capture_cfg(0));
        s.store(64, 5);
        s.flush(64, 8, F);
        s.fence(N);
        let imgs = s.take_images();
        let p = of_kind(&imgs, ImageKind::Persisted);
        assert_eq!(p.len(), 1);
        assert_eq!(word(&p[0].data, 64), 0);
        assert_eq!(p[0].point, "test.fence");
        assert!(imgs.iter().any(|i| word(&i.data, 64) == 5));
        assert_eq!(word(&s.persisted_image(), 64), 5);
    }

    #[test]
    fn torn_images_mix_words_within_a_line() {
        let s = SimSpace::new(4096);
        s.set_capture(capture_cfg(16));
        s.write(128, &[0xFF; 64]);
        s.op_boundary();
        let imgs = s.take_images();
        let torn = of_kind(&imgs, ImageKind::Torn);
        assert!(!torn.is_empty());
        let mixed = torn.iter().any(|i| {
            let words: Vec<u64> = (0..8).map(|w| word(&i.data, 128 + w * 8)).collect();
            words.contains(&0) && words.contains(&!0)
        });
        assert!(mixed, "no torn image mixes persisted and current words");
        for i in &torn {
            for w in 0..8 {
                assert!(matches!(word(&i.data, 128 + w * 8), 0 | u64::MAX));
            }
        }
    }

    #[test]
    fn capturing_twice_without_changes_adds_nothing() {
        let s = SimSpace::new(4096);
        s.set_capture(capture_cfg(4));
        s.store(0, 1);
        s.store(640, 2);
        s.op_boundary();
        let first = s.images_generated();
        assert!(first >= 4);
        assert_eq!(s.take_images().len() as u64, first);
        s.op_boundary();
        assert!(s.take_images().is_empty());
        assert_eq!(s.images_generated(), first);
        assert!(s.images_duplicate() > 0);
        s.reset_dedup();
        s.op_boundary();
        assert!(!s.take_images().is_empty());
    }

    #[test]
    fn incremental_hash_matches_full_hash() {
        let s = SimSpace::new(1000); // partial last line
        s.set_capture(capture_cfg(4));
        s.op_boundary(); // compute the persisted sum now, then keep it up to date
        s.store(64, 3);
        s.persist(64, 8, F, N);
        s.write(990, &[7; 10]);
        s.flush(960, 40, F);
        s.store(0, 1);
        s.grow(1500).unwrap();
        s.store(1400, 4);
        s.op_boundary();
        let imgs = s.take_images();
        let st = s.state.lock();
        assert_eq!(st.persisted_sum, Some(lines_sum(&st.persisted)));
        assert_eq!(st.seen.len(), imgs.len());
        for i in &imgs {
            assert!(st.seen.contains(&image_hash(&i.data)), "{i:?}");
        }
    }

    #[test]
    fn grow_keeps_content_and_persisted_state() {
        let s = SimSpace::new(1000);
        s.store(64, 1);
        s.persist(64, 8, F, N);
        s.store(128, 2);
        s.grow(5000).unwrap();
        assert_eq!(s.size(), 5000);
        s.grow(10).unwrap();
        assert_eq!(s.size(), 5000);
        assert_eq!((s.load(64), s.load(128)), (1, 2));
        let p = s.persisted_image();
        assert_eq!(p.len(), 5000);
        assert_eq!((word(&p, 64), word(&p, 128)), (1, 0));
        assert!(p[1000..].iter().all(|&b| b == 0));
        assert!(s.current_image()[1000..].iter().all(|&b| b == 0));
        assert_eq!(s.in_flight_lines(), 1);
        s.store(4992, 9);
        s.persist(128, 8, F, N);
        s.persist(4992, 8, F, N);
        let p = s.persisted_image();
        assert_eq!((word(&p, 128), word(&p, 4992)), (2, 9));
    }

    #[test]
    fn from_image_is_current_and_persisted() {
        let img: Vec<u8> = (0..256u32).map(|b| b as u8).collect();
        let s = SimSpace::from_image(img.clone());
        assert_eq!(s.persisted_image(), img);
        assert_eq!(s.current_image(), img);
        assert_eq!(s.in_flight_lines(), 0);
        let mut buf = [0u8; 4];
        s.read(10, &mut buf);
        assert_eq!(buf, [10, 11, 12, 13]);
        assert_eq!(s.flush_kind(), FlushKind::None);
        assert_eq!(s.mapping(), MappingKind::Simulated);
    }

    #[test]
    fn zero_marks_lines_in_flight() {
        let s = SimSpace::from_image(vec![0xAB; 256]);
        s.zero(60, 10);
        assert_eq!(s.in_flight_lines(), 2);
        assert_eq!(s.persisted_image()[60], 0xAB);
        s.persist(60, 10, F, N);
        assert_eq!(&s.persisted_image()[58..72], &s.current_image()[58..72]);
        assert_eq!(s.persisted_image()[60], 0);
        assert_eq!(s.in_flight_lines(), 0);
    }

    #[test]
    #[should_panic(expected = "not 8-byte aligned")]
    fn unaligned_store_panics() {
        SimSpace::new(64).store(4, 1);
    }

    #[test]
    #[should_panic(expected = "beyond the space size")]
    fn out_of_bounds_load_panics() {
        SimSpace::new(64).load(64);
    }
}
