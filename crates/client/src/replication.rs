//! Replicated undrained data: every piece on k servers of distinct failure domains.
//!
//! A piece's primary is the server placement gives it; its holders are
//! [`spillway_policy::replica_set`] of the servers' failure domains (from their handshakes at
//! connect). Writes go to every holder and succeed only when all of them acknowledge; reads
//! use the first holder still reachable; a commit names every holder as a participant, and at
//! [`Durability::Replicated`] commits each at `Memory`. The `.spillway/` prefix of file names
//! is reserved for the client's own files (the epoch manifests).

use std::collections::BTreeSet;

use spillway_policy::replicas::{distinct_domains, replica_set, REPLICAS_MAX};
use spillway_proto::{Durability, Endpoint, ErrorCode, Extent, Request, Response};
use spillway_types::EpochId;

use crate::manifest::{manifest_name, Manifest, ManifestFile, ManifestServer};
use crate::{unexpected, Client, ClientError, ClientOptions, ServerConnection};

/// A random id for a client's manifests (two clients of one epoch never share one).
pub(crate) fn random_client_id() -> Result<u64, ClientError> {
    let mut bytes = [0u8; 8];
    getrandom::getrandom(&mut bytes).map_err(|e| ClientError::Io {
        endpoint: Endpoint::Unix("getrandom".into()),
        source: std::io::Error::other(e.to_string()),
    })?;
    Ok(u64::from_le_bytes(bytes))
}

/// File names starting with this are the client's own (epoch manifests): applications may not
/// create them, and the drain never publishes them.
pub const RESERVED_PREFIX: &str = ".spillway/";

/// Refuses a user file name in the reserved `.spillway/` namespace.
pub(crate) fn check_user_name(name: &str) -> Result<(), ClientError> {
    if name.starts_with(RESERVED_PREFIX) || name == ".spillway" {
        return Err(ClientError::InvalidArgument(format!(
            "file name {name:?}: names starting with {RESERVED_PREFIX:?} are reserved for Spillway's own files"
        )));
    }
    Ok(())
}

/// Connects to every server. With replicas > 1 and the domains given
/// (`ClientOptions::failure_domains`), a server that cannot be reached gets a stand-in
/// connection (tried again at each request) and is returned as unreachable; a reached server
/// must announce the domain given.
pub(crate) fn connect_all(
    endpoints: &[Endpoint],
    options: &ClientOptions,
) -> Result<(Vec<ServerConnection>, BTreeSet<usize>), ClientError> {
    let given = &options.failure_domains;
    if !given.is_empty() && given.len() != endpoints.len() {
        return Err(ClientError::InvalidArgument(format!(
            "{} failure domains given for {} servers",
            given.len(),
            endpoints.len()
        )));
    }
    let mut servers = Vec::with_capacity(endpoints.len());
    let mut unreachable = BTreeSet::new();
    for (index, endpoint) in endpoints.iter().enumerate() {
        let munge = options.munge_socket.as_deref();
        let connection = match ServerConnection::connect_with_munge_socket(
            endpoint,
            &options.client_name,
            options.window,
            munge,
        ) {
            Ok(connection) => connection,
            Err(e)
                if options.replicas > 1
                    && !given.is_empty()
                    && unreachable_endpoint(&e).is_some() =>
            {
                unreachable.insert(index);
                ServerConnection::unreached(
                    endpoint,
                    &options.client_name,
                    options.window,
                    munge,
                    &given[index],
                )
            }
            Err(e) => return Err(e),
        };
        if !given.is_empty() && connection.failure_domain != given[index] {
            return Err(ClientError::InvalidArgument(format!(
                "server {endpoint} announces failure domain {:?}, {:?} was given",
                connection.failure_domain, given[index]
            )));
        }
        servers.push(
            connection
                .with_window_bytes_max(options.window_bytes_max)
                .with_coalesce_bytes_max(options.coalesce_bytes_max.min(options.transfer_bytes_max))
                .with_reconnect_wait_max(options.reconnect_wait_max),
        );
    }
    Ok((servers, unreachable))
}

/// Checks the replication options against the servers' failure domains.
pub(crate) fn check_options(
    options: &ClientOptions,
    domains: &[String],
) -> Result<(), ClientError> {
    let k = options.replicas;
    if k == 0 || k > REPLICAS_MAX {
        return Err(ClientError::InvalidArgument(format!(
            "replicas = {k}: the replication factor must be within 1..={REPLICAS_MAX}"
        )));
    }
    if options.durability == Durability::Replicated && k < 2 {
        return Err(ClientError::InvalidArgument(format!(
            "durability replicated needs replicas >= 2 (copies on distinct hosts), this client has replicas = {k}"
        )));
    }
    let available = distinct_domains(domains);
    if (available as u32) < k {
        return Err(ClientError::InvalidArgument(format!(
            "replicas = {k} needs servers in {k} distinct failure domains (hosts); the {} servers are in {available} ({})",
            domains.len(),
            domains.join(", ")
        )));
    }
    Ok(())
}

/// Whether an error means the server could not be reached or its connection broke (as
/// opposed to an answer): then another holder of the bytes is asked.
pub(crate) fn unreachable_endpoint(error: &ClientError) -> Option<&Endpoint> {
    match error {
        ClientError::Connect { endpoint, .. }
        | ClientError::Io { endpoint, .. }
        | ClientError::Unacknowledged { endpoint, .. } => Some(endpoint),
        _ => None,
    }
}

/// Extents held by several servers, as `(server, extent)`, reduced to disjoint ranges each
/// read from one holder: in offset order, the part of an extent another one already covers is
/// dropped (on equal offsets the lower server index wins). Bytes are counted once.
pub fn merge_extents(mut extents: Vec<(usize, Extent)>) -> Vec<(usize, Extent)> {
    extents.sort_by_key(|(server, e)| (e.offset, *server));
    let mut merged = Vec::with_capacity(extents.len());
    let mut covered_to = 0u64;
    for (server, extent) in extents {
        let end = extent.offset.saturating_add(extent.length);
        let start = extent.offset.max(covered_to);
        if start >= end {
            continue;
        }
        merged.push((server, Extent { offset: start, length: end - start }));
        covered_to = end;
    }
    merged
}

impl Client {
    /// Writes this client's manifest of `epoch` now (the ranges written since its last one) to
    /// every server of its list. `commit_epoch` does it too, but a server whose epoch
    /// another writer of a shared (N-1) file already sealed cannot take it any more: writers of
    /// shared files call this before the barrier that ends the write phase.
    pub fn write_manifest(&mut self, epoch: EpochId) -> Result<(), ClientError> {
        self.flush()?;
        self.write_manifest_to_participants(epoch, false)
    }

    /// The manifest of what was written to `epoch` since the last one, on every server of the
    /// list (each becomes a participant of the commit);
    /// nothing when nothing was written. With `sealed_ok`, a server that answers that the epoch
    /// is sealed (another writer committed it first) is skipped.
    pub(crate) fn write_manifest_to_participants(
        &mut self,
        epoch: EpochId,
        sealed_ok: bool,
    ) -> Result<(), ClientError> {
        let Some(files) = self.written.get(&epoch).filter(|f| !f.is_empty()) else {
            return Ok(());
        };
        let files: Vec<ManifestFile> = files
            .iter()
            .map(|(name, ranges)| ManifestFile {
                name: name.clone(),
                ranges: ranges.iter().map(|(&start, &end)| (start, end - start)).collect(),
            })
            .collect();
        let servers = (0..self.servers.len())
            .map(|s| ManifestServer {
                id: self.known[s].0,
                failure_domain: self.domains[s].clone(),
            })
            .collect();
        let commit_seq = match self.manifest_seq.get(&epoch) {
            Some(&seq) => seq,
            None => self.manifests_written + 1,
        };
        let manifest = Manifest {
            client_id: self.client_id,
            commit_seq,
            epoch,
            placement: self.options.placement,
            replicas: self.options.replicas,
            servers,
            files,
        };
        let name = manifest_name(self.client_id, manifest.commit_seq);
        let bytes = manifest.encode();
        // Every server of the list, not only those written to: a drain from the survivors of
        // a lost host must find every committer's manifest on each of them. Each becomes a
        // participant, so the commit seals the epoch (and names it) there too.
        let everyone = 0..self.servers.len();
        self.touched.entry(epoch).or_default().extend(everyone.clone());
        for server in everyone {
            match self.write_whole_file(epoch, server, &name, &bytes) {
                Err(e) if sealed_ok && e.code() == Some(ErrorCode::EpochReadOnly) => {}
                other => other.map_err(|e| in_manifest(e, bytes.len()))?,
            }
        }
        self.flush().map_err(|e| in_manifest(e, bytes.len()))?;
        self.manifests_written = self.manifests_written.max(commit_seq);
        self.manifest_seq.remove(&epoch);
        self.written.remove(&epoch);
        Ok(())
    }

    /// Before the first write to `epoch` since this client's last manifest of it: reserves the
    /// next manifest's sequence and writes its intent to every server of the list (each
    /// acknowledged before any data is sent). A drain from survivors then knows of every
    /// manifest that should exist: a writer whose epoch another writer sealed first cannot
    /// store its manifest, and its bytes must not be taken for lost or absent.
    pub(crate) fn write_intent(&mut self, epoch: EpochId) -> Result<(), ClientError> {
        let seq = self.manifests_written + 1;
        self.manifests_written = seq;
        self.manifest_seq.insert(epoch, seq);
        let name = crate::manifest::intent_name(self.client_id, seq);
        for server in 0..self.servers.len() {
            // Empty: its name is the record, and it takes nothing of the epoch's capacity.
            self.write_whole_file(epoch, server, &name, &[])?;
        }
        self.touched.entry(epoch).or_default().extend(0..self.servers.len());
        Ok(())
    }

    /// Creates `name` in `epoch` on server `server` alone and writes `bytes` to it.
    pub(crate) fn write_whole_file(
        &mut self,
        epoch: EpochId,
        server: usize,
        name: &str,
        bytes: &[u8],
    ) -> Result<(), ClientError> {
        let request = Request::OpenFile { epoch, name: name.to_string(), create: true };
        let file = match self.servers[server].call(&request, &[], None)? {
            (Response::FileOpened { file, .. }, ()) => file,
            (other, ()) => return Err(unexpected(&self.servers[server], "FileOpened", &other)),
        };
        let chunk = self.piece_bytes_max() as usize;
        for (index, part) in bytes.chunks(chunk).enumerate() {
            self.servers[server].write_pipelined(epoch, file, (index * chunk) as u64, part)?;
        }
        self.servers[server].flush()
    }

    /// The replication factor of this client (1: no replicas).
    pub fn replicas(&self) -> u32 {
        self.options.replicas
    }

    /// The servers holding a piece whose primary is `primary`: the primary first.
    pub fn holders(&self, primary: usize) -> Vec<usize> {
        if self.options.replicas <= 1 {
            return vec![primary];
        }
        replica_set(&self.domains, primary, self.options.replicas)
            .expect("replication options are checked against the domains at connect")
    }

    /// The first holder of `primary`'s pieces that is still reachable and has the file, if any;
    /// `Err` when every holder that could have it is unreachable.
    pub(crate) fn live_holder(
        &self,
        primary: usize,
        has_file: impl Fn(usize) -> bool,
    ) -> Result<Option<usize>, ClientError> {
        let holders = self.holders(primary);
        if let Some(&server) =
            holders.iter().find(|&&s| !self.unreachable.contains(&s) && has_file(s))
        {
            return Ok(Some(server));
        }
        if holders.iter().any(|s| self.unreachable.contains(s)) {
            let names: Vec<String> =
                holders.iter().map(|&s| self.servers[s].endpoint.to_string()).collect();
            return Err(ClientError::NoLiveHolder { servers: names.join(", ") });
        }
        Ok(None)
    }

    /// Marks the server an error names unreachable, if the error says it could not be reached
    /// and another holder may serve instead (replicas > 1). True: try again.
    pub(crate) fn note_unreachable(&mut self, error: &ClientError) -> bool {
        if self.options.replicas <= 1 {
            return false;
        }
        let Some(endpoint) = unreachable_endpoint(error) else { return false };
        let Some(index) = self.servers.iter().position(|s| &s.endpoint == endpoint) else {
            return false;
        };
        self.unreachable.insert(index)
    }

    /// Servers found unreachable since connect (replicas > 1 only; reads skip them).
    pub fn unreachable_servers(&self) -> &BTreeSet<usize> {
        &self.unreachable
    }

    /// A commit error that means a holder of the epoch is gone: EIO naming the server.
    pub(crate) fn commit_failure(
        &self,
        epoch: spillway_types::EpochId,
        error: ClientError,
    ) -> ClientError {
        if self.options.replicas <= 1 {
            return error;
        }
        match unreachable_endpoint(&error) {
            Some(endpoint) => ClientError::ReplicaLost {
                endpoint: endpoint.clone(),
                epoch,
                replicas: self.options.replicas,
                cause: error.to_string(),
            },
            None => error,
        }
    }
}

/// A full store or reservation met while storing the manifest says so: the user's data fitted,
/// the manifest (a few bytes per file and range) did not.
fn in_manifest(error: ClientError, manifest_bytes: usize) -> ClientError {
    match error {
        ClientError::Server { endpoint, code, message }
            if matches!(code, ErrorCode::NoSpace | ErrorCode::QuotaExceeded) =>
        {
            ClientError::Server {
                endpoint,
                code,
                message: format!(
                    "storing the epoch manifest ({manifest_bytes} bytes, needed to drain from the \
                     survivors of a lost server): {message}"
                ),
            }
        }
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn extent(offset: u64, length: u64) -> Extent {
        Extent { offset, length }
    }

    #[test]
    fn merged_extents_count_every_byte_once() {
        let merged = merge_extents(vec![
            (1, extent(0, 100)),
            (0, extent(0, 100)),
            (2, extent(50, 100)),
            (0, extent(300, 10)),
            (1, extent(120, 10)),
        ]);
        assert_eq!(
            merged,
            [(0, extent(0, 100)), (2, extent(100, 50)), (0, extent(300, 10))],
            "the copy on server 1 and the covered parts are dropped"
        );
        assert_eq!(merged.iter().map(|(_, e)| e.length).sum::<u64>(), 160);
    }

    #[test]
    fn reserved_names_are_refused() {
        assert!(check_user_name("ckpt/rank0").is_ok());
        assert!(check_user_name("x.spillway/a").is_ok());
        for name in [".spillway/manifest/x", ".spillway/", ".spillway"] {
            let error = check_user_name(name).unwrap_err();
            assert!(error.to_string().contains("reserved"), "{error}");
        }
    }

    #[test]
    fn options_need_enough_domains_and_replicated_needs_two_copies() {
        let domains: Vec<String> = ["h1", "h1", "h2"].iter().map(|s| s.to_string()).collect();
        let options = |replicas, durability| ClientOptions {
            replicas,
            durability,
            ..ClientOptions::default()
        };
        check_options(&options(2, Durability::Replicated), &domains).unwrap();
        let error = check_options(&options(3, Durability::Memory), &domains).unwrap_err();
        assert!(error.to_string().contains("3 distinct failure domains"), "{error}");
        let error = check_options(&options(1, Durability::Replicated), &domains).unwrap_err();
        assert!(error.to_string().contains("replicas >= 2"), "{error}");
        assert!(check_options(&options(0, Durability::Ssd), &domains).is_err());
        assert!(check_options(&options(5, Durability::Ssd), &domains).is_err());
    }
}
