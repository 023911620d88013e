//! The flight recorder's file (`GPUMEMHOOK_TRACE`): its one definition, for the hook that writes it
//! as events happen and the reader that reads it, mid-run or after any death of its writer.
//!
//! The file is a header page, then chunks. A chunk is written by one thread at a time: a thread
//! claims a new one with one atomic add, extends the file by it and maps it; it then fills it
//! record by record with plain stores into the page cache, which keeps them whatever ends the
//! process. A chunk is [`CHUNK_BYTES`] long and holds [`RECORDS_PER_CHUNK`] records of
//! [`RECORD_BYTES`]; its first record is the chunk's own ([`Record::Chunk`]: the thread and the
//! time its clock starts from). A thread that ends hands the rest of its chunk on: the next thread
//! to need a chunk writes there, after a [`Record::Thread`] record ("from here on, thread T, clock
//! C"), so that short-lived threads share chunks instead of taking 64 KiB each. A chunk is thus a
//! sequence of runs, each one thread's records in its time order. A record is four 64-bit words,
//! each stored little-endian (byte 0 of a word is its lowest); its first word carries the tag in
//! bits 32 to 39 and is written last, so a record whose first word is 0 is not (yet) written, and
//! the first such record ends what its chunk holds.
//!
//! Records, by tag (one type, [`Record`], with a variant per tag, which the writer encodes and the
//! reader decodes: no record's words are written out anywhere else):
//! - an event ([`Record::Event`], its tag the reader's `EventKind` code plus one): word 0 holds the
//!   nanoseconds since the thread's previous record in the chunk (bits 0-31), the tag (32-39), the
//!   memory kind (40-41), the change's order (42-47, see [`EventRecord::order`]), the device
//!   (48-55) and the module (56-63); word 1 the address; words 2 and 3 the bytes and the device's
//!   `used` after the event (bits 0-47 each), the Python call site (24 bits: its low 16 in word 2's
//!   bits 48-63, its high 8 in word 3's bits 48-55) and the entry point (word 3's bits 56-63) (see
//!   [`EventRecord`] for the kinds whose words say other things);
//! - [`Record::Chunk`] (tag `0xC1`): a chunk's first record, its thread (word 1) and clock (word
//!   2);
//! - [`Record::Wide`] (`0xC2`): the bytes (word 1) and `used` (word 2) of the next event in full,
//!   when one does not fit 48 bits;
//! - [`Record::Time`] (`0xC3`): the thread's clock in full (word 1), when more than 2^32 ns passed
//!   since its last record;
//! - [`Record::Text`] (`0xC4`): a string (an entry point's, a module's, a call site's or a scope's
//!   name) given a number once, its bytes in the records that follow it; events refer to strings
//!   by number;
//! - [`Record::Thread`] (`0xC5`): the start of another thread's run in the chunk, with that thread
//!   (word 1) and the time its clock starts from (word 2), as the chunk's own first record says
//!   for the first run.
//!
//! Any other tag is refused ([`RecordError::UnknownTag`]) and ends the chunk's reading.
//!
//! Events of different threads interleave in time across chunks: a reader orders each thread's
//! runs by the time they start (a thread id the kernel gave again to a later thread runs later)
//! and merges the threads by time.

use std::sync::atomic::AtomicU64;

/// The file's first bytes.
pub const RECORDING_MAGIC: [u8; 8] = *b"GMHTRACE";
/// The format's version: readers refuse a file of another (2: chunks shared by threads in runs,
/// [`Record::Thread`], and each change's order in word 0, [`EventRecord::order`]; a file of version
/// 1, which has neither, is read too, its changes in the order of their times).
pub const RECORDING_VERSION: u32 = 2;
/// The version of a recording whose chunks are a ring (`GPUMEMHOOK_TRACE_MAX`, `crate::ring`):
/// readers of version 2 refuse it rather than read its last part as the whole run. A recording
/// without a ring keeps [`RECORDING_VERSION`].
pub const RING_RECORDING_VERSION: u32 = 3;
/// The oldest version readers read.
pub const OLDEST_RECORDING_VERSION: u32 = 1;
/// The header's length: the first chunk starts here.
pub const RECORDING_HEADER_BYTES: u64 = 4096;
/// A chunk's length: what one thread claims, extends the file by and maps at a time.
pub const CHUNK_BYTES: u64 = 64 * 1024;
/// A record's length.
pub const RECORD_BYTES: u64 = 32;
/// Records in a chunk, its own first record included.
pub const RECORDS_PER_CHUNK: u64 = CHUNK_BYTES / RECORD_BYTES;
/// Longest command kept in the header.
pub const RECORDING_COMMAND_LEN: usize = 1024;
/// Longest host name kept in the header.
pub const RECORDING_HOST_LEN: usize = 256;
/// Longest job labels (their JSON text) kept in the header.
pub const RECORDING_LABELS_LEN: usize = 2048;
/// Longest string a [`Record::Text`] record carries: it and its bytes fit one chunk after its
/// header.
pub const MAX_TEXT_LEN: usize = 4096;
/// The largest bytes or `used` an event record holds; more is carried by a [`Record::Wide`] record.
pub const MAX_NARROW: u64 = (1 << 48) - 1;
/// The ceiling value that means "none" in a ceiling record.
pub const NO_CEILING: u64 = MAX_NARROW;
/// The module of an event that has none.
pub const NO_MODULE: u8 = u8::MAX;
/// Bits of a change's number a record keeps ([`EventRecord::order`]).
pub const ORDER_BITS: u32 = 6;
const ORDER_MASK: u8 = (1 << ORDER_BITS) - 1;

/// The header page, as the writer maps it. Every field but `end_ns`, `lost` and `ended_by` is
/// written before the file takes its name and never again; `end_ns` and `ended_by` are set once,
/// by the writer at its exit or by `gpumemhook run` after it died.
#[repr(C)]
pub struct RecordingHeader {
    pub magic: [u8; 8],
    pub version: u32,
    pub header_bytes: u32,
    pub chunk_bytes: u32,
    pub record_bytes: u32,
    pub pid: u32,
    /// How the file was finished: [`ENDED_BY_WRITER`] (also while it runs), else by whom it was
    /// closed after its writer died ([`ENDED_BY_RUN`], or the signal that killed it).
    pub ended_by: u32,
    /// `CLOCK_MONOTONIC` when recording started, ns.
    pub start_ns: u64,
    /// Unix time at the same instant, ns: lines up timelines of several machines.
    pub start_unix_ns: u64,
    /// `CLOCK_MONOTONIC` when the writer finished the file, ns; 0 while it runs, and for good when
    /// it died first.
    pub end_ns: AtomicU64,
    /// Events that could not be written (the disk was full).
    pub lost: AtomicU64,
    /// The command line, NUL-padded.
    pub command: [u8; RECORDING_COMMAND_LEN],
    /// The host name, NUL-padded.
    pub host: [u8; RECORDING_HOST_LEN],
    /// The process's job labels as JSON, NUL-padded.
    pub labels: [u8; RECORDING_LABELS_LEN],
    /// A ring recording's layout ([`RingLayout`], version 3 only; zeroes otherwise): its
    /// summary's and names' chunks, and its slots.
    pub ring_summary_chunks: u32,
    pub ring_name_chunks: u32,
    pub ring_slots: u64,
}

const _: () = assert!(std::mem::size_of::<RecordingHeader>() as u64 <= RECORDING_HEADER_BYTES);

/// `ended_by`: the writer finished the file itself (or has not finished it yet).
pub const ENDED_BY_WRITER: u32 = 0;
/// `ended_by`: `gpumemhook run` closed the file of a process that died without finishing it, the
/// signal unknown (values 1 to 64 name the signal).
pub const ENDED_BY_RUN: u32 = u32::MAX;

/// Where `end_ns` and `ended_by` lie in the file, for a closer that writes them in place.
pub const END_NS_OFFSET: usize = std::mem::offset_of!(RecordingHeader, end_ns);
pub const ENDED_BY_OFFSET: usize = std::mem::offset_of!(RecordingHeader, ended_by);

/// What a header says, read from bytes that may be anyone's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecordingHeaderFields {
    /// The format's version (from [`OLDEST_RECORDING_VERSION`] to [`RING_RECORDING_VERSION`]).
    pub version: u32,
    pub pid: u32,
    pub start_ns: u64,
    pub start_unix_ns: u64,
    pub end_ns: u64,
    pub ended_by: u32,
    pub lost: u64,
    pub command: Vec<u8>,
    pub host: Vec<u8>,
    pub labels: Vec<u8>,
    /// A ring recording's layout (`GPUMEMHOOK_TRACE_MAX`), `None` for a recording without a ring.
    pub ring: Option<RingLayout>,
}

/// Why a header was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecordingHeaderError {
    /// Not a recording at all (another file).
    NotARecording,
    /// A recording of another version, or with other sizes.
    Version(u32),
}

/// Reads a header from its bytes (at least [`RECORDING_HEADER_BYTES`]; fewer is "not a recording").
pub fn decode_recording_header(
    bytes: &[u8],
) -> Result<RecordingHeaderFields, RecordingHeaderError> {
    use std::mem::offset_of;
    if bytes.len() < RECORDING_HEADER_BYTES as usize || bytes[..8] != RECORDING_MAGIC {
        return Err(RecordingHeaderError::NotARecording);
    }
    let u32_at = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap_or([0; 4]));
    let u64_at = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap_or([0; 8]));
    let text = |at: usize, len: usize| {
        let field = &bytes[at..at + len];
        field[..field.iter().position(|&b| b == 0).unwrap_or(len)].to_vec()
    };
    let version = u32_at(offset_of!(RecordingHeader, version));
    let sizes = [
        u32_at(offset_of!(RecordingHeader, header_bytes)) as u64,
        u32_at(offset_of!(RecordingHeader, chunk_bytes)) as u64,
        u32_at(offset_of!(RecordingHeader, record_bytes)) as u64,
    ];
    if !(OLDEST_RECORDING_VERSION..=RING_RECORDING_VERSION).contains(&version)
        || sizes != [RECORDING_HEADER_BYTES, CHUNK_BYTES, RECORD_BYTES]
    {
        return Err(RecordingHeaderError::Version(version));
    }
    let ring = (version >= RING_RECORDING_VERSION).then(|| RingLayout {
        summary_chunks: u64::from(u32_at(offset_of!(RecordingHeader, ring_summary_chunks))),
        name_chunks: u64::from(u32_at(offset_of!(RecordingHeader, ring_name_chunks))),
        slots: u64_at(offset_of!(RecordingHeader, ring_slots)),
    });
    Ok(RecordingHeaderFields {
        version,
        pid: u32_at(offset_of!(RecordingHeader, pid)),
        start_ns: u64_at(offset_of!(RecordingHeader, start_ns)),
        start_unix_ns: u64_at(offset_of!(RecordingHeader, start_unix_ns)),
        end_ns: u64_at(offset_of!(RecordingHeader, end_ns)),
        ended_by: u32_at(offset_of!(RecordingHeader, ended_by)),
        lost: u64_at(offset_of!(RecordingHeader, lost)),
        command: text(offset_of!(RecordingHeader, command), RECORDING_COMMAND_LEN),
        host: text(offset_of!(RecordingHeader, host), RECORDING_HOST_LEN),
        labels: text(offset_of!(RecordingHeader, labels), RECORDING_LABELS_LEN),
        ring,
    })
}

/// Copies `text` into a NUL-padded header field, cut to leave one NUL.
pub fn fill_field(field: &mut [u8], text: &[u8]) {
    let len = text.len().min(field.len().saturating_sub(1));
    field[..len].copy_from_slice(&text[..len]);
    field[len..].fill(0);
}

/// What a recorded event was: its code is what a record stores, its category what the Chrome
/// timeline and the out-of-memory report call it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum EventKind {
    Alloc = 0,
    Free = 1,
    Denied = 2,
    Failed = 3,
    ScopeOpen = 4,
    ScopeClose = 5,
    /// The ceiling of a device was changed (only a `limit` counter step is written, where it
    /// differs from the one before).
    Ceiling = 6,
    /// The peak of a device was restarted (`reset_peak`).
    PeakReset = 7,
}

impl EventKind {
    /// The event's `cat` in the file (`alloc`, `free`, `denied`, `failed`, `scope`): the one
    /// mapping from kind to category, for the writer and for the hook's out-of-memory report.
    pub const fn category(self) -> &'static str {
        match self {
            EventKind::Alloc => "alloc",
            EventKind::Free => "free",
            EventKind::Denied => "denied",
            EventKind::Failed => "failed",
            EventKind::ScopeOpen | EventKind::ScopeClose => "scope",
            EventKind::Ceiling => "ceiling",
            EventKind::PeakReset => "reset_peak",
        }
    }

    /// Whether the event is an allocation, a free, a refusal or a failure (what the out-of-memory
    /// report lists), not a scope, a ceiling change or a peak restart.
    pub const fn is_allocation(self) -> bool {
        matches!(
            self,
            EventKind::Alloc | EventKind::Free | EventKind::Denied | EventKind::Failed
        )
    }

    /// The kind of an instant event of category `cat` (`None` for `scope` and unknown ones).
    pub fn of_category(cat: &str) -> Option<EventKind> {
        [
            EventKind::Alloc,
            EventKind::Free,
            EventKind::Denied,
            EventKind::Failed,
        ]
        .into_iter()
        .find(|k| k.category() == cat)
    }

    /// The kind whose `repr(u8)` code is `code` (what a recorder stores in a byte), `None` for a
    /// code no kind has: the one mapping back from the code, beside the codes themselves.
    pub const fn from_code(code: u8) -> Option<EventKind> {
        match code {
            0 => Some(EventKind::Alloc),
            1 => Some(EventKind::Free),
            2 => Some(EventKind::Denied),
            3 => Some(EventKind::Failed),
            4 => Some(EventKind::ScopeOpen),
            5 => Some(EventKind::ScopeClose),
            6 => Some(EventKind::Ceiling),
            7 => Some(EventKind::PeakReset),
            _ => None,
        }
    }
}

/// What a record is, from its tag byte (bits 32 to 39 of its first word).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum RecordTag {
    /// No record: the chunk's records end here.
    Empty,
    /// An event of the reader's `EventKind` with this code.
    Event(u8),
    /// A chunk's first record.
    Chunk,
    /// The next event's bytes and `used`, in full.
    Wide,
    /// The thread's clock, in full.
    Time,
    /// A string and its number.
    Text,
    /// Another thread's run starts: its thread and the time its clock starts from.
    Thread,
    /// A tag this version does not know (hostile or damaged bytes): the chunk is read no further.
    Unknown(u8),
}

/// Event codes are stored plus one, so that 0 stays "empty"; the other tags sit above them.
const EVENT_TAGS: u8 = 32;
/// The largest event code a record holds: a larger one would take a tag that is no event's.
pub const MAX_EVENT_CODE: u8 = EVENT_TAGS - 2;
const CHUNK_TAG: u8 = 0xC1;
const WIDE_TAG: u8 = 0xC2;
const TIME_TAG: u8 = 0xC3;
const TEXT_TAG: u8 = 0xC4;
const THREAD_TAG: u8 = 0xC5;

impl RecordTag {
    #[inline]
    const fn code(self) -> u8 {
        match self {
            RecordTag::Empty => 0,
            RecordTag::Event(kind) => {
                // A code past the last is stored as a tag no event has: refused when read.
                if kind <= MAX_EVENT_CODE {
                    kind + 1
                } else {
                    EVENT_TAGS
                }
            }
            RecordTag::Chunk => CHUNK_TAG,
            RecordTag::Wide => WIDE_TAG,
            RecordTag::Time => TIME_TAG,
            RecordTag::Text => TEXT_TAG,
            RecordTag::Thread => THREAD_TAG,
            RecordTag::Unknown(code) => code,
        }
    }

    const fn of(code: u8) -> RecordTag {
        match code {
            0 => RecordTag::Empty,
            1..EVENT_TAGS => RecordTag::Event(code - 1),
            CHUNK_TAG => RecordTag::Chunk,
            WIDE_TAG => RecordTag::Wide,
            TIME_TAG => RecordTag::Time,
            TEXT_TAG => RecordTag::Text,
            THREAD_TAG => RecordTag::Thread,
            other => RecordTag::Unknown(other),
        }
    }

    /// The tag of a record's first word.
    const fn of_word0(word0: u64) -> RecordTag {
        RecordTag::of((word0 >> 32) as u8)
    }

    /// The tag's bits of a first word (never 0 but for [`RecordTag::Empty`]).
    #[inline]
    const fn word0(self) -> u64 {
        (self.code() as u64) << 32
    }
}

/// What strings are numbered as, in [`Record::Text`] records.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum TextClass {
    /// An entry point's name; its number is the entry code.
    Entry = 1,
    /// A module's file name; its number is the module's slot.
    Module = 2,
    /// A Python call site; its number is the site's.
    Site = 3,
    /// A scope's name; its number is given when the scope opens.
    Scope = 4,
}

impl TextClass {
    pub const fn of(code: u8) -> Option<TextClass> {
        match code {
            1 => Some(TextClass::Entry),
            2 => Some(TextClass::Module),
            3 => Some(TextClass::Site),
            4 => Some(TextClass::Scope),
            _ => None,
        }
    }
}

/// Records that `len` bytes of text take after their [`Record::Text`] record.
pub const fn text_records(len: usize) -> u64 {
    (len as u64).div_ceil(RECORD_BYTES)
}

/// One event as a record holds it. What the words mean by kind:
/// - allocations, frees, refusals, failures: as named;
/// - a ceiling change: `bytes` is the ceiling ([`NO_CEILING`] for none) and `address` the time it
///   was set (ns of `CLOCK_MONOTONIC`: the record's own delta is 0);
/// - a peak restart: `address` is the time of the restart, as for a ceiling;
/// - a scope's open or close: `address` is the scope's slot (low 32 bits) and its name's number
///   (high 32 bits, 0 for none).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EventRecord {
    /// The reader's `EventKind` code.
    pub kind: u8,
    /// Nanoseconds since the thread's previous record in its chunk.
    pub delta_ns: u32,
    /// `MemKind` code (2 bits).
    pub mem: u8,
    /// For a change of a device's `used` (an allocation or free of device memory, a peak
    /// restart): the low [`ORDER_BITS`] bits of its number among the device's changes
    /// (`gpumemhook_segment::Change`), taken in the same atomic add as the change; 0 otherwise.
    /// With the `used` each change carries, it lets a reader put the changes of several threads
    /// back in the counter's own order.
    pub order: u8,
    pub device: u8,
    pub module: u8,
    pub entry: u8,
    pub address: u64,
    /// At most [`MAX_NARROW`]: more goes in a [`Record::Wide`] record before this one.
    pub bytes: u64,
    /// At most [`MAX_NARROW`], as `bytes`.
    pub used: u64,
    /// The Python call site, 24 bits, 0 for none.
    pub site: u32,
}

impl EventRecord {
    /// The event's four words (see the module's header); bits a field does not have are dropped.
    #[inline]
    const fn words(&self) -> [u64; 4] {
        let site = (self.site & 0xff_ffff) as u64;
        [
            self.delta_ns as u64
                | RecordTag::Event(self.kind).word0()
                | (((self.mem & 0x3) as u64) << 40)
                | (((self.order & ORDER_MASK) as u64) << 42)
                | ((self.device as u64) << 48)
                | ((self.module as u64) << 56),
            self.address,
            (self.bytes & MAX_NARROW) | ((site & 0xffff) << 48),
            (self.used & MAX_NARROW) | ((site >> 16) << 48) | ((self.entry as u64) << 56),
        ]
    }

    /// The event of kind `kind` (its tag's) from its words.
    const fn of_words(kind: u8, words: [u64; 4]) -> EventRecord {
        EventRecord {
            kind,
            delta_ns: words[0] as u32,
            mem: ((words[0] >> 40) & 0x3) as u8,
            order: ((words[0] >> 42) as u8) & ORDER_MASK,
            device: (words[0] >> 48) as u8,
            module: (words[0] >> 56) as u8,
            entry: (words[3] >> 56) as u8,
            address: words[1],
            bytes: words[2] & MAX_NARROW,
            used: words[3] & MAX_NARROW,
            site: ((words[2] >> 48) as u32) | ((((words[3] >> 48) & 0xff) as u32) << 16),
        }
    }
}

/// One record, by tag: the one definition of what each record's four words hold, which the hook
/// encodes ([`Record::encode`], on its hot path) and [`ChunkReader`] decodes ([`Record::decode`]).
///
/// An enum, one variant per tag, rather than a type per tag under a trait: a reader meets records
/// of any tag in any order and must match on what it finds, which an enum gives it whole (the
/// compiler checks every tag is handled), and the writer, which always knows which record it
/// writes, builds the variant in place: `encode` of a known variant inlines to the stores of
/// its words, as the hand-written words did.
///
/// In the file each word is little-endian ([`Record::to_le_bytes`]); the first word holds the tag
/// in its bits 32 to 39, and a first word of 0 is no record (not written yet).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Record {
    /// A chunk's first record: the thread that writes the chunk's first run (word 1) and the time
    /// its clock starts from (word 2).
    Chunk { tid: u32, clock_ns: u64 },
    /// Another thread's run starts here: its thread (word 1) and the time its clock starts from
    /// (word 2).
    Thread { tid: u32, clock_ns: u64 },
    /// An event ([`EventRecord`]; its kind is the tag).
    Event(EventRecord),
    /// The next event's bytes (word 1) and `used` (word 2) in full, when one does not fit 48 bits.
    Wide { bytes: u64, used: u64 },
    /// The thread's clock in full (word 1), when more than 2^32 ns passed since its last record.
    Time { clock_ns: u64 },
    /// A numbered string: its class (the low byte of word 1; `None` for a class this version does
    /// not know, stored as 0), its number (the high half of word 1) and its length in bytes (word
    /// 2); its bytes follow in [`text_records`]`(len)` records.
    Text {
        class: Option<TextClass>,
        number: u32,
        len: u64,
    },
}

/// Why four words are no record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecordError {
    /// The first word is 0: nothing was written there (yet).
    Unwritten,
    /// A tag this version does not know (hostile or damaged bytes, or a later version's).
    UnknownTag(u8),
}

impl Record {
    /// The record's four words, the first to be stored last. Never panics, never allocates: the
    /// hook calls it on its hot path. Fields wider than their bits are cut to them (see
    /// [`EventRecord`]); an event code above [`MAX_EVENT_CODE`] gets a tag that [`Record::decode`]
    /// refuses.
    #[inline]
    pub const fn encode(&self) -> [u64; 4] {
        match *self {
            Record::Chunk { tid, clock_ns } => [RecordTag::Chunk.word0(), tid as u64, clock_ns, 0],
            Record::Thread { tid, clock_ns } => {
                [RecordTag::Thread.word0(), tid as u64, clock_ns, 0]
            }
            Record::Event(event) => event.words(),
            Record::Wide { bytes, used } => [RecordTag::Wide.word0(), bytes, used, 0],
            Record::Time { clock_ns } => [RecordTag::Time.word0(), clock_ns, 0, 0],
            Record::Text { class, number, len } => {
                let class = match class {
                    Some(class) => class as u64,
                    None => 0,
                };
                [
                    RecordTag::Text.word0(),
                    class | ((number as u64) << 32),
                    len,
                    0,
                ]
            }
        }
    }

    /// The record four words hold.
    pub const fn decode(words: [u64; 4]) -> Result<Record, RecordError> {
        Ok(match RecordTag::of_word0(words[0]) {
            RecordTag::Empty => return Err(RecordError::Unwritten),
            RecordTag::Unknown(code) => return Err(RecordError::UnknownTag(code)),
            RecordTag::Event(kind) => Record::Event(EventRecord::of_words(kind, words)),
            RecordTag::Chunk => Record::Chunk {
                tid: words[1] as u32,
                clock_ns: words[2],
            },
            RecordTag::Thread => Record::Thread {
                tid: words[1] as u32,
                clock_ns: words[2],
            },
            RecordTag::Wide => Record::Wide {
                bytes: words[1],
                used: words[2],
            },
            RecordTag::Time => Record::Time { clock_ns: words[1] },
            RecordTag::Text => Record::Text {
                class: TextClass::of(words[1] as u8),
                number: (words[1] >> 32) as u32,
                len: words[2],
            },
        })
    }

    /// The record's [`RECORD_BYTES`] as the file holds them: its words in order, each
    /// little-endian.
    pub const fn to_le_bytes(&self) -> [u8; RECORD_BYTES as usize] {
        let words = self.encode();
        let mut bytes = [0u8; RECORD_BYTES as usize];
        let mut i = 0;
        while i < bytes.len() {
            bytes[i] = words[i / 8].to_le_bytes()[i % 8];
            i += 1;
        }
        bytes
    }

    /// The record that [`RECORD_BYTES`] of a file hold (little-endian words, as
    /// [`Record::to_le_bytes`] writes them).
    pub fn from_le_bytes(bytes: &[u8; RECORD_BYTES as usize]) -> Result<Record, RecordError> {
        Record::decode(words_of(bytes))
    }
}

/// The four words of a record's bytes, each little-endian.
fn words_of(bytes: &[u8; RECORD_BYTES as usize]) -> [u64; 4] {
    let word = |i: usize| {
        let mut one = [0u8; 8];
        one.copy_from_slice(&bytes[i * 8..i * 8 + 8]);
        u64::from_le_bytes(one)
    };
    [word(0), word(1), word(2), word(3)]
}

/// The `entry` of a ceiling record: what the step is.
/// A change made through the segment, at the time it was made (an event of the count).
pub const CEILING_CHANGED: u8 = 0;
/// The ceiling in force at an event, where it differs from the one recorded last (a step only).
pub const CEILING_IN_FORCE: u8 = 1;
/// The ceiling in force at exit, where it differs from the one recorded last (a step only).
pub const CEILING_AT_EXIT: u8 = 2;

impl EventRecord {
    /// The time a record carries in its own words rather than its delta (ceiling changes and peak
    /// restarts, which the hook notices after they happened), `None` for the others.
    pub fn stamp(&self) -> Option<u64> {
        let kind = EventKind::from_code(self.kind)?;
        let stamped = kind == EventKind::PeakReset
            || (kind == EventKind::Ceiling && self.entry != CEILING_IN_FORCE);
        stamped.then_some(self.address)
    }

    /// A scope mark's `address`: the scope's slot in its low 32 bits, its name's number (0 for
    /// none) in its high 32 bits.
    #[inline]
    pub const fn scope_address(slot: u32, name: u32) -> u64 {
        slot as u64 | ((name as u64) << 32)
    }

    /// A scope mark's slot ([`EventRecord::scope_address`]).
    pub const fn scope_slot(&self) -> u32 {
        self.address as u32
    }

    /// A scope mark's name's number, 0 for none ([`EventRecord::scope_address`]).
    pub const fn scope_name(&self) -> u32 {
        (self.address >> 32) as u32
    }
}

/// One thing a chunk holds, as [`ChunkReader`] gives it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChunkItem<'a> {
    /// An event at `ts_ns` (its stamp for a stamped record, see [`EventRecord::stamp`]), its bytes
    /// and `used` in full.
    Event { ts_ns: u64, record: EventRecord },
    /// A numbered string (`class` `None`: of a class this version does not know).
    Text {
        class: Option<TextClass>,
        number: u32,
        text: &'a [u8],
    },
    /// Another thread's run starts at record `at` of the chunk, its clock at `clock_ns`.
    Thread { tid: u32, clock_ns: u64, at: u64 },
}

/// Walks the records of one chunk's bytes, in order, to the first record not written (or one it
/// cannot read: an unknown tag, a string running past the chunk); or, made by
/// [`ChunkReader::run`], one thread's run of them.
pub struct ChunkReader<'a> {
    bytes: &'a [u8],
    next: u64,
    clock: u64,
    tid: u32,
    wide: Option<(u64, u64)>,
    /// Stops at the next run's start ([`ChunkReader::run`]).
    one_run: bool,
    /// The walk stopped at a record it could not read rather than at an unwritten one.
    pub damaged: bool,
}

impl<'a> ChunkReader<'a> {
    /// A walk of `bytes` ([`CHUNK_BYTES`] of them); `None` when its first record is not a chunk's
    /// (a chunk claimed and never started, or not a chunk at all).
    pub fn new(bytes: &'a [u8]) -> Option<ChunkReader<'a>> {
        if bytes.len() as u64 != CHUNK_BYTES {
            return None;
        }
        let mut walk = ChunkReader {
            bytes,
            next: 0,
            clock: 0,
            tid: 0,
            wide: None,
            one_run: false,
            damaged: false,
        };
        let Ok(Record::Chunk { tid, clock_ns }) = walk.record(0) else {
            return None;
        };
        walk.tid = tid;
        walk.clock = clock_ns;
        walk.next = 1;
        Some(walk)
    }

    /// A walk of the run that starts at record `at` of `bytes` (0: the chunk's first run, else a
    /// [`Record::Thread`] record's), to its end; `None` when no run starts there.
    pub fn run(bytes: &'a [u8], at: u64) -> Option<ChunkReader<'a>> {
        let mut walk = ChunkReader::new(bytes)?;
        walk.one_run = true;
        if at == 0 {
            return Some(walk);
        }
        let Some(Ok(Record::Thread { tid, clock_ns })) =
            (at < RECORDS_PER_CHUNK).then(|| walk.record(at))
        else {
            return None;
        };
        walk.tid = tid;
        walk.clock = clock_ns;
        walk.next = at + 1;
        Some(walk)
    }

    /// The thread whose run is being read (the chunk's first until a [`ChunkItem::Thread`]).
    pub fn tid(&self) -> u32 {
        self.tid
    }

    /// The run's clock so far, ns (before any record: the time it starts from).
    pub fn clock(&self) -> u64 {
        self.clock
    }

    /// Record `index` of the chunk (below [`RECORDS_PER_CHUNK`]).
    fn record(&self, index: u64) -> Result<Record, RecordError> {
        let at = (index * RECORD_BYTES) as usize;
        match self.bytes.get(at..at + RECORD_BYTES as usize) {
            Some(bytes) => Record::from_le_bytes(bytes.try_into().unwrap_or(&[0; 32])),
            None => Err(RecordError::Unwritten),
        }
    }
}

impl<'a> Iterator for ChunkReader<'a> {
    type Item = ChunkItem<'a>;

    fn next(&mut self) -> Option<ChunkItem<'a>> {
        while self.next < RECORDS_PER_CHUNK {
            let record = self.record(self.next);
            self.next += 1;
            match record {
                Err(RecordError::Unwritten) => break,
                Ok(Record::Event(mut record)) => {
                    if let Some((bytes, used)) = self.wide.take() {
                        record.bytes = bytes;
                        record.used = used;
                    }
                    self.clock = self.clock.saturating_add(u64::from(record.delta_ns));
                    let ts_ns = record.stamp().unwrap_or(self.clock);
                    return Some(ChunkItem::Event { ts_ns, record });
                }
                Ok(Record::Wide { bytes, used }) => self.wide = Some((bytes, used)),
                Ok(Record::Time { clock_ns }) => self.clock = clock_ns,
                Ok(Record::Thread { .. }) if self.one_run => break,
                Ok(Record::Thread { tid, clock_ns }) => {
                    self.tid = tid;
                    self.clock = clock_ns;
                    self.wide = None;
                    return Some(ChunkItem::Thread {
                        tid,
                        clock_ns,
                        at: self.next - 1,
                    });
                }
                Ok(Record::Text { class, number, len }) => {
                    let records = text_records(len.min(MAX_TEXT_LEN as u64 + 1) as usize);
                    if len > MAX_TEXT_LEN as u64 || self.next + records > RECORDS_PER_CHUNK {
                        self.damaged = true;
                        break;
                    }
                    let from = (self.next * RECORD_BYTES) as usize;
                    self.next += records;
                    return Some(ChunkItem::Text {
                        class,
                        number,
                        text: &self.bytes[from..from + len as usize],
                    });
                }
                Ok(Record::Chunk { .. }) | Err(RecordError::UnknownTag(_)) => {
                    self.damaged = true;
                    break;
                }
            }
        }
        self.next = RECORDS_PER_CHUNK;
        None
    }
}

/// The events of one chunk's bytes with their times (strings left out): what the hook reads back
/// of its own recent chunks.
pub fn chunk_events(bytes: &[u8]) -> impl Iterator<Item = (u64, EventRecord)> + '_ {
    ChunkReader::new(bytes)
        .into_iter()
        .flatten()
        .filter_map(|item| match item {
            ChunkItem::Event { ts_ns, record } => Some((ts_ns, record)),
            ChunkItem::Text { .. } | ChunkItem::Thread { .. } => None,
        })
}

/// Where a ring recording's parts lie, in chunks after the header: the summary (`crate::ring`),
/// the names the ring overwrote, then the ring's slots.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RingLayout {
    pub summary_chunks: u64,
    pub name_chunks: u64,
    pub slots: u64,
}

impl RingLayout {
    /// The first name chunk's index.
    pub const fn first_name_chunk(&self) -> u64 {
        self.summary_chunks
    }

    /// The first slot's chunk index.
    pub const fn first_slot(&self) -> u64 {
        self.summary_chunks + self.name_chunks
    }

    /// The chunk index of claim `number`'s slot.
    pub const fn chunk_of(&self, number: u64) -> u64 {
        self.first_slot() + number % self.slots
    }

    /// The file's length, every part reserved.
    pub const fn file_bytes(&self) -> u64 {
        RECORDING_HEADER_BYTES + (self.first_slot() + self.slots) * CHUNK_BYTES
    }
}

/// Where chunk `index` starts in the file.
pub const fn chunk_offset(index: u64) -> u64 {
    RECORDING_HEADER_BYTES + index * CHUNK_BYTES
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every tag's records at the edges of their fields: zeroes, and every field at its widest.
    fn edge_records() -> Vec<Record> {
        let widest = EventRecord {
            kind: MAX_EVENT_CODE,
            delta_ns: u32::MAX,
            mem: 3,
            order: ORDER_MASK,
            device: u8::MAX,
            module: u8::MAX,
            entry: u8::MAX,
            address: u64::MAX,
            bytes: MAX_NARROW,
            used: MAX_NARROW,
            site: 0xff_ffff,
        };
        let mut all = vec![
            Record::Chunk {
                tid: 0,
                clock_ns: 0,
            },
            Record::Chunk {
                tid: u32::MAX,
                clock_ns: u64::MAX,
            },
            Record::Thread {
                tid: 0,
                clock_ns: 0,
            },
            Record::Thread {
                tid: u32::MAX,
                clock_ns: u64::MAX,
            },
            Record::Event(EventRecord::default()),
            Record::Event(widest),
            Record::Wide { bytes: 0, used: 0 },
            Record::Wide {
                bytes: u64::MAX,
                used: MAX_NARROW + 1,
            },
            Record::Time { clock_ns: 0 },
            Record::Time { clock_ns: u64::MAX },
            Record::Text {
                class: None,
                number: 0,
                len: 0,
            },
        ];
        for kind in 0..=MAX_EVENT_CODE {
            all.push(Record::Event(EventRecord { kind, ..widest }));
        }
        for class in [
            TextClass::Entry,
            TextClass::Module,
            TextClass::Site,
            TextClass::Scope,
        ] {
            all.push(Record::Text {
                class: Some(class),
                number: u32::MAX,
                len: u64::MAX,
            });
        }
        all
    }

    #[test]
    fn every_record_decodes_to_what_was_encoded() {
        for record in edge_records() {
            let words = record.encode();
            assert_ne!(words[0], 0, "{record:?}: a record's first word is never 0");
            assert_eq!(Record::decode(words), Ok(record), "{words:x?}");
            assert_eq!(Record::from_le_bytes(&record.to_le_bytes()), Ok(record));
        }
    }

    #[test]
    fn an_event_field_wider_than_its_bits_is_cut_and_spills_into_no_other() {
        let wide = EventRecord {
            kind: EventKind::Free as u8,
            mem: 0xff,
            order: 0xff,
            device: 7,
            entry: 9,
            address: 5,
            bytes: u64::MAX,
            used: u64::MAX,
            // Bits above the site's 24 only: what is left is 0, and what spills shows.
            site: 0xff00_0000,
            ..EventRecord::default()
        };
        let cut = EventRecord {
            mem: 3,
            order: ORDER_MASK,
            bytes: MAX_NARROW,
            used: MAX_NARROW,
            site: 0,
            ..wide
        };
        assert_eq!(
            Record::decode(Record::Event(wide).encode()),
            Ok(Record::Event(cut))
        );
    }

    #[test]
    fn unwritten_words_and_unknown_tags_are_refused() {
        assert_eq!(Record::decode([0; 4]), Err(RecordError::Unwritten));
        assert_eq!(Record::decode([0, 1, 2, 3]), Err(RecordError::Unwritten));
        let known = [CHUNK_TAG, WIDE_TAG, TIME_TAG, TEXT_TAG, THREAD_TAG];
        for code in (EVENT_TAGS..=u8::MAX).filter(|c| !known.contains(c)) {
            let word0 = (u64::from(code) << 32) | 0xffff_ffff;
            assert_eq!(
                Record::decode([word0, 0, 0, 0]),
                Err(RecordError::UnknownTag(code))
            );
        }
        // An event code past the last takes no other event's tag: it is refused when read.
        for kind in [MAX_EVENT_CODE + 1, u8::MAX] {
            let event = Record::Event(EventRecord {
                kind,
                ..EventRecord::default()
            });
            assert_eq!(
                Record::decode(event.encode()),
                Err(RecordError::UnknownTag(EVENT_TAGS))
            );
        }
    }

    #[test]
    fn a_record_is_the_little_endian_words_the_format_documents() {
        let event = Record::Event(EventRecord {
            kind: EventKind::Alloc as u8,
            delta_ns: 0x0102_0304,
            mem: 1,
            order: 2,
            device: 3,
            module: 4,
            entry: 5,
            address: 0x1122_3344_5566_7788,
            bytes: 0x10,
            used: 0x20,
            site: 0x0a_0b0c,
        });
        #[rustfmt::skip]
        let event_bytes = [
            // delta (32 bits), tag 1 (event code 0 plus 1), mem | order << 2, device, module
            0x04, 0x03, 0x02, 0x01, 0x01, 0x09, 0x03, 0x04,
            // address
            0x88, 0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11,
            // bytes (48 bits), the site's low 16 bits
            0x10, 0, 0, 0, 0, 0, 0x0c, 0x0b,
            // used (48 bits), the site's high 8 bits, the entry point
            0x20, 0, 0, 0, 0, 0, 0x0a, 0x05,
        ];
        let text = Record::Text {
            class: Some(TextClass::Site),
            number: 0x0102_0304,
            len: 7,
        };
        #[rustfmt::skip]
        let text_bytes = [
            0, 0, 0, 0, 0xc4, 0, 0, 0,
            0x03, 0, 0, 0, 0x04, 0x03, 0x02, 0x01,
            0x07, 0, 0, 0, 0, 0, 0, 0,
            0, 0, 0, 0, 0, 0, 0, 0,
        ];
        let thread = Record::Thread {
            tid: 0x0102,
            clock_ns: 0x0a0b_0c0d,
        };
        #[rustfmt::skip]
        let thread_bytes = [
            0, 0, 0, 0, 0xc5, 0, 0, 0,
            0x02, 0x01, 0, 0, 0, 0, 0, 0,
            0x0d, 0x0c, 0x0b, 0x0a, 0, 0, 0, 0,
            0, 0, 0, 0, 0, 0, 0, 0,
        ];
        for (record, bytes) in [
            (event, event_bytes),
            (text, text_bytes),
            (thread, thread_bytes),
        ] {
            assert_eq!(record.to_le_bytes(), bytes, "{record:?}");
            assert_eq!(Record::from_le_bytes(&bytes), Ok(record));
        }
        let tags = [
            Record::Chunk {
                tid: 0,
                clock_ns: 0,
            },
            Record::Wide { bytes: 0, used: 0 },
            Record::Time { clock_ns: 0 },
        ]
        .map(|record| record.to_le_bytes()[4]);
        assert_eq!(tags, [0xc1, 0xc2, 0xc3]);
    }

    #[test]
    fn a_scope_marks_address_is_its_slot_then_its_names_number() {
        let mark = EventRecord {
            kind: EventKind::ScopeOpen as u8,
            address: EventRecord::scope_address(0x0102_0304, 0x0a0b_0c0d),
            ..EventRecord::default()
        };
        let bytes = Record::Event(mark).to_le_bytes();
        assert_eq!(
            bytes[8..16],
            [0x04, 0x03, 0x02, 0x01, 0x0d, 0x0c, 0x0b, 0x0a]
        );
        assert_eq!(
            (mark.scope_slot(), mark.scope_name()),
            (0x0102_0304, 0x0a0b_0c0d)
        );
    }

    #[test]
    fn a_chunk_shared_by_two_threads_reads_as_two_runs() {
        let mut chunk = vec![0u8; CHUNK_BYTES as usize];
        let mut put = |index: usize, record: Record| {
            let at = index * RECORD_BYTES as usize;
            chunk[at..at + RECORD_BYTES as usize].copy_from_slice(&record.to_le_bytes());
        };
        let event = |delta_ns| {
            Record::Event(EventRecord {
                kind: EventKind::Alloc as u8,
                delta_ns,
                ..EventRecord::default()
            })
        };
        put(
            0,
            Record::Chunk {
                tid: 7,
                clock_ns: 1000,
            },
        );
        put(1, event(5));
        put(
            2,
            Record::Thread {
                tid: 9,
                clock_ns: 5000,
            },
        );
        put(3, event(3));
        let all: Vec<ChunkItem> = ChunkReader::new(&chunk).unwrap().collect();
        assert_eq!(all.len(), 3);
        assert_eq!(
            all[1],
            ChunkItem::Thread {
                tid: 9,
                clock_ns: 5000,
                at: 2
            }
        );
        let times = |walk: ChunkReader| -> Vec<u64> {
            walk.filter_map(|item| match item {
                ChunkItem::Event { ts_ns, .. } => Some(ts_ns),
                _ => None,
            })
            .collect()
        };
        let first = ChunkReader::run(&chunk, 0).unwrap();
        assert_eq!(first.tid(), 7);
        assert_eq!(times(first), vec![1005]);
        let second = ChunkReader::run(&chunk, 2).unwrap();
        assert_eq!(second.tid(), 9);
        assert_eq!(times(second), vec![5003]);
        assert!(
            ChunkReader::run(&chunk, 1).is_none(),
            "no run starts at an event"
        );
    }

    #[test]
    fn a_header_is_refused_unless_it_is_this_version() {
        let mut page = vec![0u8; RECORDING_HEADER_BYTES as usize];
        assert_eq!(
            decode_recording_header(&page),
            Err(RecordingHeaderError::NotARecording)
        );
        assert_eq!(
            decode_recording_header(&page[..10]),
            Err(RecordingHeaderError::NotARecording)
        );
        page[..8].copy_from_slice(&RECORDING_MAGIC);
        assert_eq!(
            decode_recording_header(&page),
            Err(RecordingHeaderError::Version(0))
        );
        let at_version = std::mem::offset_of!(RecordingHeader, version);
        page[at_version..at_version + 4].copy_from_slice(&RECORDING_VERSION.to_le_bytes());
        for (field, value) in [
            (
                std::mem::offset_of!(RecordingHeader, header_bytes),
                RECORDING_HEADER_BYTES,
            ),
            (
                std::mem::offset_of!(RecordingHeader, chunk_bytes),
                CHUNK_BYTES,
            ),
            (
                std::mem::offset_of!(RecordingHeader, record_bytes),
                RECORD_BYTES,
            ),
        ] {
            page[field..field + 4].copy_from_slice(&(value as u32).to_le_bytes());
        }
        let at = std::mem::offset_of!(RecordingHeader, command);
        page[at..at + 3].copy_from_slice(b"abc");
        let h = decode_recording_header(&page).expect("a header of this version");
        assert_eq!(h.command, b"abc");
        assert!(h.host.is_empty());
        // Version 1 (chunks of one thread each) reads as a version 2 file without shared chunks.
        page[at_version..at_version + 4].copy_from_slice(&1u32.to_le_bytes());
        assert!(decode_recording_header(&page).is_ok());
        // Version 3 is a ring's, its layout read from the header.
        assert_eq!(decode_recording_header(&page).unwrap().ring, None);
        page[at_version..at_version + 4].copy_from_slice(&RING_RECORDING_VERSION.to_le_bytes());
        let at_slots = std::mem::offset_of!(RecordingHeader, ring_slots);
        page[at_slots..at_slots + 8].copy_from_slice(&24u64.to_le_bytes());
        assert_eq!(
            decode_recording_header(&page)
                .unwrap()
                .ring
                .map(|r| r.slots),
            Some(24)
        );
        let next = RING_RECORDING_VERSION + 1;
        page[at_version..at_version + 4].copy_from_slice(&next.to_le_bytes());
        assert_eq!(
            decode_recording_header(&page),
            Err(RecordingHeaderError::Version(next))
        );
    }

    #[test]
    fn a_field_is_cut_to_keep_its_nul() {
        let mut field = [7u8; 4];
        fill_field(&mut field, b"abcdef");
        assert_eq!(&field, b"abc\0");
        fill_field(&mut field, b"x");
        assert_eq!(&field, b"x\0\0\0");
    }
}
