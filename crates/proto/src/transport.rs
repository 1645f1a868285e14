//! Transports behind two small traits, so RDMA (libfabric) can slot in beside TCP and Unix sockets.
//!
//! A [`Listener`] accepts [`Connection`]s; a connection is a byte stream (`Read + Write`) that
//! also tells the server who the peer is, as far as the kernel knows: on a Unix-domain socket
//! from `SO_PEERCRED`; on loopback TCP from the owner of the peer's socket in `/proc/net/tcp{,6}`
//! (the peer is on this host, so the kernel knows it). The kernel cannot vouch for a
//! non-loopback TCP peer: such a peer is `nobody` here. A server with munge authentication
//! (`server.auth = munge`) does not use this identity on TCP at all: it takes the uid and gid of
//! the munge credential the client sends in the handshake (`Authenticate`, see
//! `crate::auth`), which is why it may listen on any address; without it, binding a
//! non-loopback listener needs the explicit `insecure_tcp` switch.

use std::io::{self, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The uid/gid a request runs as, established by the server.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Identity {
    pub uid: u32,
    pub gid: u32,
}

impl Identity {
    /// The unprivileged identity given to peers the kernel cannot vouch for.
    pub const NOBODY: Identity = Identity { uid: 65534, gid: 65534 };
}

/// Where a server listens or a client connects.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Endpoint {
    Tcp(SocketAddr),
    Unix(PathBuf),
}

impl std::fmt::Display for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Endpoint::Tcp(a) => write!(f, "tcp://{a}"),
            Endpoint::Unix(p) => write!(f, "unix://{}", p.display()),
        }
    }
}

impl std::str::FromStr for Endpoint {
    type Err = String;
    /// `tcp://host:port`, `host:port` or `unix:///path/to/socket`.
    fn from_str(s: &str) -> Result<Self, String> {
        if let Some(path) = s.strip_prefix("unix://") {
            if path.is_empty() {
                return Err(format!("endpoint {s:?}: empty socket path"));
            }
            return Ok(Endpoint::Unix(PathBuf::from(path)));
        }
        let address = s.strip_prefix("tcp://").unwrap_or(s);
        address
            .parse::<SocketAddr>()
            .map(Endpoint::Tcp)
            .map_err(|e| format!("endpoint {s:?}: expected tcp://IP:PORT or unix:///PATH ({e})"))
    }
}

/// The kind of stream a connection is: a server authenticates TCP peers with munge when
/// configured so, Unix-socket peers always by `SO_PEERCRED`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Transport {
    Tcp,
    Unix,
}

/// A connected byte stream to or from a peer.
pub trait Connection: Read + Write + Send {
    /// TCP or Unix socket.
    fn transport(&self) -> Transport;
    /// A human-readable peer name for logs (`tcp://127.0.0.1:40522`, `unix:uid=1000,pid=77`).
    fn peer(&self) -> String;
    /// The identity the kernel vouches for (server side).
    fn identity(&self) -> io::Result<Identity>;
    /// A second handle on the same stream (e.g. one for reading, one for writing).
    fn try_clone_connection(&self) -> io::Result<Box<dyn Connection>>;
    /// Bounds how long a read may block (`None`: forever).
    fn set_read_timeout(&self, timeout: Option<Duration>) -> io::Result<()>;
    /// Bounds how long a write may block (`None`: forever).
    fn set_write_timeout(&self, timeout: Option<Duration>) -> io::Result<()>;
    /// Shuts the sending direction down: the peer reads end-of-file after what was sent, and
    /// this side can still read what the peer sends (a lingering close).
    fn shutdown_write(&self);
    /// Shuts both directions down; a blocked reader on another handle wakes up.
    fn shutdown(&self);
    /// Whether the peer has closed the connection and nothing is left to read (without
    /// waiting or consuming anything): a client checks before it reuses a quiet connection.
    fn peer_closed(&self) -> io::Result<bool>;
    /// Before waiting for a reply, with the whole request written: returns once the reply is
    /// arriving or the peer has acknowledged every byte sent, and in the second case lifts the
    /// bound on unacknowledged bytes until [`Connection::end_quiet_wait`], so that the
    /// quiet-connection bound alone (keepalive, about 30 s) notices a peer that lost power. The
    /// kernel applies `TCP_USER_TIMEOUT` to unanswered keepalive probes too, which would stretch
    /// that to 120 s. Returns whether it lifted the bound.
    fn begin_quiet_wait(&self) -> io::Result<bool> {
        Ok(false)
    }
    /// Puts the bound on unacknowledged bytes back: before anything more is sent.
    fn end_quiet_wait(&self) -> io::Result<()> {
        Ok(())
    }
}

/// Accepts connections.
pub trait Listener: Send + Sync {
    /// Accepts one connection, or `Ok(None)` if none is waiting (listeners are non-blocking so
    /// the accept loop can notice shutdown).
    fn accept(&self) -> io::Result<Option<Box<dyn Connection>>>;
    /// Where this listener listens (with the real port if 0 was asked).
    fn endpoint(&self) -> Endpoint;
}

/// Why a listener could not be bound.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BindError {
    #[error("refusing to listen on non-loopback address {address}: remote peers are not authenticated without munge (auth = munge); --insecure-tcp accepts them unauthenticated")]
    NotLoopback { address: SocketAddr },
    #[error("cannot listen on {endpoint}: {source}")]
    Io { endpoint: Endpoint, source: io::Error },
}

/// Binds a listener. Non-loopback TCP needs `remote_tcp_allowed`: the caller authenticates
/// remote peers (munge) or was told to accept them unauthenticated (`--insecure-tcp`).
pub fn bind(endpoint: &Endpoint, remote_tcp_allowed: bool) -> Result<Box<dyn Listener>, BindError> {
    let io_error = |source| BindError::Io { endpoint: endpoint.clone(), source };
    match endpoint {
        Endpoint::Tcp(address) => {
            if !address.ip().is_loopback() && !remote_tcp_allowed {
                return Err(BindError::NotLoopback { address: *address });
            }
            let listener = TcpListener::bind(address).map_err(io_error)?;
            listener.set_nonblocking(true).map_err(io_error)?;
            Ok(Box::new(TcpTransportListener { listener }))
        }
        Endpoint::Unix(path) => {
            // A stale socket file from a previous run blocks bind; remove only sockets.
            if let Ok(meta) = std::fs::symlink_metadata(path) {
                use std::os::unix::fs::FileTypeExt;
                if meta.file_type().is_socket() {
                    let _ = std::fs::remove_file(path);
                }
            }
            let listener = UnixListener::bind(path).map_err(io_error)?;
            // Every local user may connect (connecting needs write permission on the socket
            // file, which the umask would take away): who connected comes from SO_PEERCRED and
            // what they may do is decided per request, not by the file's mode.
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(UNIX_SOCKET_MODE))
                .map_err(io_error)?;
            listener.set_nonblocking(true).map_err(io_error)?;
            Ok(Box::new(UnixTransportListener { listener, path: path.clone() }))
        }
    }
}

/// Permission bits of a listening Unix socket: connectable by everyone.
pub const UNIX_SOCKET_MODE: u32 = 0o666;

/// Longest wait for a TCP connection to be accepted. Without it a host lost for good whose
/// address is still in the neighbours' ARP caches (or cut off silently) blocks every connect for
/// the kernel's SYN retries, about two minutes: drains, status and reconnects then stall there
/// instead of naming the lost server. A live server's kernel answers within milliseconds.
pub const TCP_CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// How both ends notice a peer gone without a FIN or RST (a host that lost power, a cut
/// link): when the connection is quiet (a request acknowledged, its reply awaited), keepalive
/// probes from 10 s, every 5 s, 4 unanswered: reset about 30 s after the peer's last sign of
/// life. A live peer's kernel answers probes even while its process is stopped or busy.
pub const TCP_DEAD_PEER: spillway_sys::socket::DeadPeer = spillway_sys::socket::DeadPeer {
    idle: std::time::Duration::from_secs(10),
    interval: std::time::Duration::from_secs(5),
    probes: 4,
    unacknowledged_max: None,
};

/// A client's connections also bound how long sent bytes may stay unacknowledged: without it
/// a writer streaming to a host that vanished retransmits for the kernel's ~15 minutes before
/// its write fails. The bound is 2 minutes because it also ends a connection whose server
/// reads nothing that long (its window shut behind a very slow sync); a live server reads
/// within its bounded waits. Servers do not set it on their accepted connections: a client whose
/// job Slurm suspended must keep them.
pub const TCP_CLIENT_DEAD_PEER: spillway_sys::socket::DeadPeer = spillway_sys::socket::DeadPeer {
    unacknowledged_max: Some(std::time::Duration::from_secs(120)),
    ..TCP_DEAD_PEER
};

/// Connects to a server.
pub fn connect(endpoint: &Endpoint) -> io::Result<Box<dyn Connection>> {
    match endpoint {
        Endpoint::Tcp(address) => {
            let stream = TcpStream::connect_timeout(address, TCP_CONNECT_TIMEOUT)?;
            stream.set_nodelay(true)?;
            spillway_sys::socket::detect_dead_peer(&stream, TCP_CLIENT_DEAD_PEER)?;
            let unacknowledged_max = TCP_CLIENT_DEAD_PEER.unacknowledged_max;
            Ok(Box::new(TcpConnection { stream, unacknowledged_max }))
        }
        Endpoint::Unix(path) => Ok(Box::new(UnixConnection { stream: UnixStream::connect(path)? })),
    }
}

struct TcpTransportListener {
    listener: TcpListener,
}

impl Listener for TcpTransportListener {
    fn accept(&self) -> io::Result<Option<Box<dyn Connection>>> {
        match self.listener.accept() {
            Ok((stream, _)) => {
                stream.set_nonblocking(false)?;
                stream.set_nodelay(true)?;
                spillway_sys::socket::detect_dead_peer(&stream, TCP_DEAD_PEER)?;
                let unacknowledged_max = TCP_DEAD_PEER.unacknowledged_max;
                Ok(Some(Box::new(TcpConnection { stream, unacknowledged_max })))
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(None),
            Err(e) => Err(e),
        }
    }
    fn endpoint(&self) -> Endpoint {
        Endpoint::Tcp(self.listener.local_addr().expect("bound listener has an address"))
    }
}

struct UnixTransportListener {
    listener: UnixListener,
    path: PathBuf,
}

impl Listener for UnixTransportListener {
    fn accept(&self) -> io::Result<Option<Box<dyn Connection>>> {
        match self.listener.accept() {
            Ok((stream, _)) => {
                stream.set_nonblocking(false)?;
                Ok(Some(Box::new(UnixConnection { stream })))
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(None),
            Err(e) => Err(e),
        }
    }
    fn endpoint(&self) -> Endpoint {
        Endpoint::Unix(self.path.clone())
    }
}

impl Drop for UnixTransportListener {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

struct TcpConnection {
    stream: TcpStream,
    /// The bound on unacknowledged bytes this end set (`TCP_CLIENT_DEAD_PEER`), if any.
    unacknowledged_max: Option<Duration>,
}

/// How often a quiet wait looks whether the request has been acknowledged yet.
const ACKNOWLEDGEMENT_POLL: Duration = Duration::from_millis(50);

impl Read for TcpConnection {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.stream.read(buf)
    }
}

impl Write for TcpConnection {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.stream.write(buf)
    }
    fn write_vectored(&mut self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        self.stream.write_vectored(bufs)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.stream.flush()
    }
}

impl Connection for TcpConnection {
    fn transport(&self) -> Transport {
        Transport::Tcp
    }
    fn peer(&self) -> String {
        match self.stream.peer_addr() {
            Ok(a) => format!("tcp://{a}"),
            Err(_) => "tcp://(disconnected)".into(),
        }
    }
    fn identity(&self) -> io::Result<Identity> {
        let peer = self.stream.peer_addr()?;
        let local = self.stream.local_addr()?;
        if !peer.ip().is_loopback() {
            return Ok(Identity::NOBODY);
        }
        let uid = loopback_peer_uid(peer, local)?;
        Ok(Identity {
            uid,
            gid: spillway_sys::user::primary_gid(uid).unwrap_or(Identity::NOBODY.gid),
        })
    }
    fn try_clone_connection(&self) -> io::Result<Box<dyn Connection>> {
        Ok(Box::new(TcpConnection {
            stream: self.stream.try_clone()?,
            unacknowledged_max: self.unacknowledged_max,
        }))
    }
    fn set_read_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        self.stream.set_read_timeout(timeout)
    }
    fn set_write_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        self.stream.set_write_timeout(timeout)
    }
    fn shutdown_write(&self) {
        let _ = self.stream.shutdown(std::net::Shutdown::Write);
    }
    fn shutdown(&self) {
        let _ = self.stream.shutdown(std::net::Shutdown::Both);
    }
    fn peer_closed(&self) -> io::Result<bool> {
        spillway_sys::socket::peer_closed(&self.stream)
    }
    fn begin_quiet_wait(&self) -> io::Result<bool> {
        if self.unacknowledged_max.is_none() {
            return Ok(false);
        }
        // Bounded by the kernel: bytes never acknowledged end in a reset within
        // `unacknowledged_max`, which makes the socket readable.
        loop {
            if spillway_sys::socket::wait_readable(&self.stream, ACKNOWLEDGEMENT_POLL)? {
                return Ok(false);
            }
            if spillway_sys::socket::unacknowledged_bytes(&self.stream)? == 0 {
                spillway_sys::socket::set_unacknowledged_max(&self.stream, None)?;
                return Ok(true);
            }
        }
    }
    fn end_quiet_wait(&self) -> io::Result<()> {
        spillway_sys::socket::set_unacknowledged_max(&self.stream, self.unacknowledged_max)
    }
}

struct UnixConnection {
    stream: UnixStream,
}

impl Read for UnixConnection {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.stream.read(buf)
    }
}

impl Write for UnixConnection {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.stream.write(buf)
    }
    fn write_vectored(&mut self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        self.stream.write_vectored(bufs)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.stream.flush()
    }
}

/// `SO_PEERCRED` of a Unix-domain socket: (pid, uid, gid).
fn peer_credentials(stream: &UnixStream) -> io::Result<(i32, u32, u32)> {
    let mut credentials = libc::ucred { pid: 0, uid: 0, gid: 0 };
    let mut length = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: the fd is a live socket; `credentials` and `length` are valid for writes of the
    // sizes given.
    let rc = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            &mut credentials as *mut libc::ucred as *mut libc::c_void,
            &mut length,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((credentials.pid, credentials.uid, credentials.gid))
}

impl Connection for UnixConnection {
    fn transport(&self) -> Transport {
        Transport::Unix
    }
    fn peer(&self) -> String {
        match peer_credentials(&self.stream) {
            Ok((pid, uid, _)) => format!("unix:pid={pid},uid={uid}"),
            Err(_) => "unix:(unknown)".into(),
        }
    }
    fn identity(&self) -> io::Result<Identity> {
        let (_, uid, gid) = peer_credentials(&self.stream)?;
        Ok(Identity { uid, gid })
    }
    fn try_clone_connection(&self) -> io::Result<Box<dyn Connection>> {
        Ok(Box::new(UnixConnection { stream: self.stream.try_clone()? }))
    }
    fn set_read_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        self.stream.set_read_timeout(timeout)
    }
    fn set_write_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        self.stream.set_write_timeout(timeout)
    }
    fn shutdown_write(&self) {
        let _ = self.stream.shutdown(std::net::Shutdown::Write);
    }
    fn shutdown(&self) {
        let _ = self.stream.shutdown(std::net::Shutdown::Both);
    }
    fn peer_closed(&self) -> io::Result<bool> {
        spillway_sys::socket::peer_closed(&self.stream)
    }
}

/// The `/proc/net/tcp` spelling of a socket address (`0100007F:1F90`).
fn proc_net_address(address: SocketAddr) -> String {
    let port = address.port();
    match address.ip() {
        IpAddr::V4(ip) => format!("{:08X}:{port:04X}", u32::from_ne_bytes(ip.octets())),
        IpAddr::V6(ip) => {
            let o = ip.octets();
            let mut s = String::with_capacity(37);
            for chunk in o.chunks_exact(4) {
                s.push_str(&format!("{:08X}", u32::from_ne_bytes(chunk.try_into().expect("4"))));
            }
            format!("{s}:{port:04X}")
        }
    }
}

/// The uid owning the peer end of a loopback TCP connection: the `/proc/net/tcp{,6}` row whose
/// local address is our peer and whose remote address is us, in state ESTABLISHED with a socket
/// inode. A TIME_WAIT row of an earlier connection over the same four-tuple (Linux reuses them
/// on loopback, `tcp_tw_reuse`) shows uid 0 and no inode: matching it would make any user root.
fn loopback_peer_uid(peer: SocketAddr, local: SocketAddr) -> io::Result<u32> {
    let table = match peer {
        SocketAddr::V4(_) => "/proc/net/tcp",
        SocketAddr::V6(_) => "/proc/net/tcp6",
    };
    let text = std::fs::read_to_string(table)?;
    find_uid_in_proc_net(&text, &proc_net_address(peer), &proc_net_address(local)).ok_or_else(
        || {
            io::Error::new(
                io::ErrorKind::NotFound,
                format!("no {table} row for peer {peer} → {local}; cannot establish identity"),
            )
        },
    )
}

fn find_uid_in_proc_net(text: &str, peer: &str, local: &str) -> Option<u32> {
    text.lines().skip(1).find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        // `st` 01 is TCP_ESTABLISHED; `inode` 0 is a socket no process owns (TIME_WAIT).
        let established = fields.len() > 9 && fields[3] == "01" && fields[9] != "0";
        if established && fields[1] == peer && fields[2] == local {
            fields[7].parse().ok()
        } else {
            None
        }
    })
}

/// True for a path that looks usable as a Unix socket path (length limit of `sun_path`).
pub fn unix_path_fits(path: &Path) -> bool {
    path.as_os_str().len() < 108
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_parse() {
        assert_eq!(
            "127.0.0.1:7070".parse::<Endpoint>().unwrap(),
            Endpoint::Tcp("127.0.0.1:7070".parse().unwrap())
        );
        assert_eq!(
            "tcp://[::1]:9".parse::<Endpoint>().unwrap(),
            Endpoint::Tcp("[::1]:9".parse().unwrap())
        );
        assert_eq!(
            "unix:///tmp/x.sock".parse::<Endpoint>().unwrap(),
            Endpoint::Unix("/tmp/x.sock".into())
        );
        assert!("unix://".parse::<Endpoint>().is_err());
        assert!("example.com:80".parse::<Endpoint>().unwrap_err().contains("example.com"));
    }

    #[test]
    fn refuses_non_loopback_without_insecure_tcp() {
        let e = bind(&"0.0.0.0:0".parse().unwrap(), false).err().expect("must refuse");
        assert!(e.to_string().contains("--insecure-tcp"), "{e}");
        assert!(e.to_string().contains("munge"), "{e}");
        let remote = bind(&"0.0.0.0:0".parse().unwrap(), true).unwrap();
        assert!(matches!(remote.endpoint(), Endpoint::Tcp(a) if a.ip().is_unspecified()));
    }

    #[test]
    fn loopback_tcp_identity_is_ours() {
        let listener = bind(&"127.0.0.1:0".parse().unwrap(), false).unwrap();
        let mut client = connect(&listener.endpoint()).unwrap();
        client.write_all(b"x").unwrap();
        let server = loop {
            if let Some(c) = listener.accept().unwrap() {
                break c;
            }
            std::thread::sleep(Duration::from_millis(1));
        };
        let me = spillway_sys::user::uid();
        assert_eq!(server.identity().unwrap().uid, me);
        assert!(server.peer().starts_with("tcp://127.0.0.1:"));
    }

    #[test]
    fn unix_identity_comes_from_the_kernel() {
        let dir = std::env::temp_dir().join(format!("spillway-proto-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let endpoint = Endpoint::Unix(dir.join("s.sock"));
        let listener = bind(&endpoint, false).unwrap();
        let _client = connect(&endpoint).unwrap();
        let server = loop {
            if let Some(c) = listener.accept().unwrap() {
                break c;
            }
            std::thread::sleep(Duration::from_millis(1));
        };
        let identity = server.identity().unwrap();
        assert_eq!(
            identity,
            Identity { uid: spillway_sys::user::uid(), gid: spillway_sys::user::gid() }
        );
        assert!(server.peer().contains(&format!("pid={}", std::process::id())));
        drop(listener);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn proc_net_rows_match_by_both_ends_and_only_established() {
        let text = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n   0: 0100007F:9C4A 0100007F:1B9E 06 00000000:00000000 03:00000DF1 00000000     0        0 0 3 0000000000000000\n   1: 0100007F:9C4A 0100007F:1B9E 01 00000000:00000000 00:00000000 00000000  1234        0 1\n";
        let peer: SocketAddr = "127.0.0.1:40010".parse().unwrap();
        let local: SocketAddr = "127.0.0.1:7070".parse().unwrap();
        assert_eq!(proc_net_address(peer), "0100007F:9C4A");
        assert_eq!(
            find_uid_in_proc_net(text, &proc_net_address(peer), &proc_net_address(local)),
            Some(1234)
        );
        assert_eq!(
            find_uid_in_proc_net(text, &proc_net_address(local), &proc_net_address(peer)),
            None
        );
        // The TIME_WAIT row alone (uid 0, no inode) names nobody.
        let time_wait: String = text.lines().take(2).map(|l| format!("{l}\n")).collect();
        assert_eq!(
            find_uid_in_proc_net(&time_wait, &proc_net_address(peer), &proc_net_address(local)),
            None
        );
    }
}
