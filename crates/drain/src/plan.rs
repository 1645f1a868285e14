//! Pure drain planning: which server writes which bytes of a file to the PFS.
//!
//! Two plans (BurstMem IV.B). **Naive**: every server writes the extents it holds where they
//! fall, so an N-1 file written with interleaved small transfers becomes many small PFS writes
//! from many servers into the same stripes (on Lustre: extent-lock ping-pong). **Shuffled**
//! (coordinated shuffling): the file is cut into as many contiguous *domains* as there are
//! servers holding it, boundaries on multiples of the PFS stripe size; each server gathers all
//! bytes of its domain (pulling from its peers) and writes them in large, stripe-aligned,
//! sequential writes, so every stripe has exactly one writer. No I/O here: the drainer and the
//! benchmark both use these functions, and the tests check them exhaustively.

use std::collections::BTreeMap;
use std::ops::Range;

/// One PFS write as recorded in the write log: who wrote which bytes, in what order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PfsWrite {
    /// Position in the global order of writes (a timestamp or a sequence number).
    pub sequence: u64,
    /// Index of the writing server in the reservation's server list.
    pub server: u32,
    pub offset: u64,
    pub length: u64,
}

/// The contiguous domains of a file of `file_bytes` split over `participants` servers with
/// boundaries on multiples of `stripe_bytes`. Domain `k` is `result[k]`; together they cover
/// `0..file_bytes` exactly once, in order. When the file has fewer stripes than participants
/// some domains are empty (`start == end`).
pub fn partition_domains(
    file_bytes: u64,
    participants: usize,
    stripe_bytes: u64,
) -> Vec<Range<u64>> {
    assert!(participants > 0, "a file to drain has at least one participant");
    assert!(stripe_bytes > 0, "stripe size must be positive");
    let stripes = file_bytes.div_ceil(stripe_bytes);
    let n = participants as u64;
    let domains: Vec<Range<u64>> = (0..n)
        .map(|k| {
            // Stripes [k*T/n, (k+1)*T/n): sizes differ by at most one stripe.
            let first = k as u128 * stripes as u128 / n as u128;
            let last = (k + 1) as u128 * stripes as u128 / n as u128;
            // In u128: near 2^64 a stripe multiple can exceed u64 before it is clipped.
            let start = (first * stripe_bytes as u128).min(file_bytes as u128) as u64;
            let end = (last * stripe_bytes as u128).min(file_bytes as u128) as u64;
            start..end
        })
        .collect();
    assert_eq!(domains.len(), participants);
    strict_check_tiling(&domains, &(0..file_bytes), u64::MAX);
    #[cfg(feature = "strict_assertions")]
    for domain in &domains {
        // One writer per stripe: every boundary but the file's end is on a stripe.
        assert!(domain.start % stripe_bytes == 0 || domain.start == file_bytes);
        assert!(domain.end % stripe_bytes == 0 || domain.end == file_bytes);
    }
    domains
}

/// Strict builds: `parts` cover `whole` exactly once, in order, each at most `part_bytes_max`
/// (empty parts allowed). The drain must neither skip nor write twice a byte of a file.
fn strict_check_tiling(parts: &[Range<u64>], whole: &Range<u64>, part_bytes_max: u64) {
    #[cfg(feature = "strict_assertions")]
    {
        let mut at = whole.start;
        for part in parts {
            assert_eq!(part.start, at, "strict: parts of {whole:?} leave a gap or overlap");
            assert!(part.start <= part.end && part.end - part.start <= part_bytes_max);
            at = part.end;
        }
        assert_eq!(at, whole.end, "strict: parts of {whole:?} end early or late");
    }
    #[cfg(not(feature = "strict_assertions"))]
    let _ = (parts, whole, part_bytes_max);
}

/// Cuts `range` into writes of at most `write_bytes_max`, each ending on a multiple of
/// `stripe_bytes` where possible (so every write but the file's last is stripe-aligned when
/// `range.start` is and `write_bytes_max` is a multiple of the stripe).
pub fn chunk_writes(range: Range<u64>, write_bytes_max: u64, stripe_bytes: u64) -> Vec<Range<u64>> {
    assert!(write_bytes_max > 0 && stripe_bytes > 0);
    let mut out = Vec::new();
    let mut at = range.start;
    while at < range.end {
        let mut end = at.saturating_add(write_bytes_max).min(range.end);
        if end < range.end {
            let aligned = end / stripe_bytes * stripe_bytes;
            if aligned > at {
                end = aligned;
            }
        }
        out.push(at..end);
        at = end;
    }
    strict_check_tiling(&out, &range, write_bytes_max);
    out
}

/// The writes of a shuffled part: the bytes of `domain` some server holds (`extents`, in any
/// order, may overlap), each range widened to `align` boundaries inside the domain (so large
/// writes can take direct I/O), merged, and cut by [`chunk_writes`]. Ranges nobody holds are
/// never written, so holes stay holes on the PFS (the size is set by truncation), and the plan
/// grows with the data held, never with the file's size or offsets (10 bytes at 2^63 are one
/// write).
pub fn held_chunks(
    extents: &[(u64, u64)],
    domain: &Range<u64>,
    align: u64,
    write_bytes_max: u64,
    stripe_bytes: u64,
) -> Vec<Range<u64>> {
    assert!(align > 0);
    let mut held: Vec<Range<u64>> = clip_extents(extents, domain)
        .into_iter()
        .map(|r| {
            let start = (r.start / align * align).max(domain.start);
            let end = r.end.div_ceil(align).saturating_mul(align).clamp(r.end, domain.end);
            start..end
        })
        .collect();
    held.sort_by_key(|r| r.start);
    let mut merged: Vec<Range<u64>> = Vec::with_capacity(held.len());
    for r in held {
        match merged.last_mut() {
            Some(last) if r.start <= last.end => last.end = last.end.max(r.end),
            _ => merged.push(r),
        }
    }
    merged.into_iter().flat_map(|r| chunk_writes(r, write_bytes_max, stripe_bytes)).collect()
}

/// Which server each held byte of `range` is read (or, naive, written) from, when several
/// servers may hold the same bytes (replicas, or two writers of the same range): `extents` are
/// `(server, offset, length)` in any order, overlapping freely across servers. Every byte some
/// server in `usable` holds gets exactly one source: the first usable holder in ring order
/// from `preferred` (`preferred` itself when it holds the byte: a drainer's own store; the
/// next holder after it otherwise, so domain owners spread their reads over the replicas), or
/// without `preferred` the lowest-index usable holder, so every server computing the plan
/// from the same extents gets the same one. The result is sorted by offset, disjoint,
/// adjacent pieces of one server merged; bytes no usable server holds are absent. A sweep over
/// the extents' ends: O(e log e) for e extents.
pub fn read_plan(
    extents: &[(usize, u64, u64)],
    range: &Range<u64>,
    preferred: Option<usize>,
    usable: impl Fn(usize) -> bool,
) -> Vec<(usize, Range<u64>)> {
    // (position, +1 start / -1 end, server): ends sort before starts at one position.
    let mut events: Vec<(u64, i8, usize)> = Vec::with_capacity(extents.len() * 2);
    for &(server, offset, length) in extents {
        if !usable(server) {
            continue;
        }
        for clipped in clip_extents(&[(offset, length)], range) {
            events.push((clipped.start, 1, server));
            events.push((clipped.end, -1, server));
        }
    }
    events.sort_unstable();
    // How many extents of each server cover the current position.
    let mut covering: BTreeMap<usize, u32> = BTreeMap::new();
    let mut out: Vec<(usize, Range<u64>)> = Vec::new();
    let mut at = range.start;
    for (position, change, server) in events {
        if position > at {
            // Ring order from the preferred server: it when it holds the byte, else the next
            // holder after it (so domain owners spread their reads over the replicas).
            let after = preferred.and_then(|p| covering.range(p..).next());
            let source = after.or_else(|| covering.iter().next()).map(|(&s, _)| s);
            if let Some(source) = source {
                match out.last_mut() {
                    Some((s, last)) if *s == source && last.end == at => last.end = position,
                    _ => out.push((source, at..position)),
                }
            }
            at = position;
        }
        if change > 0 {
            *covering.entry(server).or_default() += 1;
        } else if let Some(count) = covering.get_mut(&server) {
            *count -= 1;
            if *count == 0 {
                covering.remove(&server);
            }
        }
    }
    strict_check_read_plan(&out, extents, range, &usable);
    out
}

/// The bytes of `written` (ranges a file's writers wrote, in any order, may overlap) that no
/// usable server holds (`extents`: `(server, offset, length)`): what losing the other servers
/// lost of the file. Sorted, disjoint, merged; empty when every written byte has a usable
/// holder, which is when a file may be drained without the unusable servers. One plan over
/// the written span and one sweep: O((w + e) log (w + e)) however many ranges the writers'
/// manifests name (a forged manifest may name millions).
pub fn lost_ranges(
    written: &[Range<u64>],
    extents: &[(usize, u64, u64)],
    usable: impl Fn(usize) -> bool,
) -> Vec<Range<u64>> {
    let mut sorted: Vec<Range<u64>> = written.iter().filter(|r| r.start < r.end).cloned().collect();
    sorted.sort_by_key(|r| r.start);
    let mut merged: Vec<Range<u64>> = Vec::with_capacity(sorted.len());
    for range in sorted {
        push_merged(&mut merged, range);
    }
    let (Some(first), Some(last)) = (merged.first(), merged.last()) else { return Vec::new() };
    let span = first.start..last.end;
    let held: Vec<Range<u64>> =
        read_plan(extents, &span, None, &usable).into_iter().map(|(_, r)| r).collect();
    let mut lost: Vec<Range<u64>> = Vec::new();
    let mut next = 0;
    for range in merged {
        let mut at = range.start;
        while next < held.len() && held[next].end <= at {
            next += 1;
        }
        let mut i = next;
        while i < held.len() && held[i].start < range.end {
            if held[i].start > at {
                push_merged(&mut lost, at..held[i].start);
            }
            at = at.max(held[i].end);
            i += 1;
        }
        if at < range.end {
            push_merged(&mut lost, at..range.end);
        }
    }
    lost
}

/// Appends `r` to sorted, disjoint `ranges`, merging it with the last one it touches.
fn push_merged(ranges: &mut Vec<Range<u64>>, r: Range<u64>) {
    match ranges.last_mut() {
        Some(last) if r.start <= last.end => last.end = last.end.max(r.end),
        _ => ranges.push(r),
    }
}

/// Strict builds: the read plan's pieces are sorted, disjoint, inside `range`, each held by its
/// source, and together exactly the bytes some usable server holds: no byte read twice or
/// skipped (a skipped byte would be published as zero).
fn strict_check_read_plan(
    plan: &[(usize, Range<u64>)],
    extents: &[(usize, u64, u64)],
    range: &Range<u64>,
    usable: &dyn Fn(usize) -> bool,
) {
    #[cfg(feature = "strict_assertions")]
    {
        // The server's extents (touching ones together) cover `r`.
        let holds = |server: usize, r: &Range<u64>| {
            let own: Vec<(u64, u64)> =
                extents.iter().filter(|e| e.0 == server).map(|e| (e.1, e.2)).collect();
            let mut pieces = clip_extents(&own, r);
            pieces.sort_by_key(|p| p.start);
            let mut at = r.start;
            for p in pieces {
                if p.start <= at {
                    at = at.max(p.end);
                }
            }
            at >= r.end
        };
        let mut at = range.start;
        let mut total = 0u64;
        for (server, piece) in plan {
            assert!(
                piece.start >= at && piece.start < piece.end && piece.end <= range.end,
                "strict: read plan of {range:?} overlaps or leaves the range"
            );
            assert!(
                usable(*server) && holds(*server, piece),
                "strict: server {server} does not hold {piece:?}"
            );
            total += piece.end - piece.start;
            at = piece.end;
        }
        let mut held: Vec<Range<u64>> = extents
            .iter()
            .filter(|e| usable(e.0))
            .flat_map(|e| clip_extents(&[(e.1, e.2)], range))
            .collect();
        held.sort_by_key(|r| r.start);
        let (mut union, mut end) = (0u64, range.start);
        for r in held {
            let start = r.start.max(end);
            if r.end > start {
                union += r.end - start;
                end = r.end;
            }
        }
        assert_eq!(total, union, "strict: read plan of {range:?} skips or repeats held bytes");
    }
    #[cfg(not(feature = "strict_assertions"))]
    let _ = (plan, extents, range, usable);
}

/// Whether `buffer` holds only zeros: such a chunk is left a hole on the PFS (it reads the
/// same and takes no space). Sixteen bytes at a time; real data fails at its first word.
pub fn all_zeros(buffer: &[u8]) -> bool {
    let mut words = buffer.chunks_exact(16);
    words.by_ref().all(|w| u128::from_ne_bytes(w.try_into().expect("16 bytes")) == 0)
        && words.remainder().iter().all(|&b| b == 0)
}

/// CRC32C of `crc`'s bytes followed by `zeros` zero bytes, in O(log zeros) steps (a hole of
/// 2^63 bytes costs 63 combinations, never a buffer).
pub fn crc32c_append_zeros(crc: u32, zeros: u64) -> u32 {
    let mut crc = crc;
    // CRC32C of 2^k zero bytes, k = 0, 1, ...: each the previous appended to itself.
    let mut power = crc32c::crc32c(&[0u8]);
    let mut power_len = 1u64;
    let mut left = zeros;
    while left > 0 {
        if left & 1 == 1 {
            crc = crc32c::crc32c_combine(crc, power, power_len as usize);
        }
        left >>= 1;
        if left > 0 {
            power = crc32c::crc32c_combine(power, power, power_len as usize);
            power_len <<= 1;
        }
    }
    crc
}

/// Intersects sorted, disjoint extents (`(offset, length)`) with `range`.
pub fn clip_extents(extents: &[(u64, u64)], range: &Range<u64>) -> Vec<Range<u64>> {
    extents
        .iter()
        .filter_map(|&(offset, length)| {
            let start = offset.max(range.start);
            let end = offset.saturating_add(length).min(range.end);
            (start < end).then_some(start..end)
        })
        .collect()
}

/// The naive plan for one server: its own extents, each cut to at most `write_bytes_max`.
pub fn naive_writes(extents: &[(u64, u64)], write_bytes_max: u64) -> Vec<Range<u64>> {
    let mut out = Vec::new();
    for &(offset, length) in extents {
        let first = out.len();
        let extent_end = offset.saturating_add(length);
        let mut at = offset;
        while at < extent_end {
            let end = at.saturating_add(write_bytes_max).min(extent_end);
            out.push(at..end);
            at = end;
        }
        strict_check_tiling(&out[first..], &(offset..extent_end), write_bytes_max);
    }
    out
}

/// Stand-in for Lustre extent-lock ping-pong: for each stripe-sized region, how many times the
/// writing server changes between consecutive writes touching it (in `sequence` order), summed.
pub fn lock_switches(log: &[PfsWrite], stripe_bytes: u64) -> u64 {
    assert!(stripe_bytes > 0);
    let mut sorted: Vec<&PfsWrite> = log.iter().filter(|w| w.length > 0).collect();
    sorted.sort_by_key(|w| (w.sequence, w.server, w.offset));
    let mut last_writer: std::collections::HashMap<u64, u32> = std::collections::HashMap::new();
    let mut switches = 0u64;
    for w in sorted {
        let first = w.offset / stripe_bytes;
        let last = (w.offset + w.length - 1) / stripe_bytes;
        for stripe in first..=last {
            if let Some(previous) = last_writer.insert(stripe, w.server) {
                if previous != w.server {
                    switches += 1;
                }
            }
        }
    }
    switches
}

/// Fraction of writes that start on a stripe boundary and are whole stripes long (or end at the
/// end of the file, `file_bytes`).
pub fn stripe_aligned_fraction(log: &[PfsWrite], stripe_bytes: u64, file_bytes: u64) -> f64 {
    if log.is_empty() {
        return 1.0;
    }
    let aligned = log
        .iter()
        .filter(|w| {
            w.offset % stripe_bytes == 0
                && (w.length % stripe_bytes == 0 || w.offset + w.length == file_bytes)
        })
        .count();
    aligned as f64 / log.len() as f64
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn all_zeros_finds_a_nonzero_byte_anywhere() {
        assert!(all_zeros(&[]) && all_zeros(&[0; 37]));
        for at in [0, 15, 16, 31, 36] {
            let mut buffer = [0u8; 37];
            buffer[at] = 1;
            assert!(!all_zeros(&buffer), "byte {at}");
        }
    }

    #[test]
    fn four_servers_one_gib() {
        let d = partition_domains(1 << 30, 4, MIB);
        assert_eq!(
            d,
            vec![0..256 * MIB, 256 * MIB..512 * MIB, 512 * MIB..768 * MIB, 768 * MIB..1024 * MIB]
        );
    }

    #[test]
    fn small_file_leaves_empty_domains() {
        let d = partition_domains(MIB + 5, 4, MIB);
        let nonempty: Vec<_> = d.iter().filter(|r| !r.is_empty()).cloned().collect();
        assert_eq!(nonempty, vec![0..MIB, MIB..MIB + 5]);
        assert_eq!(d.len(), 4);
    }

    #[test]
    fn interleaved_naive_ping_pongs_and_shuffled_does_not() {
        // 4 servers, 16 KiB blocks round robin over 4 MiB: naive writes in time order.
        let block = 16 * 1024;
        let mut naive = Vec::new();
        let mut seq = 0;
        for i in 0..(4 * MIB / block) {
            naive.push(PfsWrite {
                sequence: seq,
                server: (i % 4) as u32,
                offset: i * block,
                length: block,
            });
            seq += 1;
        }
        assert!(lock_switches(&naive, MIB) > 200);
        let mut shuffled = Vec::new();
        for (k, d) in partition_domains(4 * MIB, 4, MIB).into_iter().enumerate() {
            for w in chunk_writes(d, 8 * MIB, MIB) {
                shuffled.push(PfsWrite {
                    sequence: seq,
                    server: k as u32,
                    offset: w.start,
                    length: w.end - w.start,
                });
                seq += 1;
            }
        }
        assert_eq!(lock_switches(&shuffled, MIB), 0);
        assert_eq!(stripe_aligned_fraction(&shuffled, MIB, 4 * MIB), 1.0);
        assert_eq!(stripe_aligned_fraction(&naive, MIB, 4 * MIB), 0.0);
    }

    #[test]
    fn held_chunks_skip_holes_and_never_grow_with_the_offset() {
        // 10 bytes at 1 GiB: one aligned 4 KiB write, not a GiB of zeros.
        let gib = 1u64 << 30;
        let d = partition_domains(gib + 10, 1, MIB)[0].clone();
        assert_eq!(held_chunks(&[(gib, 10)], &d, 4096, 8 * MIB, MIB), vec![gib..gib + 10]);
        // 10 bytes at 2^63 (and an extent running to the end of u64): bounded, no overflow.
        let far = 1u64 << 63;
        let domains = partition_domains(far + 10, 4, MIB);
        let last = domains[3].clone();
        assert_eq!(held_chunks(&[(far, 10)], &last, 4096, 8 * MIB, MIB), vec![far..far + 10]);
        assert!(held_chunks(&[(far, 10)], &domains[0], 4096, 8 * MIB, MIB).is_empty());
        let top = partition_domains(u64::MAX, 2, MIB);
        assert_eq!(top[1].end, u64::MAX);
        let chunks = held_chunks(&[(u64::MAX - 5, 100)], &top[1], 4096, 8 * MIB, MIB);
        assert_eq!(chunks, vec![(u64::MAX - 5) / 4096 * 4096..u64::MAX]);
        // Overlapping and unsorted extents of several servers merge; widening stays inside.
        let d = 4096u64..(64 * 1024);
        let got = held_chunks(&[(9000, 10), (5000, 100), (40_000, 5)], &d, 4096, 16 * 1024, 4096);
        assert_eq!(got, vec![4096..12_288, 36_864..40_960]);
    }

    #[test]
    fn a_lost_server_loses_only_what_no_replica_holds() {
        // Replicas=2 over three servers: server 1 lost, each of its ranges has another holder.
        let replicated = [(0, 0, 100), (1, 0, 100), (1, 100, 100), (2, 100, 100)];
        let whole = vec![0..200, 150..200];
        assert!(lost_ranges(&whole, &replicated, |s| s != 1).is_empty());
        // Replicas=1: exactly server 1's bytes that were written are lost; holes were never
        // written, so they are not a loss.
        let single = [(0, 0, 100), (1, 100, 50), (2, 300, 100)];
        let written = [0..150, 300..400];
        assert_eq!(lost_ranges(&written, &single, |s| s != 1), vec![100..150]);
        assert!(lost_ranges(&written, &single, |_| true).is_empty());
        // Everything lost.
        assert_eq!(lost_ranges(&[5..10, 8..20], &[], |_| true), vec![5..20]);
    }

    #[test]
    fn zeros_append_like_real_zero_bytes() {
        for (prefix, zeros) in
            [(&b""[..], 0u64), (b"abc", 1), (b"x", 4096), (b"", 1000), (b"hi", 77_777)]
        {
            let mut real = prefix.to_vec();
            real.resize(prefix.len() + zeros as usize, 0);
            assert_eq!(crc32c_append_zeros(crc32c::crc32c(prefix), zeros), crc32c::crc32c(&real));
        }
        // A hole at 2^63 is arithmetic, not a buffer.
        let _ = crc32c_append_zeros(0, 1 << 63);
    }

    #[test]
    fn naive_cuts_large_extents() {
        assert_eq!(naive_writes(&[(10, 25), (100, 3)], 10), vec![10..20, 20..30, 30..35, 100..103]);
    }

    #[test]
    fn replicated_bytes_are_read_once_from_one_holder() {
        // Server 0 holds 0..130, server 2 holds 120..300 (a replica overlapping it partly),
        // server 1 holds 250..260: each byte once; the preferred server's own bytes first.
        let extents = [(0, 0, 130), (2, 120, 180), (1, 250, 10)];
        let r = 100..280;
        let lowest = vec![(0, 100..130), (2, 130..250), (1, 250..260), (2, 260..280)];
        assert_eq!(read_plan(&extents, &r, None, |_| true), lowest);
        // From server 1: its own bytes, else the next holder in ring order (2, then 0).
        assert_eq!(
            read_plan(&extents, &r, Some(1), |_| true),
            vec![(0, 100..120), (2, 120..250), (1, 250..260), (2, 260..280)]
        );
        assert_eq!(read_plan(&extents, &r, Some(2), |_| true), vec![(0, 100..120), (2, 120..280)]);
        // Server 0 unusable (lost): its bytes that nobody else holds are absent, not zeros.
        assert_eq!(read_plan(&extents, &r, Some(2), |s| s != 0), vec![(2, 120..280)]);
        // Nothing held, or nothing inside the range.
        assert!(read_plan(&[], &r, Some(0), |_| true).is_empty());
        assert!(read_plan(&[(0, 0, 10)], &r, Some(0), |_| true).is_empty());
        // Extents reaching the end of u64 never overflow.
        assert_eq!(
            read_plan(
                &[(1, u64::MAX - 10, 10), (0, u64::MAX - 4, 4)],
                &(0..u64::MAX),
                Some(0),
                |_| true
            ),
            vec![(1, u64::MAX - 10..u64::MAX - 4), (0, u64::MAX - 4..u64::MAX)]
        );
    }

    proptest! {
        #[test]
        fn domains_cover_once_and_align(file in 0u64..(64 * MIB), n in 1usize..40, stripe_pow in 12u32..22) {
            let stripe = 1u64 << stripe_pow;
            let d = partition_domains(file, n, stripe);
            prop_assert_eq!(d.len(), n);
            let mut at = 0;
            for r in &d {
                prop_assert_eq!(r.start, at);
                prop_assert!(r.start <= r.end);
                prop_assert!(r.start % stripe == 0 || r.start == file);
                at = r.end;
            }
            prop_assert_eq!(at, file);
            // Balanced: sizes differ by at most one stripe.
            let sizes: Vec<u64> = d.iter().map(|r| r.end - r.start).collect();
            let (lo, hi) = (*sizes.iter().min().unwrap(), *sizes.iter().max().unwrap());
            prop_assert!(hi - lo <= stripe);
        }

        #[test]
        fn read_plans_read_every_held_byte_once_from_a_usable_holder(
            ext in proptest::collection::vec((0usize..4, 0u64..2000, 1u64..600), 0..24),
            a in 0u64..2600, b in 0u64..2600, preferred in proptest::option::of(0usize..4), lost in 0usize..5,
        ) {
            let range = a.min(b)..a.max(b);
            let usable = |s: usize| s != lost;
            let plan = read_plan(&ext, &range, preferred, usable);
            // Byte by byte: a byte is in the plan iff a usable server holds it, and then its
            // source holds it and is the preferred server whenever that one holds it.
            let holders = |x: u64| -> Vec<usize> {
                ext.iter().filter(|&&(s, o, l)| usable(s) && x >= o && x < o + l).map(|e| e.0).collect()
            };
            let mut at = range.start;
            for (_, piece) in &plan {
                prop_assert!(piece.start >= at && piece.start < piece.end);
                at = piece.end;
            }
            prop_assert!(at <= range.end);
            for x in range.clone() {
                let source = plan.iter().find(|(_, p)| p.contains(&x)).map(|(s, _)| *s);
                let h = holders(x);
                match source {
                    None => prop_assert!(h.is_empty(), "byte {} held by {:?} but not read", x, h),
                    Some(s) => {
                        prop_assert!(h.contains(&s));
                        let expected = match preferred {
                            Some(p) => h.iter().copied().filter(|&s| s >= p).min().unwrap_or(*h.iter().min().unwrap()),
                            None => *h.iter().min().unwrap(),
                        };
                        prop_assert_eq!(s, expected);
                    }
                }
            }
        }

        #[test]
        fn lost_ranges_are_the_written_bytes_no_usable_server_holds(
            ext in proptest::collection::vec((0usize..4, 0u64..2000, 1u64..600), 0..16),
            written in proptest::collection::vec((0u64..2400, 0u64..400), 0..6),
            lost_server in 0usize..5,
        ) {
            let written: Vec<Range<u64>> = written.into_iter().map(|(o, l)| o..o + l).collect();
            let usable = |s: usize| s != lost_server;
            let lost = lost_ranges(&written, &ext, usable);
            let mut at = 0;
            for r in &lost {
                prop_assert!(r.start >= at && r.start < r.end, "not sorted, disjoint and merged: {:?}", lost);
                at = r.end + 1;
            }
            for x in 0u64..2800 {
                let was_written = written.iter().any(|r| r.contains(&x));
                let held = ext.iter().any(|&(s, o, l)| usable(s) && x >= o && x < o + l);
                let reported = lost.iter().any(|r| r.contains(&x));
                prop_assert_eq!(reported, was_written && !held, "byte {}", x);
            }
        }

        #[test]
        fn chunks_tile_the_range(start in 0u64..1000, len in 0u64..5000, max in 1u64..700, stripe in 1u64..300) {
            let chunks = chunk_writes(start..start + len, max, stripe);
            let mut at = start;
            for c in &chunks {
                prop_assert_eq!(c.start, at);
                prop_assert!(c.end > c.start && c.end - c.start <= max);
                at = c.end;
            }
            prop_assert_eq!(at, start + len);
        }

        #[test]
        fn clipped_extents_stay_inside(ext in proptest::collection::vec((0u64..100, 1u64..50), 0..10), a in 0u64..3000, b in 0u64..3000) {
            // Build sorted disjoint extents.
            let mut at = 0;
            let extents: Vec<(u64, u64)> = ext.into_iter().map(|(gap, len)| { let e = (at + gap, len); at += gap + len; e }).collect();
            let range = a.min(b)..a.max(b);
            let clipped = clip_extents(&extents, &range);
            let total: u64 = clipped.iter().map(|r| r.end - r.start).sum();
            let expected: u64 = (range.start..range.end).filter(|x| extents.iter().any(|&(o, l)| *x >= o && *x < o + l)).count() as u64;
            prop_assert_eq!(total, expected);
        }
    }
}
