//! Where each byte of a file goes: pure functions of (placement, server count, file name, offset).
//!
//! * `Striped` (DataWarp's striped namespace): the file is cut into stripe units of
//!   `stripe_unit_bytes`; unit `i` lives on server `(first + i % stripe_count) % servers`, where
//!   `first` is a hash of the file name, so every process that writes or reads a shared (N-1)
//!   file computes the same layout without talking to anyone, and different files start on
//!   different servers.
//! * `Local` (BurstMem): a client process writes everything to its own server
//!   (`rank % servers`); an N-1 file ends up scattered over the servers of its writers, and a
//!   reader finds the pieces by asking every server for the file's extents.

/// How a client places data over the servers of a reservation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    Striped { stripe_unit_bytes: u64, stripe_count: u32 },
    Local { rank: u32 },
}

impl Placement {
    /// DataWarp-like default: 1 MiB stripe units over every server.
    pub fn striped_default() -> Placement {
        Placement::Striped { stripe_unit_bytes: 1 << 20, stripe_count: u32::MAX }
    }
}

/// One piece of a byte range that lives on a single server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Piece {
    pub server: usize,
    pub offset: u64,
    pub length: u64,
}

/// The first server of a file's stripe set (a stable hash of its name).
pub fn first_server(name: &str, servers: usize) -> usize {
    assert!(servers > 0);
    crc32c::crc32c(name.as_bytes()) as usize % servers
}

/// The servers a file may live on under this placement, in stripe order.
pub fn stripe_set(placement: Placement, name: &str, servers: usize) -> Vec<usize> {
    assert!(servers > 0);
    match placement {
        Placement::Striped { stripe_count, .. } => {
            let count = (stripe_count as usize).clamp(1, servers);
            let first = first_server(name, servers);
            (0..count).map(|i| (first + i) % servers).collect()
        }
        Placement::Local { rank } => vec![rank as usize % servers],
    }
}

/// Splits `[offset, offset + length)` into pieces, each on one server and no longer than
/// `piece_bytes_max`, in offset order.
pub fn split(
    placement: Placement,
    name: &str,
    servers: usize,
    offset: u64,
    length: u64,
    piece_bytes_max: u64,
) -> Vec<Piece> {
    assert!(servers > 0 && piece_bytes_max > 0);
    let set = stripe_set(placement, name, servers);
    let end = offset.checked_add(length).expect("range end fits u64 (checked by the caller)");
    let mut pieces = Vec::new();
    let mut at = offset;
    while at < end {
        let (server, limit) = match placement {
            Placement::Striped { stripe_unit_bytes, .. } => {
                assert!(stripe_unit_bytes > 0);
                let unit = at / stripe_unit_bytes;
                let unit_end = (unit + 1).saturating_mul(stripe_unit_bytes);
                (set[(unit % set.len() as u64) as usize], unit_end)
            }
            Placement::Local { .. } => (set[0], u64::MAX),
        };
        let piece_end = end.min(limit).min(at + piece_bytes_max);
        pieces.push(Piece { server, offset: at, length: piece_end - at });
        at = piece_end;
    }
    pieces
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn striped_units_rotate_over_the_stripe_set() {
        let p = Placement::Striped { stripe_unit_bytes: 100, stripe_count: 3 };
        let set = stripe_set(p, "f", 4);
        assert_eq!(set.len(), 3);
        let pieces = split(p, "f", 4, 50, 300, 1000);
        assert_eq!(pieces.len(), 4);
        assert_eq!(pieces[0], Piece { server: set[0], offset: 50, length: 50 });
        assert_eq!(pieces[1], Piece { server: set[1], offset: 100, length: 100 });
        assert_eq!(pieces[2], Piece { server: set[2], offset: 200, length: 100 });
        assert_eq!(pieces[3], Piece { server: set[0], offset: 300, length: 50 });
    }

    #[test]
    fn local_goes_to_the_rank_server() {
        let pieces = split(Placement::Local { rank: 5 }, "f", 2, 0, 250, 100);
        assert_eq!(pieces.iter().map(|p| p.server).collect::<Vec<_>>(), vec![1, 1, 1]);
        assert_eq!(pieces.iter().map(|p| p.length).sum::<u64>(), 250);
    }

    proptest! {
        /// Pieces tile the range exactly, respect the piece limit, and every process computes
        /// the same server for the same byte.
        #[test]
        fn pieces_tile_the_range(unit in 1u64..5000, count in 1u32..6, servers in 1usize..6,
                                 offset in 0u64..100_000, length in 0u64..50_000, max in 1u64..9000) {
            let p = Placement::Striped { stripe_unit_bytes: unit, stripe_count: count };
            let pieces = split(p, "shared", servers, offset, length, max);
            let mut at = offset;
            for piece in &pieces {
                prop_assert_eq!(piece.offset, at);
                prop_assert!(piece.length > 0 && piece.length <= max && piece.server < servers);
                prop_assert_eq!(piece.offset / unit, (piece.offset + piece.length - 1) / unit);
                at += piece.length;
                let single = split(p, "shared", servers, piece.offset, 1, 1);
                prop_assert_eq!(single[0].server, piece.server);
            }
            prop_assert_eq!(at, offset + length);
        }
    }
}
