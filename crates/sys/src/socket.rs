//! Socket state a long-lived client needs.

use std::io;
use std::os::fd::AsRawFd;

use nix::errno::Errno;
use nix::sys::socket::{recv, MsgFlags};

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
}
