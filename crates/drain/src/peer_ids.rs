//! Which server this drainer met at each position of the reservation's list, kept across
//! restarts (`<ssd_dir>/drain.peers`), and the replacements it noticed: a position answering
//! with another server id than before is a lost host replaced by an empty server at its
//! address, and the epochs held here then may miss the lost server's parts (no survivor need
//! have recorded it as a participant), so they are not published.
//!
//! The file is text, rewritten whole on every change (staging file, fsync, rename, fsync of the
//! directory), layout in docs/design/drain.md ("Peer ids"). One that cannot be read or parsed
//! stops the drainer from starting (forgetting a replacement could publish a truncated file).

use std::collections::BTreeSet;
use std::io::Write;
use std::path::{Path, PathBuf};

use spillway_proto::{Endpoint, ServerId, SERVER_ID_BYTES};
use spillway_types::EpochId;

/// File name in the server's SSD directory.
pub const PEERS_FILE: &str = "drain.peers";

const HEADER: &str = "spillway-drain-peers 1";

/// A server met at a position: its id, failure domain and the endpoint it was reached at.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Seen {
    pub id: ServerId,
    pub domain: String,
    pub endpoint: String,
}

/// A position that answered with a new id: the lost server, the new id, the epochs held here
/// when it was noticed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Replacement {
    pub position: usize,
    pub lost: ServerId,
    pub domain: String,
    pub now: ServerId,
    pub epochs: BTreeSet<EpochId>,
}

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PeerIdsError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{path} line {line}: {what} (the drain's record of its peers' ids; fix or remove it knowing that a replaced peer's epochs may then be published without its parts)")]
    Corrupt { path: PathBuf, line: usize, what: String },
}

/// The record, loaded and kept in memory; every change is written through.
pub struct PeerIds {
    path: PathBuf,
    seen: Vec<Option<Seen>>,
    replaced: Vec<Replacement>,
}

impl PeerIds {
    /// Loads `<directory>/drain.peers` (absent: nothing met yet) for the reservation's `peers`.
    /// A position whose recorded endpoint is not the configured one is forgotten (the server
    /// list changed: a different server there is not a replacement).
    pub fn open(directory: &Path, peers: &[Endpoint]) -> Result<PeerIds, PeerIdsError> {
        let path = directory.join(PEERS_FILE);
        let mut record = PeerIds { path, seen: vec![None; peers.len()], replaced: Vec::new() };
        let text = match std::fs::read_to_string(&record.path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(record),
            Err(source) => return Err(PeerIdsError::Io { path: record.path, source }),
        };
        let (seen, replaced) = parse(&text).map_err(|(line, what)| PeerIdsError::Corrupt {
            path: record.path.clone(),
            line,
            what,
        })?;
        for (position, s) in seen {
            if peers.get(position).is_some_and(|e| e.to_string() == s.endpoint) {
                record.seen[position] = Some(s);
            }
        }
        record.replaced = replaced;
        Ok(record)
    }

    /// What was met at `position`, if anything.
    pub fn seen(&self, position: usize) -> Option<&Seen> {
        self.seen.get(position).and_then(Option::as_ref)
    }

    /// Records that `position` answers as `now`; if it answered with another id before, records
    /// the replacement with `held` (the epochs held here now) and returns it. Written through
    /// when anything changed.
    pub fn note(
        &mut self,
        position: usize,
        now: Seen,
        held: impl FnOnce() -> BTreeSet<EpochId>,
    ) -> Result<Option<Replacement>, PeerIdsError> {
        let previous = self.seen[position].clone();
        if previous.as_ref() == Some(&now) {
            return Ok(None);
        }
        let replacement = previous.filter(|p| p.id != now.id).map(|lost| Replacement {
            position,
            lost: lost.id,
            domain: lost.domain,
            now: now.id,
            epochs: held(),
        });
        if let Some(r) = &replacement {
            self.replaced.push(r.clone());
        }
        self.seen[position] = Some(now);
        self.write()?;
        Ok(replacement)
    }

    /// Forgets the epochs no longer held here (deleted, or drained and collected), so a later
    /// epoch reusing an id is not held back, and replacements left with none. Written through
    /// when anything changed.
    pub fn retain_held(&mut self, held: &BTreeSet<EpochId>) -> Result<(), PeerIdsError> {
        let before: usize = self.replaced.iter().map(|r| r.epochs.len()).sum();
        for r in &mut self.replaced {
            r.epochs.retain(|e| held.contains(e));
        }
        self.replaced.retain(|r| !r.epochs.is_empty());
        let after: usize = self.replaced.iter().map(|r| r.epochs.len()).sum();
        if after != before {
            self.write()?;
        }
        Ok(())
    }

    /// The first replacement noticed while `epoch` was held here.
    pub fn replacement_for(&self, epoch: EpochId) -> Option<&Replacement> {
        self.replaced.iter().find(|r| r.epochs.contains(&epoch))
    }

    fn write(&self) -> Result<(), PeerIdsError> {
        let io = |path: &Path, source| PeerIdsError::Io { path: path.to_path_buf(), source };
        let mut text = format!("{HEADER}\n");
        for (position, s) in self.seen.iter().enumerate() {
            if let Some(s) = s {
                text.push_str(&format!("seen {position} {} {} {}\n", s.id, s.domain, s.endpoint));
            }
        }
        for r in &self.replaced {
            let epochs: Vec<String> = r.epochs.iter().map(|e| e.0.to_string()).collect();
            let epochs = if epochs.is_empty() { "-".to_string() } else { epochs.join(",") };
            text.push_str(&format!(
                "replaced {} {} {} {} {epochs}\n",
                r.position, r.lost, r.domain, r.now
            ));
        }
        let staging = self.path.with_extension("peers.staging");
        let mut file = std::fs::File::create(&staging).map_err(|e| io(&staging, e))?;
        file.write_all(text.as_bytes()).map_err(|e| io(&staging, e))?;
        file.sync_all().map_err(|e| io(&staging, e))?;
        std::fs::rename(&staging, &self.path).map_err(|e| io(&self.path, e))?;
        let dir = self.path.parent().unwrap_or(Path::new("."));
        std::fs::File::open(dir).and_then(|d| d.sync_all()).map_err(|e| io(dir, e))
    }
}

type Parsed = (Vec<(usize, Seen)>, Vec<Replacement>);

/// Parses the file's text; `Err((line, what))` names the first bad line (1-based).
fn parse(text: &str) -> Result<Parsed, (usize, String)> {
    let mut lines = text.lines().enumerate().map(|(i, l)| (i + 1, l));
    match lines.next() {
        Some((_, HEADER)) => {}
        _ => return Err((1, format!("expected {HEADER:?}"))),
    }
    let (mut seen, mut replaced) = (Vec::new(), Vec::new());
    for (number, line) in lines {
        let bad = |what: &str| (number, format!("{what}: {line:?}"));
        let mut fields = line.splitn(5, ' ');
        match fields.next() {
            Some("seen") => {
                let position = number_field(fields.next()).ok_or_else(|| bad("position"))?;
                let id = server_id(fields.next()).ok_or_else(|| bad("server id"))?;
                let domain = domain_field(fields.next()).ok_or_else(|| bad("failure domain"))?;
                let endpoint =
                    fields.next().filter(|e| !e.is_empty()).ok_or_else(|| bad("endpoint"))?;
                seen.push((position, Seen { id, domain, endpoint: endpoint.to_string() }));
            }
            Some("replaced") => {
                let mut fields = line.split(' ').skip(1);
                let position = number_field(fields.next()).ok_or_else(|| bad("position"))?;
                let lost = server_id(fields.next()).ok_or_else(|| bad("lost server id"))?;
                let domain = domain_field(fields.next()).ok_or_else(|| bad("failure domain"))?;
                let now = server_id(fields.next()).ok_or_else(|| bad("new server id"))?;
                let epochs = match fields.next() {
                    Some("-") => BTreeSet::new(),
                    Some(list) => list
                        .split(',')
                        .map(|e| e.parse().map(EpochId).map_err(|_| bad("epoch list")))
                        .collect::<Result<_, _>>()?,
                    None => return Err(bad("epoch list")),
                };
                if fields.next().is_some() {
                    return Err(bad("trailing fields"));
                }
                replaced.push(Replacement { position, lost, domain, now, epochs });
            }
            _ => return Err(bad("unknown record")),
        }
    }
    Ok((seen, replaced))
}

fn number_field(field: Option<&str>) -> Option<usize> {
    field?.parse().ok()
}

fn server_id(field: Option<&str>) -> Option<ServerId> {
    let hex = field?;
    if hex.len() != 2 * SERVER_ID_BYTES || !hex.is_ascii() {
        return None;
    }
    let mut id = [0u8; SERVER_ID_BYTES];
    for (i, byte) in id.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(ServerId(id))
}

/// A failure domain as recorded: a valid name, or `-` for none announced.
fn domain_field(field: Option<&str>) -> Option<String> {
    let domain = field?;
    (domain == "-" || spillway_types::is_failure_domain(domain)).then(|| domain.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn seen(id: u8, domain: &str, endpoint: &str) -> Seen {
        Seen {
            id: ServerId([id; SERVER_ID_BYTES]),
            domain: domain.into(),
            endpoint: endpoint.into(),
        }
    }

    #[test]
    fn a_replacement_is_noticed_once_and_survives_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let peers: Vec<Endpoint> = ["unix:///run/a b.sock", "tcp://127.0.0.1:9"]
            .iter()
            .map(|e| e.parse().unwrap())
            .collect();
        let (a, b) = (peers[0].to_string(), peers[1].to_string());
        let mut record = PeerIds::open(dir.path(), &peers).unwrap();
        let held = || BTreeSet::from([EpochId(3), EpochId(4)]);
        assert_eq!(record.note(0, seen(1, "host0", &a), held).unwrap(), None);
        assert_eq!(record.note(1, seen(2, "host1", &b), held).unwrap(), None);
        // A restart of the same server (same id) is no replacement.
        assert_eq!(record.note(1, seen(2, "host1", &b), || unreachable!()).unwrap(), None);
        let replaced = record.note(1, seen(9, "host1b", &b), held).unwrap().unwrap();
        assert_eq!((replaced.lost, replaced.now), (ServerId([2; 16]), ServerId([9; 16])));
        assert_eq!(replaced.domain, "host1");
        drop(record);
        // After a restart: still known, the replacement still holds epochs 3 and 4 back.
        let record = PeerIds::open(dir.path(), &peers).unwrap();
        assert_eq!(record.seen(1), Some(&seen(9, "host1b", &b)));
        assert_eq!(record.replacement_for(EpochId(4)).unwrap().lost, ServerId([2; 16]));
        assert!(record.replacement_for(EpochId(5)).is_none());
        // Epoch 3 deleted here: forgotten (a later epoch 3 is not held back); 4 still is.
        let mut record = PeerIds::open(dir.path(), &peers).unwrap();
        record.retain_held(&BTreeSet::from([EpochId(4), EpochId(9)])).unwrap();
        assert!(record.replacement_for(EpochId(3)).is_none());
        assert!(record.replacement_for(EpochId(4)).is_some());
        record.retain_held(&BTreeSet::new()).unwrap();
        assert!(PeerIds::open(dir.path(), &peers).unwrap().replacement_for(EpochId(4)).is_none());
        // Another server list: the positions whose endpoint changed are forgotten.
        let other: Vec<Endpoint> = ["unix:///run/a b.sock", "tcp://127.0.0.1:10"]
            .iter()
            .map(|e| e.parse().unwrap())
            .collect();
        let record = PeerIds::open(dir.path(), &other).unwrap();
        assert!(record.seen(0).is_some() && record.seen(1).is_none());
    }

    #[test]
    fn a_damaged_record_is_refused_naming_the_line() {
        let dir = tempfile::tempdir().unwrap();
        let peers: Vec<Endpoint> = vec!["tcp://127.0.0.1:9".parse().unwrap()];
        let id = ServerId([7; 16]);
        for (text, line) in [
            ("garbage\n".to_string(), 1),
            (format!("{HEADER}\nseen 0 {id} host0\n"), 2),
            (format!("{HEADER}\nseen 0 12 host0 tcp://x\n"), 2),
            (format!("{HEADER}\nreplaced 0 {id} ../x {id} 1\n"), 2),
            (format!("{HEADER}\nreplaced 0 {id} h {id} 1,x\n"), 2),
            (format!("{HEADER}\nseen 0 {id} h tcp://127.0.0.1:9\nwhat\n"), 3),
        ] {
            std::fs::write(dir.path().join(PEERS_FILE), &text).unwrap();
            match PeerIds::open(dir.path(), &peers) {
                Err(PeerIdsError::Corrupt { line: l, .. }) => assert_eq!(l, line, "{text}"),
                other => panic!("{text}: {:?}", other.map(|_| ())),
            }
        }
    }

    proptest! {
        #[test]
        fn parsing_never_panics(text in ".{0,200}") {
            let _ = parse(&text);
            let _ = parse(&format!("{HEADER}\n{text}"));
        }
    }
}
