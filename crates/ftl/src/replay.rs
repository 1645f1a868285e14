//! Replay of the store's SSD write log, and its parser.
//!
//! Format (written by `spillway-store`):
//! ```text
//! # spillway ssd write log v1
//! write <stream> <segment> <offset_bytes> <length_bytes>
//! delete <segment> <length_bytes>
//! ```
//! Blank lines and further `#` comments are ignored. Each segment is a striped file: its byte
//! range is cut into stripe units that go round-robin over the SSDs starting at
//! `segment mod ssds`, and logical chunks are allocated as the segment's offsets first appear
//! (so no fixed per-segment logical range has to be guessed). A write covering part of a page
//! programs the whole page. `delete` TRIMs every page of the segment and frees its chunks; its
//! length is informational (the segment's extent is known from its writes). The log has no timestamps, so "time"
//! for stream decisions and lifetime estimates is the host bytes replayed so far.
//!
//! The stream number in the log is the store's placement key (user or job); the mapping decides
//! the device stream from it (`legacy`, `user_id` = Algorithm 1 on that key, `lifetime_aware` =
//! grouping by each key's observed segment lifetimes). `per_job` is refused: the log carries one
//! key per write and does not say whether it is a user or a job.

use crate::mapping::{Mapping, StreamMapper};
use crate::report::{RunReport, Sampler, SsdSummary, SteadyWindow};
use crate::ssd::{SsdConfig, INVALID};
use crate::volume::{StripedFile, Volume, VolumeError};
use spillway_types::{SegmentId, StreamKey};
use std::collections::HashMap;
use std::io::BufRead;

pub const LOG_HEADER: &str = "# spillway ssd write log v1";

/// One event of the write log.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogEvent {
    Write { stream: StreamKey, segment: SegmentId, offset_bytes: u64, length_bytes: u64 },
    Delete { segment: SegmentId, length_bytes: u64 },
}

/// Why a log could not be read. Names the file (as given) and the line.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LogError {
    #[error("{source_name}: cannot read: {error}")]
    Io { source_name: String, error: std::io::Error },
    #[error("{source_name}: first line must be {LOG_HEADER:?}, found {found:?}")]
    Header { source_name: String, found: String },
    #[error("{source_name}:{line}: {reason}: {text:?}")]
    Line { source_name: String, line: u64, reason: String, text: String },
}

/// Parses a whole log. `source_name` is used in errors.
pub fn parse_log(reader: impl BufRead, source_name: &str) -> Result<Vec<LogEvent>, LogError> {
    let mut events = Vec::new();
    let mut lines = reader.lines();
    let io = |error| LogError::Io { source_name: source_name.to_string(), error };
    let header = lines.next().transpose().map_err(io)?.unwrap_or_default();
    if header.trim_end() != LOG_HEADER {
        return Err(LogError::Header { source_name: source_name.to_string(), found: header });
    }
    for (index, line) in lines.enumerate() {
        let text = line.map_err(io)?;
        let line_number = index as u64 + 2;
        let bad = |reason: &str| LogError::Line {
            source_name: source_name.to_string(),
            line: line_number,
            reason: reason.to_string(),
            text: text.clone(),
        };
        let trimmed = text.trim();
        if trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        let fields: Vec<&str> = trimmed.split_ascii_whitespace().collect();
        let number = |i: usize, what: &str| -> Result<u64, LogError> {
            fields[i].parse::<u64>().map_err(|_| bad(&format!("{what} is not an unsigned integer")))
        };
        let event = match fields[0] {
            "write" if fields.len() == 5 => LogEvent::Write {
                stream: StreamKey(number(1, "stream")?),
                segment: SegmentId(number(2, "segment")?),
                offset_bytes: number(3, "offset_bytes")?,
                length_bytes: number(4, "length_bytes")?,
            },
            "delete" if fields.len() == 3 => LogEvent::Delete {
                segment: SegmentId(number(1, "segment")?),
                length_bytes: number(2, "length_bytes")?,
            },
            "write" => {
                return Err(bad("write takes 4 fields: stream segment offset_bytes length_bytes"))
            }
            "delete" => return Err(bad("delete takes 2 fields: segment length_bytes")),
            _ => return Err(bad("unknown event (expected write or delete)")),
        };
        if let LogEvent::Write { offset_bytes, length_bytes, .. } = event {
            if offset_bytes.checked_add(length_bytes).is_none() {
                return Err(bad("offset_bytes + length_bytes overflows"));
            }
        }
        events.push(event);
    }
    Ok(events)
}

/// Why a replay failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReplayError {
    #[error(transparent)]
    Volume(#[from] VolumeError),
    #[error(
        "mapping per_job does not apply to a write log: it carries one placement key per write"
    )]
    PerJob,
    #[error("event {event}: segment {segment} needs more logical space than the {ssds} SSD(s) export (ssd {ssd} full): the trace does not fit; give the volume more space with --blocks-per-ssd (now {blocks_per_ssd}) or --ssds (now {ssds})")]
    OutOfSpace { event: usize, segment: SegmentId, ssds: usize, ssd: usize, blocks_per_ssd: u32 },
    #[error("event {event}: segment {segment} write ends at byte {end_bytes}, beyond the {logical_bytes} logical bytes of the volume: the trace does not fit; give the volume more space with --blocks-per-ssd (now {blocks_per_ssd}) or --ssds (now {ssds})")]
    BeyondVolume {
        event: usize,
        segment: SegmentId,
        end_bytes: u64,
        logical_bytes: u64,
        blocks_per_ssd: u32,
        ssds: usize,
    },
    #[error("event {event}: delete of segment {segment} which has no live data")]
    UnknownSegment { event: usize, segment: SegmentId },
}

#[derive(Clone, Debug, serde::Serialize)]
pub struct ReplayParams {
    pub ssd: SsdConfig,
    pub ssds: u16,
    pub stripe_unit_bytes: u64,
    pub samples: u32,
}

struct Segment {
    layout: StripedFile,
    /// Stream per SSD ordinal in the pool, chosen at the first write.
    streams: Vec<u16>,
    key: StreamKey,
    created_at: u64,
    end_bytes: u64,
}

/// Replays `events`. Segments still live at the end stay on the SSDs.
pub fn replay(
    params: &ReplayParams,
    events: &[LogEvent],
    mapping: Mapping,
) -> Result<RunReport, ReplayError> {
    if mapping == Mapping::PerJob {
        return Err(ReplayError::PerJob);
    }
    let started = crate::report::Stopwatch::start();
    let mut state = ReplayState::new(params, mapping)?;
    let page_bytes = params.ssd.page_bytes as u64;
    let total_host_pages = total_write_pages(events, page_bytes);
    let window_start = SteadyWindow::start_host_pages(total_host_pages);
    let mut sampler =
        Sampler::new(total_host_pages, params.samples, state.volume.logical_bytes(), page_bytes);
    let mut window = None;
    for (index, event) in events.iter().enumerate() {
        // The window opens at the first event that finds the host page count at its start.
        if window.is_none() && state.volume.total_counters().host_pages >= window_start {
            window = Some(state.volume.total_counters());
        }
        match *event {
            LogEvent::Write { stream: key, segment, offset_bytes, length_bytes } => {
                if length_bytes == 0 {
                    continue;
                }
                state.write(index, key, segment, offset_bytes, length_bytes)?;
            }
            LogEvent::Delete { segment, length_bytes: _ } => state.delete(index, segment)?,
        }
        sampler.observe(&state.volume.total_counters(), 0);
    }
    let counters = state.volume.total_counters();
    sampler.force(&counters, 0);
    let (waf_steady, steady_window) = SteadyWindow::measure(
        &window.unwrap_or(counters),
        &counters,
        state.volume.logical_bytes(),
        page_bytes,
    );
    Ok(RunReport {
        label: format!("replay {}", mapping.name()),
        waf_steady,
        steady_window,
        waf_cumulative: counters.waf(),
        users: Vec::new(),
        host_pages: counters.host_pages,
        gc_copied_pages: counters.gc_copied_pages,
        erases: counters.erases,
        per_ssd: state.volume.ssds().iter().map(SsdSummary::of).collect(),
        samples: sampler.samples,
        throughput_mib_per_s: None,
        file_write_latency: None,
        wall: Some(started.finish(&counters)),
    })
}

/// Host pages the log writes in all (partial pages program whole pages): what the sampler
/// spreads its samples over and what places the steady-state window.
fn total_write_pages(events: &[LogEvent], page_bytes: u64) -> u64 {
    events
        .iter()
        .map(|e| match *e {
            LogEvent::Write { offset_bytes, length_bytes, .. } if length_bytes > 0 => {
                let pages = PageRange::of(offset_bytes, length_bytes, page_bytes);
                pages.end - pages.first
            }
            _ => 0,
        })
        .sum()
}

/// The volume, the stream mapper and the live segments of a replay.
struct ReplayState<'a> {
    params: &'a ReplayParams,
    volume: Volume,
    mapper: StreamMapper,
    segments: HashMap<SegmentId, Segment>,
    /// "Time" for stream decisions and lifetimes: the host bytes replayed so far.
    now_bytes: u64,
}

impl<'a> ReplayState<'a> {
    /// An empty volume of `params.ssds` SSDs and a mapper for `mapping`.
    fn new(params: &'a ReplayParams, mapping: Mapping) -> Result<ReplayState<'a>, ReplayError> {
        let ssd_count = params.ssds as usize;
        let volume = Volume::new(&params.ssd, ssd_count, params.stripe_unit_bytes)?;
        let mapper = StreamMapper::new(mapping, ssd_count, params.ssd.streams);
        Ok(ReplayState { params, volume, mapper, segments: HashMap::new(), now_bytes: 0 })
    }

    /// Replays write event `index`: opens the segment at its first write, then writes its pages.
    fn write(
        &mut self,
        index: usize,
        key: StreamKey,
        segment: SegmentId,
        offset_bytes: u64,
        length_bytes: u64,
    ) -> Result<(), ReplayError> {
        let params = self.params;
        let ssd_count = params.ssds as usize;
        let end_bytes = offset_bytes + length_bytes; // parse_log rules out overflow
        if end_bytes > self.volume.logical_bytes() {
            return Err(ReplayError::BeyondVolume {
                event: index,
                segment,
                end_bytes,
                logical_bytes: self.volume.logical_bytes(),
                blocks_per_ssd: params.ssd.blocks,
                ssds: ssd_count,
            });
        }
        let now_bytes = self.now_bytes;
        let entry = self.segments.entry(segment).or_insert_with(|| Segment {
            layout: StripedFile {
                pool_first_ssd: 0,
                stripe_count: params.ssds,
                start: (segment.0 % params.ssds as u64) as u16,
                chunks: Vec::new(),
            },
            streams: Vec::new(),
            key,
            created_at: now_bytes,
            end_bytes: 0,
        });
        if entry.streams.is_empty() {
            entry.streams =
                (0..ssd_count).map(|ssd| self.mapper.open(ssd, key, key, now_bytes)).collect();
        }
        let pages = PageRange::of(offset_bytes, length_bytes, params.ssd.page_bytes as u64);
        write_pages(&mut self.volume, entry, pages).map_err(|ssd| ReplayError::OutOfSpace {
            event: index,
            segment,
            ssds: ssd_count,
            ssd,
            blocks_per_ssd: params.ssd.blocks,
        })?;
        entry.end_bytes = entry.end_bytes.max(offset_bytes + length_bytes);
        self.now_bytes += length_bytes;
        self.mapper.lifetimes.wrote(key, length_bytes, self.now_bytes);
        Ok(())
    }

    /// Replays delete event `index`: TRIMs the segment's pages and frees its chunks.
    fn delete(&mut self, index: usize, segment: SegmentId) -> Result<(), ReplayError> {
        let Some(gone) = self.segments.remove(&segment) else {
            return Err(ReplayError::UnknownSegment { event: index, segment });
        };
        self.volume.release_file(&gone.layout);
        self.mapper.lifetimes.deleted(gone.key, self.now_bytes - gone.created_at);
        Ok(())
    }
}

/// The pages a write touches: from `first` up to, not including, `end`.
#[derive(Clone, Copy)]
struct PageRange {
    first: u64,
    end: u64,
}

impl PageRange {
    /// The pages of `page_bytes` that bytes `offset_bytes..offset_bytes + length_bytes` touch.
    fn of(offset_bytes: u64, length_bytes: u64, page_bytes: u64) -> PageRange {
        PageRange {
            first: offset_bytes / page_bytes,
            end: (offset_bytes + length_bytes).div_ceil(page_bytes),
        }
    }
}

/// Writes `pages` of `segment` chunk by chunk, allocating chunks; fails with the SSD that is full.
fn write_pages(volume: &mut Volume, segment: &mut Segment, pages: PageRange) -> Result<(), usize> {
    let chunk_pages = volume.chunk_pages() as u64;
    let mut page = pages.first;
    while page < pages.end {
        let ordinal = (page / chunk_pages) as usize;
        let in_chunk = page % chunk_pages;
        let page_count = (chunk_pages - in_chunk).min(pages.end - page);
        if segment.layout.chunks.len() <= ordinal {
            segment.layout.chunks.resize(ordinal + 1, INVALID);
        }
        let ssd = segment.layout.ssd_of(ordinal);
        if segment.layout.chunks[ordinal] == INVALID {
            let Some(chunk) = volume.allocate_chunk(ssd) else {
                return Err(ssd);
            };
            segment.layout.chunks[ordinal] = chunk;
        }
        volume.write(
            ssd,
            segment.layout.chunks[ordinal],
            in_chunk as u32,
            page_count as u32,
            segment.streams[ssd],
        );
        page += page_count;
    }
    Ok(())
}

/// Workload (5): a Spillway trace (for instance converted from a Darshan log by
/// `python/spillway_tools`) as write-log events, so it replays like the store's log.
///
/// Each trace file becomes one striped "segment" (its id is the file's index), each `write` a
/// write of that file's byte range, each `unlink` of a file holding data a delete (TRIM). The
/// placement key is the writing rank: a Darshan log is one job, so ranks are what a per-process
/// stream mapping can separate. Reads, metadata operations and unlinks of files never written
/// do not touch the SSDs and are skipped.
pub fn events_from_trace(trace: &spillway_trace::Trace) -> Vec<LogEvent> {
    use spillway_trace::Op;
    let mut written_bytes: HashMap<u32, u64> = HashMap::new();
    let mut events = Vec::new();
    for op in &trace.ops {
        match op.op {
            Op::Write if op.length > 0 => {
                let end = written_bytes.entry(op.file).or_insert(0);
                *end = (*end).max(op.offset + op.length);
                events.push(LogEvent::Write {
                    stream: StreamKey(u64::from(op.rank)),
                    segment: SegmentId(u64::from(op.file)),
                    offset_bytes: op.offset,
                    length_bytes: op.length,
                });
            }
            Op::Unlink => {
                if let Some(length_bytes) = written_bytes.remove(&op.file) {
                    events.push(LogEvent::Delete {
                        segment: SegmentId(u64::from(op.file)),
                        length_bytes,
                    });
                }
            }
            _ => {}
        }
    }
    events
}
