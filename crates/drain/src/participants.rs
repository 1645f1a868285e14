//! Before anything of an epoch is published: every server a committer wrote the epoch to (the
//! participants its commits named, recorded by this server's store) must be among the peers
//! with the id it had then, and hold the epoch committed. A participant that was lost and
//! replaced by an empty server at its address answers with another id; one that never
//! committed answers with the epoch open or not at all. Either way publishing would put a file
//! with holes (zeros where the lost bytes were) under its final name, so the attempt fails,
//! naming the server, and nothing is published or freed: the parts held here stay.

use std::collections::HashMap;

use spillway_client::Client;
use spillway_proto::{EpochState, FileInfo, Participant, ServerId};
use spillway_types::EpochId;

/// Why the participants of an epoch do not allow publishing it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ParticipantError {
    #[error("epoch {epoch} was written to server {id} (reached at {address}), which is not among the reservation's servers with that id (now: {peers}): its parts may be lost, so nothing is published and nothing freed; files held here: {files}")]
    Missing { epoch: EpochId, id: ServerId, address: String, peers: String, files: String },
    #[error("epoch {epoch} was written to server {id} at {address}, which does not hold it committed ({state}): nothing is published and nothing freed; files held here: {files}")]
    NotCommitted { epoch: EpochId, id: ServerId, address: String, state: String, files: String },
}

/// Checks the recorded participants of `epoch` against the peers `client` reaches (asking each
/// peer afresh, so a peer restarted since the client connected answers with its current id).
pub fn verify(
    client: &mut Client,
    epoch: EpochId,
    recorded: &[Participant],
    files: &[FileInfo],
) -> Result<(), crate::DrainError> {
    if recorded.is_empty() {
        return Ok(());
    }
    let mut peers: HashMap<ServerId, (usize, Option<EpochState>)> = HashMap::new();
    for index in 0..client.server_count() {
        let epochs = client.epochs_on(index)?;
        let state = epochs.iter().find(|e| e.epoch == epoch).map(|e| e.state);
        peers.insert(client.server_identity(index).0, (index, state));
    }
    let files = || file_names(files);
    for participant in recorded {
        let (id, address) = (participant.id, participant.address.clone());
        match peers.get(&id) {
            None => {
                let peers = (0..client.server_count())
                    .map(|i| {
                        let (now, incarnation) = client.server_identity(i);
                        format!("{} is {now} incarnation {incarnation}", client.endpoint(i))
                    })
                    .collect::<Vec<_>>()
                    .join(", ");
                let files = files();
                return Err(ParticipantError::Missing { epoch, id, address, peers, files }.into());
            }
            Some((_, Some(EpochState::Committed | EpochState::CommittedMemory))) => {}
            Some((_, Some(EpochState::Drained))) => {}
            Some((index, state)) => {
                let state = match state {
                    Some(state) => format!("{state:?}"),
                    None => "does not hold it".to_string(),
                };
                let address = client.endpoint(*index).to_string();
                let files = files();
                return Err(
                    ParticipantError::NotCommitted { epoch, id, address, state, files }.into()
                );
            }
        }
    }
    Ok(())
}

/// The files' names for a message: the first few, then how many more.
fn file_names(files: &[FileInfo]) -> String {
    const SHOWN: usize = 8;
    let mut names: Vec<String> =
        files.iter().take(SHOWN).map(|f| format!("{:?}", f.name)).collect();
    if files.len() > SHOWN {
        names.push(format!("and {} more", files.len() - SHOWN));
    }
    if names.is_empty() {
        return "none".into();
    }
    names.join(", ")
}
