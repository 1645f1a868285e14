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
    if policy.unacknowledged_max.is_some() {
        set_unacknowledged_max(socket, policy.unacknowledged_max)?;
    }
    Ok(())
}

/// Sets the bound on how long sent bytes may stay unacknowledged (`TCP_USER_TIMEOUT`), or
/// removes it (`None`: the kernel's retransmission limit and, for keepalive probes, the probe
/// count decide again).
pub fn set_unacknowledged_max(socket: &impl AsFd, limit: Option<Duration>) -> io::Result<()> {
    let ms = limit.map_or(0, |limit| u32::try_from(limit.as_millis()).unwrap_or(u32::MAX).max(1));
    setsockopt(socket, sockopt::TcpUserTimeout, &ms)?;
    Ok(())
}

/// Bytes in a TCP socket's send queue: not sent yet or not acknowledged by the peer
/// (`SIOCOUTQ`). 0: the peer has acknowledged everything sent.
pub fn unacknowledged_bytes(socket: &impl AsRawFd) -> io::Result<usize> {
    let mut bytes: libc::c_int = 0;
    // SAFETY: TIOCOUTQ (SIOCOUTQ on a socket) writes one int through the pointer, which points
    // at `bytes`.
    let done = unsafe { libc::ioctl(socket.as_raw_fd(), libc::TIOCOUTQ, &mut bytes) };
    if done < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(usize::try_from(bytes).unwrap_or(0))
}

/// Waits at most `timeout` until the socket has something to read, or an error or hangup to
/// report (a read would not block): whether it has. Consumes nothing.
pub fn wait_readable(socket: &impl AsRawFd, timeout: Duration) -> io::Result<bool> {
    let mut entry = libc::pollfd { fd: socket.as_raw_fd(), events: libc::POLLIN, revents: 0 };
    let ms = libc::c_int::try_from(timeout.as_millis()).unwrap_or(libc::c_int::MAX);
    // SAFETY: one pollfd, owned by this frame for the whole call.
    let ready = unsafe { libc::poll(&mut entry, 1, ms) };
    if ready < 0 {
        let error = io::Error::last_os_error();
        return if error.kind() == io::ErrorKind::Interrupted { Ok(false) } else { Err(error) };
    }
    Ok(ready > 0)
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
        set_unacknowledged_max(&stream, None).unwrap();
        assert_eq!(getsockopt(&stream, sockopt::TcpUserTimeout).unwrap(), 0);
    }

    #[test]
    fn readiness_and_the_send_queue_are_seen_without_consuming_anything() {
        use std::io::Read;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut ours = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (mut theirs, _) = listener.accept().unwrap();
        assert!(!wait_readable(&ours, Duration::from_millis(10)).unwrap(), "nothing sent yet");
        ours.write_all(b"request").unwrap();
        // Loopback acknowledges at once; the peer need not read for that.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while unacknowledged_bytes(&ours).unwrap() != 0 {
            assert!(std::time::Instant::now() < deadline, "never acknowledged");
            std::thread::sleep(Duration::from_millis(1));
        }
        theirs.write_all(b"reply").unwrap();
        assert!(wait_readable(&ours, Duration::from_secs(10)).unwrap(), "the reply is there");
        let mut reply = [0u8; 5];
        ours.read_exact(&mut reply).unwrap();
        assert_eq!(&reply, b"reply", "waiting consumed nothing");
    }
}
