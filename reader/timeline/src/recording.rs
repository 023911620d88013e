//! Reading the flight recorder's file (`gpumemhook_segment::recording`, the format's one
//! definition): as it is, mid-run or after any death of its writer, in memory bounded by the
//! writer's threads, not by its length.
//!
//! Two passes over the chunks. The first reads the strings (they may be written after an event of
//! another thread names them), the records that carry their own time stamp (ceiling changes and
//! peak restarts, noticed after they happened), and where each thread's runs are (a chunk holds
//! runs of the threads that shared it, one after another). The second walks each thread's runs in
//! the order of the times they start (a thread's own records are in time order, and a thread id
//! the kernel gave again belongs to a thread that started later) and merges the threads by time,
//! handing each event to an [`EventSink`]: the Chrome writer (`gpumemhook export --chrome`) or
//! [`TimelineBuilder`] (`report`, `plot`, `view`).

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap};
use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;

use gpumemhook_segment::layout::MemKind;
use gpumemhook_segment::recording::{
    chunk_offset, decode_recording_header, ChunkItem, ChunkReader, EventKind, EventRecord,
    RecordingHeaderError, RecordingHeaderFields, TextClass, CEILING_CHANGED, CHUNK_BYTES,
    ENDED_BY_OFFSET, ENDED_BY_RUN, ENDED_BY_WRITER, END_NS_OFFSET, MAX_TEXT_LEN, NO_CEILING,
    RECORDING_HEADER_BYTES, RECORDING_MAGIC,
};
use gpumemhook_segment::ring::{read_summary, SUMMARY_CHUNKS};

use crate::builder::TimelineBuilder;
use crate::error::TraceError;
use crate::event::{Event, EventSink};
use crate::order::{ChangeOrder, Overwritten};
use crate::timeline::{Keep, RunInfo, Timeline};
use gpumemhook_reader::JobLabels;

/// Whether the file at `path` starts as a recording does (its magic), without reading more.
pub fn is_recording(path: &Path) -> bool {
    let mut magic = [0u8; 8];
    File::open(path)
        .and_then(|f| f.read_exact_at(&mut magic, 0))
        .is_ok_and(|()| magic == RECORDING_MAGIC)
}

/// A recording opened: its header read and checked.
pub struct Recording {
    file: File,
    header: RecordingHeaderFields,
}

/// How a recording ended.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Ending {
    /// Its writer finished it at exit.
    #[default]
    Finished,
    /// Not finished: its process is still running, or died and no one closed the file.
    Open,
    /// Its process died without finishing it; `gpumemhook run` closed it, with the signal that
    /// killed the process when it knew it.
    Died { signal: Option<u32> },
}

impl Ending {
    fn of(end_ns: u64, ended_by: u32) -> Ending {
        match (end_ns, ended_by) {
            (0, _) => Ending::Open,
            (_, ENDED_BY_WRITER) => Ending::Finished,
            (_, ENDED_BY_RUN) => Ending::Died { signal: None },
            (_, signal) => Ending::Died {
                signal: Some(signal),
            },
        }
    }
}

/// Closes the recording at `path` if its writer did not finish it: its end is stamped `end_ns` and
/// `signal` (the one that killed the process, when known) is kept. Returns whether it closed it
/// (false for a file already finished or not a recording).
pub fn close_recording(path: &Path, end_ns: u64, signal: Option<u32>) -> std::io::Result<bool> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)?;
    let mut page = vec![0u8; RECORDING_HEADER_BYTES as usize];
    file.read_exact_at(&mut page, 0)?;
    match decode_recording_header(&page) {
        Ok(header) if header.end_ns == 0 => {}
        _ => return Ok(false),
    }
    let ended_by = signal
        .filter(|s| (1..=64).contains(s))
        .unwrap_or(ENDED_BY_RUN);
    file.write_all_at(&ended_by.to_le_bytes(), ENDED_BY_OFFSET as u64)?;
    file.write_all_at(&end_ns.max(1).to_le_bytes(), END_NS_OFFSET as u64)?;
    Ok(true)
}

/// What the file says of its end, once its events are read.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RecordingEnd {
    /// The ceilings in force at the end, per device (the last step of each).
    pub limits: BTreeMap<u32, u64>,
    /// Events the writer could not write (its disk was full).
    pub lost: u64,
    /// When the file was finished (ns), `None` when its writer died first and no one closed it.
    pub end_ns: Option<u64>,
    /// How it ended: see [`Ending`].
    pub ending: Ending,
    /// Chunks with a record this reader could not read (damaged or hostile bytes), read up to it.
    pub damaged_chunks: u64,
    /// The events handed over.
    pub events: u64,
    /// The time of the last event or step (ns), 0 for none.
    pub last_ns: u64,
    /// A ring recording's summary of what it overwrote.
    pub ring: Option<crate::timeline::RingPart>,
}

fn broken(message: String) -> TraceError {
    TraceError::broken(message)
}

impl Recording {
    /// Opens the recording at `path`; an error that says why it is not one.
    pub fn open(path: &Path) -> Result<Recording, TraceError> {
        let file =
            File::open(path).map_err(|e| broken(format!("cannot read {}: {e}", path.display())))?;
        let mut page = vec![0u8; RECORDING_HEADER_BYTES as usize];
        let read = file.read_exact_at(&mut page, 0);
        match (read, decode_recording_header(&page)) {
            (Ok(()), Ok(header)) => Ok(Recording { file, header }),
            (_, Err(RecordingHeaderError::Version(v))) => Err(broken(format!(
                "a gpumemhook recording of format version {v}, which this version does not read"
            ))),
            _ => Err(broken(
                "not a gpumemhook recording (no recording header)".into(),
            )),
        }
    }

    pub fn pid(&self) -> u32 {
        self.header.pid
    }

    /// When its process started recording (ns since the Unix epoch; 0 when unknown).
    pub fn start_unix_ns(&self) -> u64 {
        self.header.start_unix_ns
    }

    pub fn command(&self) -> String {
        String::from_utf8_lossy(&self.header.command).into_owned()
    }

    /// The run's place among others: its labels, host and wall clock.
    pub fn info(&self) -> RunInfo {
        let host = String::from_utf8_lossy(&self.header.host).into_owned();
        RunInfo {
            labels: serde_json::from_slice::<JobLabels>(&self.header.labels).unwrap_or_default(),
            host: (!host.is_empty()).then_some(host),
            wall_offset_us: (self.header.start_unix_ns != 0)
                .then(|| (self.header.start_unix_ns as f64 - self.header.start_ns as f64) / 1000.0),
        }
    }

    /// Hands every event to `sink` in time order; then says how the file ends.
    pub fn replay(&self, sink: &mut dyn EventSink) -> Result<RecordingEnd, TraceError> {
        let chunks = self
            .file
            .metadata()
            .map_err(read_error)?
            .len()
            .saturating_sub(RECORDING_HEADER_BYTES)
            / CHUNK_BYTES;
        let survey = self.survey(chunks).map_err(read_error)?;
        let mut replay = Replay {
            names: &survey.names,
            limits: BTreeMap::new(),
            events: 0,
            last_ns: 0,
        };
        let ring = self.ring_part(&survey.names).map_err(read_error)?;
        if let Some(ring) = &ring {
            sink.ring(ring).map_err(read_error)?;
        }
        for d in ring.iter().flat_map(|r| &r.figures.devices) {
            // The newest ceiling step the ring overwrote: still in force where no later one is.
            if let Some((ts_ns, word)) = d.ceiling {
                let limit = (word != NO_CEILING).then_some(word);
                match limit {
                    Some(l) => replay.limits.insert(d.device, l),
                    None => replay.limits.remove(&d.device),
                };
                sink.ceiling_step(ts_ns, d.device, limit)
                    .map_err(read_error)?;
            }
        }
        // Devices whose changes the ring overwrote: their order starts with the whole part.
        let overwritten = ring.as_ref().map(|r| Overwritten {
            whole_from_ns: r.figures.detail_from_ns,
            devices: (r.figures.devices.iter())
                .filter(|d| d.last_used.is_some())
                .filter_map(|d| u8::try_from(d.device).ok())
                .collect(),
        });
        let order = ChangeOrder::new(self.header.version >= 2, overwritten);
        self.merge(survey.threads, survey.stamped, order, &mut replay, sink)
            .map_err(read_error)?;
        Ok(RecordingEnd {
            limits: replay.limits,
            lost: self.header.lost,
            end_ns: (self.header.end_ns != 0).then_some(self.header.end_ns),
            ending: Ending::of(self.header.end_ns, self.header.ended_by),
            damaged_chunks: survey.damaged_chunks,
            events: replay.events,
            last_ns: replay.last_ns,
            ring,
        })
    }

    /// A ring recording's summary, its modules named; `None` for a recording without a ring (or
    /// whose summary is not there yet).
    fn ring_part(&self, names: &Names) -> std::io::Result<Option<crate::timeline::RingPart>> {
        // A summary of another size is another format's: its figures are not read.
        let Some(ring) = self
            .header
            .ring
            .filter(|r| r.summary_chunks == SUMMARY_CHUNKS)
        else {
            return Ok(None);
        };
        let mut bytes = vec![0u8; (ring.summary_chunks * CHUNK_BYTES) as usize];
        self.file.read_exact_at(&mut bytes, chunk_offset(0))?;
        let Some(figures) = read_summary(&bytes, self.header.start_ns) else {
            return Ok(None);
        };
        let module_names = figures
            .devices
            .iter()
            .flat_map(|d| &d.modules)
            .map(|&(number, ..)| {
                (
                    number,
                    name_of(&names.modules, u32::from(number)).to_string(),
                )
            })
            .collect();
        Ok(Some(crate::timeline::RingPart {
            figures,
            module_names,
        }))
    }

    /// Pass 1: the strings, the stamped records (sorted by their time) and each thread's chunks.
    fn survey(&self, chunks: u64) -> std::io::Result<Survey> {
        let mut buffer = vec![0u8; CHUNK_BYTES as usize];
        let mut survey = Survey::default();
        let mut index = 0;
        while index < chunks {
            self.file.read_exact_at(&mut buffer, chunk_offset(index))?;
            let Some(mut walk) = ChunkReader::new(&buffer) else {
                // Not a chunk: a hole (`truncate` past the end, a chunk claimed and never
                // written) is skipped to the next data rather than read as zeros.
                index = self.next_data_chunk(index + 1).unwrap_or(chunks);
                continue;
            };
            survey.walk(index, &mut walk);
            survey.damaged_chunks += u64::from(walk.damaged);
            index += 1;
        }
        survey.stamped.sort_by_key(|&(ts, _, _)| ts);
        for runs in survey.threads.values_mut() {
            runs.sort();
        }
        Ok(survey)
    }

    /// Pass 2: each thread's runs in order, merged by time with the stamped records, put in the
    /// counter's order by `order` (version 1 records carry no order: theirs is their times'),
    /// into `sink`.
    fn merge(
        &self,
        threads: BTreeMap<u32, Vec<RunAt>>,
        stamped: Vec<(u64, EventRecord, u32)>,
        mut order: ChangeOrder,
        replay: &mut Replay<'_>,
        sink: &mut dyn EventSink,
    ) -> std::io::Result<()> {
        let mut buffer = vec![0u8; CHUNK_BYTES as usize];
        let mut streams: Vec<Stream> = threads
            .into_iter()
            .map(|(tid, runs)| Stream {
                tid,
                runs,
                next_run: 0,
                events: Vec::new(),
                at: 0,
            })
            .collect();
        let mut heap = BinaryHeap::new();
        for (i, stream) in streams.iter_mut().enumerate() {
            if let Some(ts) = stream.peek(&self.file, &mut buffer)? {
                heap.push(Reverse((ts, i)));
            }
        }
        let mut stamped = stamped.into_iter().peekable();
        loop {
            let next_stream = heap.peek().map(|Reverse((ts, _))| *ts);
            let take_stamped = match (stamped.peek(), next_stream) {
                (Some(&(ts, _, _)), Some(other)) => ts <= other,
                (Some(_), None) => true,
                (None, _) => false,
            };
            if take_stamped {
                if let Some((ts, record, tid)) = stamped.next() {
                    order.push(ts, record, tid, |ts, r, tid| replay.hand(sink, ts, &r, tid))?;
                }
                continue;
            }
            let Some(Reverse((_, i))) = heap.pop() else {
                return order.flush(|ts, r, tid| replay.hand(sink, ts, &r, tid));
            };
            let stream = &mut streams[i];
            if let Some((ts, record)) = stream.take() {
                let tid = stream.tid;
                order.push(ts, record, tid, |ts, r, tid| replay.hand(sink, ts, &r, tid))?;
            }
            if let Some(ts) = stream.peek(&self.file, &mut buffer)? {
                heap.push(Reverse((ts, i)));
            }
        }
    }
}

impl Recording {
    /// The first chunk at or after chunk `index` that holds data, `None` when none does: where
    /// the file system cannot say, `index` itself.
    fn next_data_chunk(&self, index: u64) -> Option<u64> {
        let from = i64::try_from(chunk_offset(index)).ok()?;
        // SAFETY: lseek on a descriptor this File owns; SEEK_DATA moves only its offset, which
        // no read here uses (they all give theirs).
        let data = unsafe { libc::lseek(self.file.as_raw_fd(), from, libc::SEEK_DATA) };
        if data < 0 {
            let unsupported = std::io::Error::last_os_error().raw_os_error() != Some(libc::ENXIO);
            return unsupported.then_some(index);
        }
        let data = u64::try_from(data).ok()?;
        Some(data.saturating_sub(RECORDING_HEADER_BYTES) / CHUNK_BYTES)
    }
}

fn read_error(e: std::io::Error) -> TraceError {
    broken(format!("cannot read the recording: {e}"))
}

/// What the first pass finds.
#[derive(Default)]
struct Survey {
    names: Names,
    /// Ceiling changes and peak restarts, by the time they happened: `(ns, record, thread)`.
    stamped: Vec<(u64, EventRecord, u32)>,
    /// Each thread's runs, by the time they start (the thread's own time order).
    threads: BTreeMap<u32, Vec<RunAt>>,
    damaged_chunks: u64,
    /// The events read so far.
    events: u64,
}

impl Survey {
    /// Takes what chunk `index` holds. A thread's run is kept once an event of it is read: runs
    /// without events (a forged file's millions of thread records) cost nothing.
    fn walk(&mut self, index: u64, walk: &mut ChunkReader<'_>) {
        let mut tid = walk.tid();
        let mut run = Some(RunAt {
            start_ns: walk.clock(),
            chunk: index,
            at: 0,
        });
        for item in walk {
            match item {
                ChunkItem::Thread {
                    tid: next,
                    clock_ns,
                    at,
                } => {
                    tid = next;
                    run = Some(RunAt {
                        start_ns: clock_ns,
                        chunk: index,
                        at,
                    });
                }
                ChunkItem::Text {
                    class: Some(class),
                    number,
                    text,
                } => self.names.take(class, number, text, self.events),
                ChunkItem::Text { class: None, .. } => {}
                ChunkItem::Event { ts_ns, record } => {
                    self.events += 1;
                    if let Some(run) = run.take() {
                        self.threads.entry(tid).or_default().push(run);
                    }
                    if record.stamp().is_some() {
                        self.stamped.push((ts_ns, record, tid));
                    }
                }
            }
        }
    }
}

/// The numbered strings of a recording.
#[derive(Default)]
struct Names {
    entries: HashMap<u32, String>,
    modules: HashMap<u32, String>,
    sites: HashMap<u32, String>,
    scopes: HashMap<u32, String>,
    /// How many strings are kept, and their bytes.
    kept: u64,
    bytes: u64,
}

/// How many strings may be kept before any event: the hook writes a string just before the first
/// event that names it (a thread is at most a few strings ahead of its events), so a file's
/// strings are at most this many more than the events read before them. A forged file's strings
/// that no event names (millions of them) are dropped past it.
const FREE_NAMES: u64 = 1 << 16;
/// How many bytes of strings may be kept before any event, beyond which each event read allows
/// one string of the longest ([`MAX_TEXT_LEN`]).
const FREE_NAME_BYTES: u64 = 16 << 20;

impl Names {
    /// Keeps `text` as string `number` of `class`, unless its number is one no record can name
    /// or the strings kept already are as many, or as long, as `events` read so far allow.
    fn take(&mut self, class: TextClass, number: u32, text: &[u8], events: u64) {
        let (map, numbers) = match class {
            TextClass::Entry => (&mut self.entries, 1 << 8),
            TextClass::Module => (&mut self.modules, 1 << 8),
            TextClass::Site => (&mut self.sites, 1 << 24),
            TextClass::Scope => (&mut self.scopes, 1 << 32),
        };
        let bytes = self.bytes + text.len() as u64;
        let allowed = self.kept < FREE_NAMES.saturating_add(events)
            && bytes <= FREE_NAME_BYTES.saturating_add(events.saturating_mul(MAX_TEXT_LEN as u64));
        if u64::from(number) >= numbers || !allowed {
            return;
        }
        if map
            .insert(number, String::from_utf8_lossy(text).into_owned())
            .is_none()
        {
            (self.kept, self.bytes) = (self.kept + 1, bytes);
        }
    }
}

fn name_of(map: &HashMap<u32, String>, number: u32) -> &str {
    map.get(&number).map_or("", String::as_str)
}

/// Where one thread's run is: the chunk, the record it starts at, the time it starts from (ordered
/// by that time first).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct RunAt {
    start_ns: u64,
    chunk: u64,
    at: u64,
}

/// One thread's events, a run at a time.
struct Stream {
    tid: u32,
    runs: Vec<RunAt>,
    next_run: usize,
    /// The current chunk's events, stamped records left out (they are merged on their own).
    events: Vec<(u64, EventRecord)>,
    at: usize,
}

impl Stream {
    /// The time of the next event, reading the thread's next run when this one is done.
    fn peek(&mut self, file: &File, buffer: &mut [u8]) -> std::io::Result<Option<u64>> {
        while self.at >= self.events.len() {
            let Some(&run) = self.runs.get(self.next_run) else {
                return Ok(None);
            };
            self.next_run += 1;
            file.read_exact_at(buffer, chunk_offset(run.chunk))?;
            self.events.clear();
            self.at = 0;
            let walk = ChunkReader::run(buffer, run.at).into_iter().flatten();
            self.events.extend(walk.filter_map(|item| match item {
                ChunkItem::Event { ts_ns, record } if record.stamp().is_none() => {
                    Some((ts_ns, record))
                }
                _ => None,
            }));
        }
        Ok(self.events.get(self.at).map(|&(ts, _)| ts))
    }

    fn take(&mut self) -> Option<(u64, EventRecord)> {
        let event = self.events.get(self.at).copied();
        self.at += 1;
        event
    }
}

/// Turns records into events for the sink, keeping each device's ceiling in force.
struct Replay<'a> {
    names: &'a Names,
    limits: BTreeMap<u32, u64>,
    events: u64,
    last_ns: u64,
}

impl Replay<'_> {
    fn hand(
        &mut self,
        sink: &mut dyn EventSink,
        ts_ns: u64,
        r: &EventRecord,
        tid: u32,
    ) -> std::io::Result<()> {
        let Some(kind) = EventKind::from_code(r.kind) else {
            return Ok(());
        };
        self.last_ns = self.last_ns.max(ts_ns);
        let device = u32::from(r.device);
        let record_limit = (r.bytes != NO_CEILING).then_some(r.bytes);
        let set_limit = |limits: &mut BTreeMap<u32, u64>| match record_limit {
            Some(l) => {
                limits.insert(device, l);
            }
            None => {
                limits.remove(&device);
            }
        };
        if kind == EventKind::Ceiling && r.entry != CEILING_CHANGED {
            // A step, not an event: the ceiling in force at an event, or at exit.
            set_limit(&mut self.limits);
            return sink.ceiling_step(ts_ns, device, record_limit);
        }
        if matches!(kind, EventKind::Ceiling | EventKind::PeakReset) {
            set_limit(&mut self.limits);
        }
        let scope = matches!(kind, EventKind::ScopeOpen | EventKind::ScopeClose);
        let names = self.names;
        let name = if scope {
            name_of(&names.scopes, r.scope_name())
        } else {
            name_of(&names.entries, u32::from(r.entry))
        };
        self.events += 1;
        sink.event(&Event {
            ts_ns,
            kind,
            device,
            bytes: if scope || kind == EventKind::PeakReset {
                0
            } else {
                r.bytes
            },
            used: if scope { 0 } else { r.used },
            address: if scope || r.stamp().is_some() {
                0
            } else {
                r.address
            },
            name,
            mem: MemKind::from_code(r.mem).unwrap_or(MemKind::Device),
            tid,
            scope: r.scope_slot(),
            limit: self.limits.get(&device).copied(),
            module: name_of(&names.modules, u32::from(r.module)),
            site: name_of(&names.sites, r.site),
        })
    }
}

/// Reads the recording at `path` into a timeline, keeping what `keep` says.
pub fn read_recording(path: &Path, keep: Keep) -> Result<Timeline, TraceError> {
    read_recording_teed(path, keep, &mut NoSink)
}

/// [`read_recording`], every event also handed to `also` as it is read (`report --json` counts
/// per device what the timeline keeps only for all devices together).
pub fn read_recording_teed(
    path: &Path,
    keep: Keep,
    also: &mut dyn EventSink,
) -> Result<Timeline, TraceError> {
    let recording = Recording::open(path)?;
    let mut builder = TimelineBuilder::new(keep);
    let end = recording.replay(&mut Tee(&mut builder, also))?;
    let mut t = builder.finish(
        recording.pid(),
        recording.command(),
        end.limits.clone(),
        end.lost,
        end.end_ns,
        recording.info(),
    );
    t.cut_short = end.ending != Ending::Finished;
    t.ring = end.ring;
    t.killed_by = match end.ending {
        Ending::Died { signal } => Some(signal),
        _ => None,
    };
    Ok(t)
}

/// A sink that takes nothing.
struct NoSink;

impl EventSink for NoSink {
    fn event(&mut self, _: &Event<'_>) -> std::io::Result<()> {
        Ok(())
    }

    fn ceiling_step(&mut self, _: u64, _: u32, _: Option<u64>) -> std::io::Result<()> {
        Ok(())
    }
}

/// Two sinks fed the same events, in order.
struct Tee<'a>(&'a mut dyn EventSink, &'a mut dyn EventSink);

impl EventSink for Tee<'_> {
    fn event(&mut self, e: &Event<'_>) -> std::io::Result<()> {
        self.0.event(e)?;
        self.1.event(e)
    }

    fn ceiling_step(&mut self, ts_ns: u64, device: u32, limit: Option<u64>) -> std::io::Result<()> {
        self.0.ceiling_step(ts_ns, device, limit)?;
        self.1.ceiling_step(ts_ns, device, limit)
    }

    fn ring(&mut self, ring: &crate::timeline::RingPart) -> std::io::Result<()> {
        self.0.ring(ring)?;
        self.1.ring(ring)
    }
}

/// Writes the recording at `path` as a Chrome trace (the JSON timeline of earlier versions, which
/// Perfetto's UI and chrome://tracing open) into `out`.
pub fn write_recording_as_chrome(
    path: &Path,
    out: &mut dyn std::io::Write,
) -> Result<(), TraceError> {
    let recording = Recording::open(path)?;
    let io = |e: std::io::Error| broken(format!("cannot write the Chrome trace: {e}"));
    let mut writer =
        crate::chrome_writer::ChromeTraceWriter::new(out, recording.pid(), &recording.command())
            .map_err(io)?;
    let end = recording.replay(&mut writer)?;
    // A recording cut short ends at its last event.
    let end_ns = end.end_ns.unwrap_or(end.last_ns);
    writer
        .finish(&end.limits, end.lost, end_ns, &recording.info())
        .map_err(io)?;
    Ok(())
}
