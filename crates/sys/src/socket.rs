//! Socket state a long-lived client needs.

use std::io;
use std::os::fd::AsFd;
use std::os::fd::AsRawFd;
use std::time::Duration;

use nix::errno::Errno;
use nix::sys::socket::{recv, setsockopt, sockopt, MsgFlags};

/// Whether the peer of a connected stream socket has closed it (or reset it) with nothing left
/// to read: a non-blocking `MSG_PEEK`, which neither waits nor consumes anything. `false` when
/// bytes are waiting or nothing has arrived yet.
pub fn peer_closed(socket: &impl AsRawFd) -> io::Result<bool> {
    let mut byte = [0u8; 1];
    match recv(socket.as_raw_fd(), &mut byte, MsgFlags::MSG_PEEK | MsgFlags::MSG_DONTWAIT) {
        Ok(0) => Ok(true),
        Ok(_) => Ok(false),
        Err(Errno::EAGAIN) | Err(Errno::EINTR) => Ok(false),
        Err(Errno::ECONNRESET) | Err(Errno::EPIPE) => Ok(true),
        Err(errno) => Err(io::Error::from(errno)),
    }
}

/// How a TCP connection notices a peer that vanished without a FIN or RST (a host that lost
/// power, a link cut): keepalive probes when it is quiet, and optionally a bound on how long
/// sent bytes may stay unacknowledged (`TCP_USER_TIMEOUT`).
#[derive(Clone, Copy, Debug)]
pub struct DeadPeer {
    /// Quiet time before the first probe.
    pub idle: Duration,
    /// Between probes.
    pub interval: Duration,
    /// Unanswered probes before the connection is reset.
    pub probes: u32,
    /// Longest time sent bytes may go unacknowledged (or the peer's window stay shut) before
    /// the connection is reset; `None` keeps the kernel's retransmission limit (~15 min).
    pub unacknowledged_max: Option<Duration>,
}

/// Sets `policy` on a connected TCP socket.
pub fn detect_dead_peer(socket: &impl AsFd, policy: DeadPeer) -> io::Result<()> {
    let seconds = |d: Duration| u32::try_from(d.as_secs().max(1)).unwrap_or(u32::MAX);
    setsockopt(socket, sockopt::KeepAlive, &true)?;
    setsockopt(socket, sockopt::TcpKeepIdle, &seconds(policy.idle))?;
    setsockopt(socket, sockopt::TcpKeepInterval, &seconds(policy.interval))?;
    setsockopt(socket, sockopt::TcpKeepCount, &policy.probes)?;
    if let Some(limit) = policy.unacknowledged_max {
        let ms = u32::try_from(limit.as_millis()).unwrap_or(u32::MAX);
        setsockopt(socket, sockopt::TcpUserTimeout, &ms)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::unix::net::UnixStream;

    #[test]
    fn a_closed_peer_is_seen_without_consuming_data() {
        let (mut ours, theirs) = UnixStream::pair().unwrap();
        assert!(!peer_closed(&ours).unwrap(), "open and quiet");
        let (mut a, b) = UnixStream::pair().unwrap();
        a.write_all(b"x").unwrap();
        drop(a);
        assert!(!peer_closed(&b).unwrap(), "a byte is still waiting");
        drop(theirs);
        assert!(peer_closed(&ours).unwrap(), "closed");
        ours.flush().unwrap();
    }

    #[test]
    fn dead_peer_detection_is_set_on_the_socket() {
        use nix::sys::socket::getsockopt;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let stream = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let policy = DeadPeer {
            idle: Duration::from_secs(10),
            interval: Duration::from_secs(5),
            probes: 4,
            unacknowledged_max: Some(Duration::from_secs(60)),
        };
        detect_dead_peer(&stream, policy).unwrap();
        assert!(getsockopt(&stream, sockopt::KeepAlive).unwrap());
        assert_eq!(getsockopt(&stream, sockopt::TcpKeepIdle).unwrap(), 10);
        assert_eq!(getsockopt(&stream, sockopt::TcpKeepInterval).unwrap(), 5);
        assert_eq!(getsockopt(&stream, sockopt::TcpKeepCount).unwrap(), 4);
        assert_eq!(getsockopt(&stream, sockopt::TcpUserTimeout).unwrap(), 60_000);
    }
}
