//! The epoch manifest: what one client wrote in one epoch, and where it placed it.
//!
//! At every commit the client writes its manifest, before the `Commit` frames, as an ordinary
//! file of the epoch named `.spillway/manifest/<client id, 16 hex>-<commit sequence>` to every
//! server it commits on, so that every survivor of a lost server holds every manifest. With the
//! pure placement ([`crate::placement`]) and [`spillway_policy::replica_set`], a reader
//! recomputes from it which servers hold every byte range written. Byte layout (all integers
//! little-endian), in docs/design/replication.md:
//!
//! ```text
//! header (56 bytes): magic "SPWMANI1", version u16 = 1, reserved u16 = 0, client_id u64,
//!   commit_seq u64, epoch u64, placement u8 (0 striped, 1 local), replicas u8,
//!   reserved u16 = 0, stripe_unit_bytes u64 (local: 0), stripe_count_or_rank u32,
//!   server_count u32
//! per server: server_id [u8; 16], domain_len u8, domain bytes
//! file_count u32; per file: name_len u16, name bytes, range_count u32,
//!   range_count × (offset u64, length u64), coalesced, in offset order
//! crc32c u32 of every byte before it
//! ```
//!
//! Decoding checks every length against what is left and never panics.

use spillway_proto::{ServerId, COMMIT_PARTICIPANTS_MAX, NAME_BYTES_MAX, SERVER_ID_BYTES};
use spillway_types::{EpochId, FAILURE_DOMAIN_BYTES_MAX};

use crate::placement::Placement;

/// The manifest's first bytes.
pub const MANIFEST_MAGIC: [u8; 8] = *b"SPWMANI1";
/// The layout version this build writes and reads.
pub const MANIFEST_VERSION: u16 = 1;
/// Bytes of the fixed header.
pub const MANIFEST_HEADER_BYTES: usize = 56;
/// Where manifests live among an epoch's files.
pub const MANIFEST_DIRECTORY: &str = ".spillway/manifest/";

const _: () = assert!(MANIFEST_HEADER_BYTES == 8 + 2 + 2 + 8 + 8 + 8 + 1 + 1 + 2 + 8 + 4 + 4);
const _: () = assert!(FAILURE_DOMAIN_BYTES_MAX <= u8::MAX as usize);
const _: () = assert!(NAME_BYTES_MAX <= u16::MAX as usize);

/// One server of the client's list, in placement order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ManifestServer {
    pub id: ServerId,
    pub failure_domain: String,
}

/// One file the client wrote in the epoch, with the byte ranges `(offset, length)` written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ManifestFile {
    pub name: String,
    pub ranges: Vec<(u64, u64)>,
}

/// A decoded manifest.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Manifest {
    pub client_id: u64,
    pub commit_seq: u64,
    pub epoch: EpochId,
    pub placement: Placement,
    pub replicas: u32,
    pub servers: Vec<ManifestServer>,
    pub files: Vec<ManifestFile>,
}

/// Why bytes are not a manifest.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ManifestError {
    #[error("manifest truncated reading {field}")]
    Truncated { field: &'static str },
    #[error("manifest field {field} has invalid value {value}")]
    BadValue { field: &'static str, value: u64 },
    #[error("manifest checksum mismatch (stored {stored:08x}, computed {computed:08x})")]
    Checksum { stored: u32, computed: u32 },
    #[error("manifest has {0} trailing bytes")]
    Trailing(usize),
}

/// Where manifest intents live: `<client id, 16 hex>-<sequence>`, written to every server
/// before the client's first write since its previous manifest, so that a manifest that never
/// arrived (its writer's epoch sealed by another writer first) is known to be missing.
pub const INTENT_DIRECTORY: &str = ".spillway/intent/";

/// The file name of the intent for a client's manifest `commit_seq`.
pub fn intent_name(client_id: u64, commit_seq: u64) -> String {
    format!("{INTENT_DIRECTORY}{client_id:016x}-{commit_seq}")
}

/// The client id and sequence an intent's or manifest's file name carries (`None`: not one).
pub fn parse_sequenced_name(name: &str) -> Option<(u64, u64)> {
    let rest =
        name.strip_prefix(INTENT_DIRECTORY).or_else(|| name.strip_prefix(MANIFEST_DIRECTORY))?;
    let (id, seq) = rest.split_once('-')?;
    if id.len() != 16 {
        return None;
    }
    Some((u64::from_str_radix(id, 16).ok()?, seq.parse().ok()?))
}

/// The file name of a client's manifest for one commit.
pub fn manifest_name(client_id: u64, commit_seq: u64) -> String {
    format!("{MANIFEST_DIRECTORY}{client_id:016x}-{commit_seq}")
}

impl Manifest {
    /// The manifest's bytes. Names and domains longer than their bounds cannot be in a manifest
    /// (the client refuses such names; the protocol such domains), so they are asserted.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(MANIFEST_HEADER_BYTES + 64 * self.servers.len());
        let (kind, unit, count_or_rank) = match self.placement {
            Placement::Striped { stripe_unit_bytes, stripe_count } => {
                (0u8, stripe_unit_bytes, stripe_count)
            }
            Placement::Local { rank } => (1u8, 0, rank),
        };
        out.extend_from_slice(&MANIFEST_MAGIC);
        out.extend_from_slice(&MANIFEST_VERSION.to_le_bytes());
        out.extend_from_slice(&0u16.to_le_bytes());
        out.extend_from_slice(&self.client_id.to_le_bytes());
        out.extend_from_slice(&self.commit_seq.to_le_bytes());
        out.extend_from_slice(&self.epoch.0.to_le_bytes());
        out.push(kind);
        out.push(self.replicas as u8);
        out.extend_from_slice(&0u16.to_le_bytes());
        out.extend_from_slice(&unit.to_le_bytes());
        out.extend_from_slice(&count_or_rank.to_le_bytes());
        out.extend_from_slice(&(self.servers.len() as u32).to_le_bytes());
        debug_assert_eq!(out.len(), MANIFEST_HEADER_BYTES);
        for server in &self.servers {
            assert!(server.failure_domain.len() <= FAILURE_DOMAIN_BYTES_MAX);
            out.extend_from_slice(&server.id.0);
            out.push(server.failure_domain.len() as u8);
            out.extend_from_slice(server.failure_domain.as_bytes());
        }
        out.extend_from_slice(&(self.files.len() as u32).to_le_bytes());
        for file in &self.files {
            assert!(file.name.len() <= NAME_BYTES_MAX);
            out.extend_from_slice(&(file.name.len() as u16).to_le_bytes());
            out.extend_from_slice(file.name.as_bytes());
            out.extend_from_slice(&(file.ranges.len() as u32).to_le_bytes());
            for &(offset, length) in &file.ranges {
                out.extend_from_slice(&offset.to_le_bytes());
                out.extend_from_slice(&length.to_le_bytes());
            }
        }
        let crc = crc32c::crc32c(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        out
    }

    /// Decodes and checks a manifest.
    pub fn decode(bytes: &[u8]) -> Result<Manifest, ManifestError> {
        if bytes.len() < MANIFEST_HEADER_BYTES + 4 + 4 {
            return Err(ManifestError::Truncated { field: "header" });
        }
        let mut r = Reader::checked(bytes, MANIFEST_MAGIC, MANIFEST_VERSION)?;
        let client_id = r.u64("client_id")?;
        let commit_seq = r.u64("commit_seq")?;
        let epoch = EpochId(r.u64("epoch")?);
        let kind = r.u8("placement")?;
        let replicas = r.u8("replicas")? as u32;
        if !(1..=spillway_policy::REPLICAS_MAX).contains(&replicas) {
            return Err(ManifestError::BadValue { field: "replicas", value: replicas as u64 });
        }
        r.zero_u16("reserved")?;
        let unit = r.u64("stripe_unit_bytes")?;
        let count_or_rank = r.u32("stripe_count_or_rank")?;
        let placement = match kind {
            0 if unit > 0 => {
                Placement::Striped { stripe_unit_bytes: unit, stripe_count: count_or_rank }
            }
            1 => Placement::Local { rank: count_or_rank },
            _ => return Err(ManifestError::BadValue { field: "placement", value: kind as u64 }),
        };
        let servers = r.servers()?;
        let files = r.files()?;
        if !r.0.is_empty() {
            return Err(ManifestError::Trailing(r.0.len()));
        }
        Ok(Manifest { client_id, commit_seq, epoch, placement, replicas, servers, files })
    }
}

pub(crate) struct Reader<'a>(pub(crate) &'a [u8]);

impl<'a> Reader<'a> {
    /// The bytes after the common head of Spillway's own files — magic [u8; 8], version u16,
    /// reserved u16 = 0 — once the trailing CRC32C of every byte before it matched.
    pub(crate) fn checked(
        bytes: &'a [u8],
        magic: [u8; 8],
        version: u16,
    ) -> Result<Reader<'a>, ManifestError> {
        let Some(split) = bytes.len().checked_sub(4) else {
            return Err(ManifestError::Truncated { field: "crc32c" });
        };
        let (body, stored) = bytes.split_at(split);
        let stored = u32::from_le_bytes(stored.try_into().expect("4 bytes"));
        let computed = crc32c::crc32c(body);
        if stored != computed {
            return Err(ManifestError::Checksum { stored, computed });
        }
        let mut r = Reader(body);
        if r.take(8, "magic")? != magic {
            return Err(ManifestError::BadValue { field: "magic", value: 0 });
        }
        let found = r.u16("version")?;
        if found != version {
            return Err(ManifestError::BadValue { field: "version", value: found as u64 });
        }
        r.zero_u16("reserved")?;
        Ok(r)
    }

    pub(crate) fn take(
        &mut self,
        n: usize,
        field: &'static str,
    ) -> Result<&'a [u8], ManifestError> {
        if self.0.len() < n {
            return Err(ManifestError::Truncated { field });
        }
        let (head, tail) = self.0.split_at(n);
        self.0 = tail;
        Ok(head)
    }
    pub(crate) fn u8(&mut self, field: &'static str) -> Result<u8, ManifestError> {
        Ok(self.take(1, field)?[0])
    }
    pub(crate) fn u16(&mut self, field: &'static str) -> Result<u16, ManifestError> {
        Ok(u16::from_le_bytes(self.take(2, field)?.try_into().expect("2 bytes")))
    }
    pub(crate) fn u32(&mut self, field: &'static str) -> Result<u32, ManifestError> {
        Ok(u32::from_le_bytes(self.take(4, field)?.try_into().expect("4 bytes")))
    }
    pub(crate) fn u64(&mut self, field: &'static str) -> Result<u64, ManifestError> {
        Ok(u64::from_le_bytes(self.take(8, field)?.try_into().expect("8 bytes")))
    }
    pub(crate) fn zero_u16(&mut self, field: &'static str) -> Result<(), ManifestError> {
        match self.u16(field)? {
            0 => Ok(()),
            other => Err(ManifestError::BadValue { field, value: other as u64 }),
        }
    }
    /// A count of elements of at least `element_bytes` each, at most `max`.
    pub(crate) fn count(
        &mut self,
        field: &'static str,
        element_bytes: usize,
        max: usize,
    ) -> Result<usize, ManifestError> {
        let n = self.u32(field)? as usize;
        if n > max || n.saturating_mul(element_bytes) > self.0.len() {
            return Err(ManifestError::BadValue { field, value: n as u64 });
        }
        Ok(n)
    }
    fn servers(&mut self) -> Result<Vec<ManifestServer>, ManifestError> {
        let n = self.count("server_count", SERVER_ID_BYTES + 2, COMMIT_PARTICIPANTS_MAX)?;
        let mut servers = Vec::with_capacity(n);
        for _ in 0..n {
            let id = ServerId(self.take(SERVER_ID_BYTES, "server_id")?.try_into().expect("16"));
            let len = self.u8("domain_len")? as usize;
            let domain = String::from_utf8_lossy(self.take(len, "domain")?).into_owned();
            if !spillway_types::is_failure_domain(&domain) {
                return Err(ManifestError::BadValue { field: "domain", value: len as u64 });
            }
            servers.push(ManifestServer { id, failure_domain: domain });
        }
        Ok(servers)
    }
    fn files(&mut self) -> Result<Vec<ManifestFile>, ManifestError> {
        let n = self.count("file_count", 2 + 1 + 4, usize::MAX)?;
        let mut files = Vec::with_capacity(n);
        for _ in 0..n {
            let len = self.u16("name_len")? as usize;
            if len == 0 || len > NAME_BYTES_MAX {
                return Err(ManifestError::BadValue { field: "name_len", value: len as u64 });
            }
            let name = std::str::from_utf8(self.take(len, "name")?)
                .map_err(|_| ManifestError::BadValue { field: "name", value: len as u64 })?
                .to_string();
            let count = self.count("range_count", 16, usize::MAX)?;
            let mut ranges = Vec::with_capacity(count);
            for _ in 0..count {
                let offset = self.u64("offset")?;
                let length = self.u64("length")?;
                if length == 0 || offset.checked_add(length).is_none() {
                    return Err(ManifestError::BadValue { field: "range", value: offset });
                }
                ranges.push((offset, length));
            }
            files.push(ManifestFile { name, ranges });
        }
        Ok(files)
    }
}

/// Adds `[offset, offset + length)` to a file's written ranges, kept coalesced (start → end).
pub(crate) fn add_range(
    ranges: &mut std::collections::BTreeMap<u64, u64>,
    offset: u64,
    length: u64,
) {
    if length == 0 {
        return;
    }
    let mut start = offset;
    let mut end = offset.saturating_add(length);
    // The range starting at or before `start` that reaches it, then every one starting inside.
    if let Some((&s, &e)) = ranges.range(..=start).next_back() {
        if e >= start {
            start = s;
            end = end.max(e);
            ranges.remove(&s);
        }
    }
    let inside: Vec<(u64, u64)> = ranges.range(start..=end).map(|(&s, &e)| (s, e)).collect();
    for (s, e) in inside {
        end = end.max(e);
        ranges.remove(&s);
    }
    ranges.insert(start, end);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn sample() -> Manifest {
        Manifest {
            client_id: 0x0123_4567_89ab_cdef,
            commit_seq: 3,
            epoch: EpochId(42),
            placement: Placement::Striped { stripe_unit_bytes: 65536, stripe_count: u32::MAX },
            replicas: 2,
            servers: (0..3)
                .map(|i| ManifestServer {
                    id: ServerId([i + 1; SERVER_ID_BYTES]),
                    failure_domain: format!("host{i}"),
                })
                .collect(),
            files: vec![
                ManifestFile { name: "ckpt/rank0".into(), ranges: vec![(0, 100), (200, 5)] },
                ManifestFile { name: "empty-ish".into(), ranges: vec![] },
            ],
        }
    }

    #[test]
    fn a_manifest_round_trips_and_its_header_is_fixed() {
        let manifest = sample();
        let bytes = manifest.encode();
        assert_eq!(&bytes[..8], b"SPWMANI1");
        assert_eq!(u32::from_le_bytes(bytes[52..56].try_into().unwrap()), 3, "server_count");
        assert_eq!(Manifest::decode(&bytes).unwrap(), manifest);
        let local = Manifest { placement: Placement::Local { rank: 7 }, ..sample() };
        assert_eq!(Manifest::decode(&local.encode()).unwrap(), local);
        assert_eq!(manifest_name(0xab, 2), ".spillway/manifest/00000000000000ab-2");
    }

    #[test]
    fn damaged_or_cut_manifests_are_refused_without_panicking() {
        let bytes = sample().encode();
        for cut in 0..bytes.len() {
            assert!(Manifest::decode(&bytes[..cut]).is_err(), "cut at {cut}");
        }
        for at in 0..bytes.len() {
            let mut flipped = bytes.clone();
            flipped[at] ^= 0x10;
            assert!(Manifest::decode(&flipped).is_err(), "bit flipped at {at}");
        }
        // A valid checksum over nonsense counts: named, no panic, no huge allocation.
        let mut body = bytes[..bytes.len() - 4].to_vec();
        body[52..56].copy_from_slice(&u32::MAX.to_le_bytes());
        let crc = crc32c::crc32c(&body);
        body.extend_from_slice(&crc.to_le_bytes());
        assert_eq!(
            Manifest::decode(&body),
            Err(ManifestError::BadValue { field: "server_count", value: u32::MAX as u64 })
        );
    }

    #[test]
    fn written_ranges_coalesce() {
        let mut ranges = BTreeMap::new();
        add_range(&mut ranges, 100, 50);
        add_range(&mut ranges, 0, 10);
        add_range(&mut ranges, 150, 10);
        add_range(&mut ranges, 300, 10);
        add_range(&mut ranges, 5, 100);
        add_range(&mut ranges, 7, 0);
        assert_eq!(ranges.into_iter().collect::<Vec<_>>(), [(0, 160), (300, 310)]);
    }
}
