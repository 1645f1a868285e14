//! The on-disk record format (docs/design/log-format.md describes it byte by byte).
//!
//! Every byte the store puts in a segment file is part of a record: a fixed 64-byte header,
//! then the payload, then zero padding to the next 8-byte boundary. The same bytes live in the
//! DRAM ring, so spilling is a verbatim copy and compaction is a verbatim copy again. Encoding
//! and decoding are the only places that know the layout; both check it (pair assertions).

use crate::grant::EpochGrant;
use crate::participants::EpochParticipant;
use spillway_types::{EpochId, FileId, SegmentId, StreamKey, GRANT_ALLOWED_IDS_MAX};

/// "SPWR" read as a little-endian u32.
pub const RECORD_MAGIC: u32 = u32::from_le_bytes(*b"SPWR");
/// Format version written into every header; readers refuse other versions.
pub const FORMAT_VERSION: u16 = 1;
/// Size of the fixed record header.
pub const HEADER_BYTES: usize = 64;
/// Records start at multiples of this (payloads are zero-padded up to it).
pub const RECORD_ALIGN_BYTES: usize = 8;
/// Stream key reserved for the store's own metadata segments (file names, commits, epoch
/// states). Client writes may not use it.
pub const META_STREAM: StreamKey = StreamKey(u64::MAX);

const _: () = assert!(HEADER_BYTES & (RECORD_ALIGN_BYTES - 1) == 0);
const _: () = assert!(RECORD_ALIGN_BYTES.is_power_of_two());

/// What a record means. The discriminant is the on-disk byte.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[repr(u8)]
pub enum RecordKind {
    /// First record of every segment: names the segment and its stream. No payload.
    SegmentHeader = 1,
    /// File data: `payload` is written at `offset` of file `file` in epoch `epoch`.
    Data = 2,
    /// The UTF-8 path name of (`epoch`, `file`), so drains can name PFS files after a restart.
    FileName = 3,
    /// Epoch `epoch` is committed; payload is a [`CommitPayload`].
    Commit = 4,
    /// Epoch `epoch` changed lifecycle state; `offset` holds the [`EpochStateCode`].
    EpochState = 5,
    /// Epoch `epoch` is granted: who may use it, its capacity and its stream; payload is a
    /// grant payload ([`encode_grant`]). A later grant of the same epoch replaces it.
    Grant = 6,
    /// Epoch `epoch`'s grant is revoked (no payload): nobody but root may use it any more.
    GrantRevoked = 7,
    /// The servers (ids) committers wrote epoch `epoch` to; payload is a participants payload
    /// ([`encode_participants`]) holding the whole union. A later one replaces it.
    Participants = 8,
    /// `length` bytes of file `file` from `offset` read as zeros without being stored
    /// (fallocate's punch hole and zero range, a shrinking truncate's zero-fill); the payload
    /// is the length ([`encode_zeros_payload`]). Indexed, counted and retired like `Data`.
    Zeros = 9,
}

impl RecordKind {
    pub fn from_byte(byte: u8) -> Option<RecordKind> {
        Some(match byte {
            1 => RecordKind::SegmentHeader,
            2 => RecordKind::Data,
            3 => RecordKind::FileName,
            4 => RecordKind::Commit,
            5 => RecordKind::EpochState,
            6 => RecordKind::Grant,
            7 => RecordKind::GrantRevoked,
            8 => RecordKind::Participants,
            9 => RecordKind::Zeros,
            _ => return None,
        })
    }
}

/// Lifecycle codes stored in `EpochState` records.
pub mod epoch_state_code {
    pub const DRAINED: u64 = 2;
    pub const DELETED: u64 = 3;
}

/// The decoded fixed header of one record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecordHeader {
    pub kind: RecordKind,
    pub sequence: u64,
    pub stream: StreamKey,
    pub epoch: EpochId,
    pub file: FileId,
    pub offset: u64,
    pub payload_bytes: u32,
}

/// Bytes a record occupies in DRAM or on SSD, header and padding included.
pub fn record_bytes(payload_bytes: u64) -> u64 {
    let unpadded = HEADER_BYTES as u64 + payload_bytes;
    unpadded.div_ceil(RECORD_ALIGN_BYTES as u64) * RECORD_ALIGN_BYTES as u64
}

impl RecordHeader {
    /// Writes the header into `out[..64]` with the CRC fields filled from `payload_crc`
    /// (the CRC32C of the payload alone, computed by the caller while copying).
    ///
    /// Record CRC = CRC32C over the payload followed by header bytes 0..60; computing the payload
    /// part first lets writers checksum outside the store lock and seal the header inside it.
    pub fn encode(&self, payload_crc: u32, out: &mut [u8]) {
        assert!(out.len() >= HEADER_BYTES);
        let out = &mut out[..HEADER_BYTES];
        out[0..4].copy_from_slice(&RECORD_MAGIC.to_le_bytes());
        out[4..6].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
        out[6] = self.kind as u8;
        out[7] = 0;
        out[8..16].copy_from_slice(&self.sequence.to_le_bytes());
        out[16..24].copy_from_slice(&self.stream.0.to_le_bytes());
        out[24..32].copy_from_slice(&self.epoch.0.to_le_bytes());
        out[32..40].copy_from_slice(&self.file.0.to_le_bytes());
        out[40..48].copy_from_slice(&self.offset.to_le_bytes());
        out[48..52].copy_from_slice(&self.payload_bytes.to_le_bytes());
        out[52..56].copy_from_slice(&0u32.to_le_bytes());
        let header_crc = crc32c::crc32c(&out[0..56]);
        out[56..60].copy_from_slice(&header_crc.to_le_bytes());
        let record_crc = crc32c::crc32c_append(payload_crc, &out[0..60]);
        out[60..64].copy_from_slice(&record_crc.to_le_bytes());
    }

    /// Decodes and checks a header (magic, version, kind, reserved bytes, header CRC). The
    /// payload is checked separately by [`verify_payload`].
    pub fn decode(bytes: &[u8]) -> Result<RecordHeader, &'static str> {
        if bytes.len() < HEADER_BYTES {
            return Err("header cut short");
        }
        let u32_at = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap());
        let u64_at = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap());
        if u32_at(0) != RECORD_MAGIC {
            return Err("bad magic");
        }
        if u16::from_le_bytes([bytes[4], bytes[5]]) != FORMAT_VERSION {
            return Err("unknown format version");
        }
        if crc32c::crc32c(&bytes[0..56]) != u32_at(56) {
            return Err("header CRC mismatch");
        }
        let kind = RecordKind::from_byte(bytes[6]).ok_or("unknown record kind")?;
        if bytes[7] != 0 || u32_at(52) != 0 {
            return Err("reserved header bytes are not zero");
        }
        Ok(RecordHeader {
            kind,
            sequence: u64_at(8),
            stream: StreamKey(u64_at(16)),
            epoch: EpochId(u64_at(24)),
            file: FileId(u64_at(32)),
            offset: u64_at(40),
            payload_bytes: u32_at(48),
        })
    }
}

/// The record CRC field (bytes 60..64) for a header whose bytes 0..60 are final and a payload
/// whose CRC32C is `payload_crc`. Data records are sealed this way when they leave DRAM.
pub fn record_crc(header: &[u8], payload_crc: u32) -> u32 {
    crc32c::crc32c_append(payload_crc, &header[0..60])
}

/// Checks the record CRC and the zero padding of a whole record (`record` starts at the header
/// and spans `record_bytes(payload_bytes)`).
pub fn verify_payload(header: &RecordHeader, record: &[u8]) -> Result<(), &'static str> {
    let total = record_bytes(header.payload_bytes as u64) as usize;
    if record.len() < total {
        return Err("record cut short");
    }
    let payload_end = HEADER_BYTES + header.payload_bytes as usize;
    let payload_crc = crc32c::crc32c(&record[HEADER_BYTES..payload_end]);
    let stored = u32::from_le_bytes(record[60..64].try_into().unwrap());
    if crc32c::crc32c_append(payload_crc, &record[0..60]) != stored {
        return Err("record CRC mismatch");
    }
    if record[payload_end..total].iter().any(|&b| b != 0) {
        return Err("padding is not zero");
    }
    Ok(())
}

/// Payload bytes of a `Zeros` record: the length of its run of zeros (u64).
pub const ZEROS_PAYLOAD_BYTES: usize = 8;
const _: () = assert!(ZEROS_PAYLOAD_BYTES as u64 <= METADATA_PAYLOAD_BYTES_MAX);

/// The payload of a `Zeros` record of `length` bytes.
pub fn encode_zeros_payload(length: u64) -> [u8; ZEROS_PAYLOAD_BYTES] {
    length.to_le_bytes()
}

/// The length of a `Zeros` record's run (whose header is `header`), checked: 8 payload bytes,
/// a length above 0, and a run that ends inside the offset space.
pub fn decode_zeros_payload(header: &RecordHeader, payload: &[u8]) -> Result<u64, &'static str> {
    let bytes: [u8; ZEROS_PAYLOAD_BYTES] =
        payload.try_into().map_err(|_| "zeros payload is not 8 bytes")?;
    let length = u64::from_le_bytes(bytes);
    if length == 0 {
        return Err("zeros run of length 0");
    }
    if header.offset.checked_add(length).is_none() {
        return Err("zeros run overflows the offset space");
    }
    Ok(length)
}

/// Encodes a whole record (header, payload, padding) into a fresh buffer. Used for the small
/// metadata records; data records are encoded in place in the DRAM ring.
pub fn encode_record(header: &RecordHeader, payload: &[u8]) -> Vec<u8> {
    assert_eq!(header.payload_bytes as usize, payload.len());
    let total = record_bytes(payload.len() as u64) as usize;
    let mut out = vec![0u8; total];
    out[HEADER_BYTES..HEADER_BYTES + payload.len()].copy_from_slice(payload);
    header.encode(crc32c::crc32c(payload), &mut out);
    debug_assert!(verify_payload(&RecordHeader::decode(&out).unwrap(), &out).is_ok());
    out
}

/// Payload of a `Commit` record: what the epoch holds, and how far segments were known to be
/// fsync'd when it was written (recovery uses these to tell corruption from a torn tail).
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct CommitPayload {
    pub data_records: u64,
    pub payload_bytes: u64,
    pub synced: Vec<(SegmentId, u64)>,
}

impl CommitPayload {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(24 + 16 * self.synced.len());
        out.extend_from_slice(&self.data_records.to_le_bytes());
        out.extend_from_slice(&self.payload_bytes.to_le_bytes());
        out.extend_from_slice(&(self.synced.len() as u64).to_le_bytes());
        for (segment, length) in &self.synced {
            out.extend_from_slice(&segment.0.to_le_bytes());
            out.extend_from_slice(&length.to_le_bytes());
        }
        out
    }

    pub fn decode(bytes: &[u8]) -> Result<CommitPayload, &'static str> {
        let u64_at = |at: usize| -> Result<u64, &'static str> {
            bytes
                .get(at..at + 8)
                .map(|b| u64::from_le_bytes(b.try_into().unwrap()))
                .ok_or("commit payload cut short")
        };
        let count = u64_at(16)?;
        if bytes.len() as u64 != 24 + 16 * count {
            return Err("commit payload length does not match its sync point count");
        }
        let mut synced = Vec::with_capacity(count as usize);
        for i in 0..count as usize {
            synced.push((SegmentId(u64_at(24 + 16 * i)?), u64_at(32 + 16 * i)?));
        }
        Ok(CommitPayload { data_records: u64_at(0)?, payload_bytes: u64_at(8)?, synced })
    }
}

/// Largest payload recovery accepts for a metadata record (name, commit, grant), whatever
/// `store.record_payload_bytes_max` says about data records.
pub const METADATA_PAYLOAD_BYTES_MAX: u64 = 1 << 20;

/// Fixed part of a `Grant` payload; the allowed uids, then the allowed gids (u32 each) follow.
pub const GRANT_FIXED_BYTES: usize = 40;
/// Largest `Grant` payload: both allowed lists at their bound.
pub const GRANT_PAYLOAD_BYTES_MAX: usize = GRANT_FIXED_BYTES + 4 * 2 * GRANT_ALLOWED_IDS_MAX;
/// The `stream` field of a grant that assigns no stream (the writers' own streams are used).
/// It is the metadata stream's key, which no data record may use.
pub const GRANT_NO_STREAM: u64 = u64::MAX;

const _: () = assert!(GRANT_FIXED_BYTES.is_multiple_of(RECORD_ALIGN_BYTES));
const _: () = assert!(GRANT_PAYLOAD_BYTES_MAX as u64 <= METADATA_PAYLOAD_BYTES_MAX);
const _: () = assert!(GRANT_ALLOWED_IDS_MAX <= u16::MAX as usize);
const _: () = assert!(GRANT_NO_STREAM == META_STREAM.0);

/// Encodes a grant as the payload of a `Grant` record (docs/design/log-format.md): owner uid
/// and gid, capacity, reservation capacity, stream, the two list counts, then the lists. The
/// lists must be sorted without duplicates and within [`GRANT_ALLOWED_IDS_MAX`].
pub fn encode_grant(grant: &EpochGrant) -> Vec<u8> {
    assert!(grant.allowed_uids.len() <= GRANT_ALLOWED_IDS_MAX);
    assert!(grant.allowed_gids.len() <= GRANT_ALLOWED_IDS_MAX);
    let ids = grant.allowed_uids.len() + grant.allowed_gids.len();
    let mut out = Vec::with_capacity(GRANT_FIXED_BYTES + 4 * ids);
    out.extend_from_slice(&grant.owner_uid.to_le_bytes());
    out.extend_from_slice(&grant.owner_gid.to_le_bytes());
    out.extend_from_slice(&grant.capacity_bytes.to_le_bytes());
    out.extend_from_slice(&grant.reservation_capacity_bytes.to_le_bytes());
    out.extend_from_slice(&grant.stream.map_or(GRANT_NO_STREAM, |s| s.0).to_le_bytes());
    out.extend_from_slice(&(grant.allowed_uids.len() as u16).to_le_bytes());
    out.extend_from_slice(&(grant.allowed_gids.len() as u16).to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
    debug_assert_eq!(out.len(), GRANT_FIXED_BYTES);
    for id in grant.allowed_uids.iter().chain(&grant.allowed_gids) {
        out.extend_from_slice(&id.to_le_bytes());
    }
    out
}

/// Decodes a `Grant` payload, checking its length, reserved bytes, list bounds and that each
/// list is strictly increasing (the form `encode_grant` writes).
pub fn decode_grant(bytes: &[u8]) -> Result<EpochGrant, &'static str> {
    if bytes.len() < GRANT_FIXED_BYTES {
        return Err("grant payload shorter than its fixed part");
    }
    let u16_at = |at: usize| u16::from_le_bytes([bytes[at], bytes[at + 1]]) as usize;
    let u32_at = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap());
    let u64_at = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap());
    let (uids, gids) = (u16_at(32), u16_at(34));
    if uids > GRANT_ALLOWED_IDS_MAX || gids > GRANT_ALLOWED_IDS_MAX {
        return Err("grant allows more ids than GRANT_ALLOWED_IDS_MAX");
    }
    if u32_at(36) != 0 {
        return Err("grant payload reserved bytes are not zero");
    }
    if bytes.len() != GRANT_FIXED_BYTES + 4 * (uids + gids) {
        return Err("grant payload length does not match its id counts");
    }
    let list = |from: usize, count: usize| -> Vec<u32> {
        (0..count).map(|i| u32_at(GRANT_FIXED_BYTES + 4 * (from + i))).collect()
    };
    let (allowed_uids, allowed_gids) = (list(0, uids), list(uids, gids));
    let increasing = |ids: &[u32]| ids.windows(2).all(|pair| pair[0] < pair[1]);
    if !increasing(&allowed_uids) || !increasing(&allowed_gids) {
        return Err("grant id lists are not strictly increasing");
    }
    let stream = u64_at(24);
    Ok(EpochGrant {
        owner_uid: u32_at(0),
        owner_gid: u32_at(4),
        capacity_bytes: u64_at(8),
        reservation_capacity_bytes: u64_at(16),
        stream: (stream != GRANT_NO_STREAM).then_some(StreamKey(stream)),
        allowed_uids,
        allowed_gids,
    })
}

/// Bytes of a participant's server id.
pub const PARTICIPANT_ID_BYTES: usize = 16;
/// Most participants one epoch may record (as many as one `Commit` may name: a reservation
/// never spans more servers). Small, because every commit that adds one rewrites the union.
pub const PARTICIPANTS_MAX: usize = 256;
/// Longest participant address, in bytes.
pub const PARTICIPANT_ADDRESS_BYTES_MAX: usize = 255;
/// Fixed part of a `Participants` payload: count u32, reserved u32.
pub const PARTICIPANTS_FIXED_BYTES: usize = 8;
/// Bytes of one entry before its address: id, address length u16.
pub const PARTICIPANT_ENTRY_FIXED_BYTES: usize = PARTICIPANT_ID_BYTES + 2;
/// Largest `Participants` payload.
pub const PARTICIPANTS_PAYLOAD_BYTES_MAX: usize = PARTICIPANTS_FIXED_BYTES
    + PARTICIPANTS_MAX * (PARTICIPANT_ENTRY_FIXED_BYTES + PARTICIPANT_ADDRESS_BYTES_MAX);

const _: () = assert!(PARTICIPANTS_PAYLOAD_BYTES_MAX as u64 <= METADATA_PAYLOAD_BYTES_MAX);
const _: () = assert!(PARTICIPANT_ADDRESS_BYTES_MAX <= u16::MAX as usize);
const _: () = assert!(PARTICIPANTS_MAX <= u32::MAX as usize);

/// Encodes participants as the payload of a `Participants` record (docs/design/log-format.md):
/// count u32, reserved u32 (0), then per participant its id (16 bytes), the address length
/// (u16) and the address (UTF-8). The list must be sorted by id without duplicates.
pub fn encode_participants(participants: &[EpochParticipant]) -> Vec<u8> {
    assert!(participants.len() <= PARTICIPANTS_MAX);
    let mut out = Vec::with_capacity(PARTICIPANTS_FIXED_BYTES + 40 * participants.len());
    out.extend_from_slice(&(participants.len() as u32).to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
    for participant in participants {
        assert!(participant.address.len() <= PARTICIPANT_ADDRESS_BYTES_MAX);
        out.extend_from_slice(&participant.id);
        out.extend_from_slice(&(participant.address.len() as u16).to_le_bytes());
        out.extend_from_slice(participant.address.as_bytes());
    }
    out
}

/// Decodes a `Participants` payload, checking its count, reserved bytes, every length, UTF-8,
/// that no id is all zeros and that ids strictly increase (the form the store writes).
pub fn decode_participants(bytes: &[u8]) -> Result<Vec<EpochParticipant>, &'static str> {
    if bytes.len() < PARTICIPANTS_FIXED_BYTES {
        return Err("participants payload shorter than its fixed part");
    }
    let count = u32::from_le_bytes(bytes[0..4].try_into().expect("4 bytes")) as usize;
    if count > PARTICIPANTS_MAX {
        return Err("more participants than PARTICIPANTS_MAX");
    }
    if bytes[4..8] != [0; 4] {
        return Err("participants payload reserved bytes are not zero");
    }
    let mut rest = &bytes[PARTICIPANTS_FIXED_BYTES..];
    let mut out: Vec<EpochParticipant> = Vec::with_capacity(count);
    for _ in 0..count {
        if rest.len() < PARTICIPANT_ENTRY_FIXED_BYTES {
            return Err("participants payload truncated");
        }
        let id: [u8; PARTICIPANT_ID_BYTES] =
            rest[..PARTICIPANT_ID_BYTES].try_into().expect("16 bytes");
        let length = u16::from_le_bytes([rest[16], rest[17]]) as usize;
        rest = &rest[PARTICIPANT_ENTRY_FIXED_BYTES..];
        if length > PARTICIPANT_ADDRESS_BYTES_MAX || rest.len() < length {
            return Err("participant address length out of range");
        }
        let address = std::str::from_utf8(&rest[..length])
            .map_err(|_| "participant address is not UTF-8")?
            .to_string();
        rest = &rest[length..];
        if id == [0; PARTICIPANT_ID_BYTES] {
            return Err("participant id is all zeros");
        }
        if out.last().is_some_and(|last| last.id >= id) {
            return Err("participant ids are not strictly increasing");
        }
        out.push(EpochParticipant { id, address });
    }
    if !rest.is_empty() {
        return Err("participants payload has trailing bytes");
    }
    Ok(out)
}

/// File name of a segment in the SSD directory.
pub fn segment_file_name(segment: SegmentId) -> String {
    format!("segment-{:016x}.log", segment.0)
}

/// Inverse of [`segment_file_name`]; `None` for files that are not segments.
pub fn parse_segment_file_name(name: &str) -> Option<SegmentId> {
    let hex = name.strip_prefix("segment-")?.strip_suffix(".log")?;
    if hex.len() != 16 {
        return None;
    }
    u64::from_str_radix(hex, 16).ok().map(SegmentId)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trips_and_detects_flips() {
        let header = RecordHeader {
            kind: RecordKind::Data,
            sequence: 42,
            stream: StreamKey(7),
            epoch: EpochId(3),
            file: FileId(9),
            offset: 4096,
            payload_bytes: 5,
        };
        let record = encode_record(&header, b"hello");
        assert_eq!(record.len(), 72);
        let decoded = RecordHeader::decode(&record).unwrap();
        assert_eq!(decoded, header);
        verify_payload(&decoded, &record).unwrap();
        for byte in 0..record.len() {
            let mut damaged = record.clone();
            damaged[byte] ^= 0x10;
            let ok = RecordHeader::decode(&damaged)
                .and_then(|h| verify_payload(&h, &damaged).map(|_| h))
                .is_ok();
            assert!(!ok, "flip at byte {byte} went unnoticed");
        }
    }

    #[test]
    fn commit_payload_round_trips() {
        let payload = CommitPayload {
            data_records: 3,
            payload_bytes: 100,
            synced: vec![(SegmentId(1), 4096), (SegmentId(5), 64)],
        };
        assert_eq!(CommitPayload::decode(&payload.encode()).unwrap(), payload);
        assert!(CommitPayload::decode(&payload.encode()[..30]).is_err());
    }

    #[test]
    fn grant_payload_round_trips_and_refuses_malformed_lists() {
        let grant = EpochGrant {
            owner_uid: 1000,
            owner_gid: 100,
            allowed_uids: vec![1001, 1002],
            allowed_gids: vec![50],
            capacity_bytes: 64 << 20,
            reservation_capacity_bytes: 128 << 20,
            stream: Some(StreamKey((1 << 63) | 3)),
        };
        let bytes = encode_grant(&grant);
        assert_eq!(bytes.len(), GRANT_FIXED_BYTES + 12);
        assert_eq!(decode_grant(&bytes).unwrap(), grant);
        let plain = EpochGrant { owner_uid: 7, owner_gid: 7, ..EpochGrant::default() };
        assert_eq!(decode_grant(&encode_grant(&plain)).unwrap(), plain);
        assert!(decode_grant(&bytes[..bytes.len() - 4]).is_err());
        let mut unsorted = bytes.clone();
        unsorted[GRANT_FIXED_BYTES..GRANT_FIXED_BYTES + 4].copy_from_slice(&2000u32.to_le_bytes());
        assert_eq!(decode_grant(&unsorted), Err("grant id lists are not strictly increasing"));
        let mut too_many = bytes.clone();
        too_many[32..34].copy_from_slice(&(GRANT_ALLOWED_IDS_MAX as u16 + 1).to_le_bytes());
        assert!(decode_grant(&too_many).is_err());
        let mut reserved = bytes;
        reserved[37] = 1;
        assert!(decode_grant(&reserved).is_err());
    }

    #[test]
    fn segment_names_round_trip() {
        let name = segment_file_name(SegmentId(0xabc));
        assert_eq!(name, "segment-0000000000000abc.log");
        assert_eq!(parse_segment_file_name(&name), Some(SegmentId(0xabc)));
        assert_eq!(parse_segment_file_name("segment-12.log"), None);
        assert_eq!(record_bytes(0), 64);
        assert_eq!(record_bytes(1), 72);
        assert_eq!(record_bytes(8), 72);
    }
}
