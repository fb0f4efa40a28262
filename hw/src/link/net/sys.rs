//! The system calls of the network port: socket options and batched sends and receives
//! (`sendmmsg(2)`, `recvmmsg(2)`: one system call for up to [`BATCH`] datagrams).

#![allow(unsafe_code)]

use std::io;
use std::mem::{size_of, zeroed};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::RawFd;

/// Datagrams one system call sends or receives at most.
pub(crate) const BATCH: usize = 32;

/// `setsockopt(fd, level, opt, value)` for an int option.
pub(crate) fn set_int(
    fd: RawFd,
    level: libc::c_int,
    opt: libc::c_int,
    value: usize,
) -> io::Result<()> {
    let v = libc::c_int::try_from(value).unwrap_or(libc::c_int::MAX);
    set_opt(fd, level, opt, &v)
}

/// `setsockopt(fd, level, opt, value)` for an option whose value is the plain structure
/// `T` (an int, a `tpacket_req`, a `sock_fprog` whose program the kernel copies).
pub(crate) fn set_opt<T>(
    fd: RawFd,
    level: libc::c_int,
    opt: libc::c_int,
    value: &T,
) -> io::Result<()> {
    // SAFETY: `fd` is an open socket for the whole call; `value` is a whole `T`, alive for
    // the call, passed with its exact size and only read (with what it points to).
    let r = unsafe {
        libc::setsockopt(
            fd,
            level,
            opt,
            std::ptr::from_ref(value).cast(),
            size_of::<T>() as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// `addr` as a socket address structure, with its length.
fn to_raw(addr: &SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: all-zero bytes are a valid `sockaddr_storage`.
    let mut ss: libc::sockaddr_storage = unsafe { zeroed() };
    let len = match addr {
        SocketAddr::V4(a) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from_ne_bytes(a.ip().octets()),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: `sockaddr_storage` is larger than and aligned for `sockaddr_in`.
            unsafe { std::ptr::write(std::ptr::from_mut(&mut ss).cast(), sin) };
            size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(a) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: a.flowinfo(),
                sin6_addr: libc::in6_addr {
                    s6_addr: a.ip().octets(),
                },
                sin6_scope_id: a.scope_id(),
            };
            // SAFETY: `sockaddr_storage` is larger than and aligned for `sockaddr_in6`.
            unsafe { std::ptr::write(std::ptr::from_mut(&mut ss).cast(), sin6) };
            size_of::<libc::sockaddr_in6>()
        }
    };
    (ss, len as libc::socklen_t)
}

/// The address in a socket address structure the kernel filled (`None`: another family).
fn from_raw(ss: &libc::sockaddr_storage) -> Option<SocketAddr> {
    match libc::c_int::from(ss.ss_family) {
        libc::AF_INET => {
            // SAFETY: the family says the storage holds a `sockaddr_in`.
            let sin: libc::sockaddr_in = unsafe { std::ptr::read(std::ptr::from_ref(ss).cast()) };
            let ip = Ipv4Addr::from(sin.sin_addr.s_addr.to_ne_bytes());
            Some(SocketAddr::V4(SocketAddrV4::new(
                ip,
                u16::from_be(sin.sin_port),
            )))
        }
        libc::AF_INET6 => {
            // SAFETY: the family says the storage holds a `sockaddr_in6`.
            let s: libc::sockaddr_in6 = unsafe { std::ptr::read(std::ptr::from_ref(ss).cast()) };
            Some(SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(s.sin6_addr.s6_addr),
                u16::from_be(s.sin6_port),
                s.sin6_flowinfo,
                s.sin6_scope_id,
            )))
        }
        _ => None,
    }
}

/// One message to send: its destination, which of the datagrams it carries (a range of
/// the caller's list, their bytes back to back), and the segment size when it is a UDP GSO
/// message (`UDP_SEGMENT`: the kernel cuts it into datagrams of `seg` bytes, the last one
/// possibly shorter).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Msg {
    pub(crate) dst: SocketAddr,
    pub(crate) first: usize,
    pub(crate) count: usize,
    pub(crate) seg: Option<u16>,
}

/// Datagrams one [`send_msgs`] call carries at most (in all its messages).
pub(crate) const MAX_DATAGRAMS: usize = 2 * BATCH;

/// `CMSG_SPACE` of a `u16` or an `int`: one control message's room (8-byte aligned).
const CMSG_ROOM: usize = 24;

/// The structures one `sendmmsg` or `recvmmsg` call hands the kernel (about 9 KiB), kept
/// by the caller from call to call: zeroing them for every call cost more than the rest of
/// an empty receive's user-space work (a memset of 7-8 KiB per call, on every look at an
/// idle socket and on every send). Each call sets the pointers and lengths of the entries
/// it uses; what the kernel wrote into the names and control messages of earlier calls is
/// left there and never read past what the current call's lengths say.
pub(crate) struct Room {
    names: [libc::sockaddr_storage; BATCH],
    iovs: [libc::iovec; MAX_DATAGRAMS],
    hdrs: [libc::mmsghdr; BATCH],
    /// One control message per message, 8-byte aligned as `cmsghdr` needs.
    ctl: [[u64; CMSG_ROOM / 8]; BATCH],
}

// SAFETY: the raw pointers in `iovs` and `hdrs` are written at the start of every call
// that uses them (to this room and to the buffers that call borrows) and are never
// dereferenced by anyone outside such a call, which holds `&mut Room`; between calls they
// are stale numbers, so moving the room to another thread moves nothing that is used.
unsafe impl Send for Room {}

impl Room {
    /// A zeroed room, on the heap (it is large, and its address stays put).
    pub(crate) fn new() -> Box<Room> {
        // SAFETY: all-zero bytes are valid for these plain C structures and integers.
        Box::new(unsafe { zeroed() })
    }
}

/// Sends the messages `msgs` (at most [`BATCH`]) from `fd`, message `m` made of the
/// datagrams `data(m.first)..data(m.first + m.count)` (at most [`MAX_DATAGRAMS`] in all),
/// with as few `sendmmsg` calls as the kernel needs; returns how many messages went out. It
/// stops at the first message the kernel refuses (its error is returned if none went
/// out before it).
pub(crate) fn send_msgs<'a>(
    fd: RawFd,
    room: &mut Room,
    msgs: &[Msg],
    data: impl Fn(usize) -> &'a [u8],
) -> io::Result<usize> {
    let n = msgs.len().min(BATCH);
    let Room {
        names,
        iovs,
        hdrs,
        ctl,
    } = room;
    let mut iov_at = 0;
    for (i, m) in msgs[..n].iter().enumerate() {
        if iov_at + m.count > MAX_DATAGRAMS {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "too many datagrams for one call",
            ));
        }
        let (ss, len) = to_raw(&m.dst);
        names[i] = ss;
        for k in 0..m.count {
            let d = data(m.first + k);
            iovs[iov_at + k] = libc::iovec {
                iov_base: d.as_ptr().cast_mut().cast(),
                iov_len: d.len(),
            };
        }
        hdrs[i].msg_len = 0;
        let h = &mut hdrs[i].msg_hdr;
        h.msg_name = std::ptr::from_mut(&mut names[i]).cast();
        h.msg_namelen = len;
        h.msg_iov = std::ptr::from_mut(&mut iovs[iov_at]);
        h.msg_iovlen = m.count;
        h.msg_flags = 0;
        iov_at += m.count;
        match m.seg {
            None => {
                h.msg_control = std::ptr::null_mut();
                h.msg_controllen = 0;
            }
            Some(seg) => {
                h.msg_control = ctl[i].as_mut_ptr().cast();
                // SAFETY: CMSG_SPACE only computes a size.
                h.msg_controllen = unsafe { libc::CMSG_SPACE(size_of::<u16>() as u32) } as usize;
                // SAFETY: the control buffer is `CMSG_ROOM` (>= CMSG_SPACE(2)) bytes, aligned
                // for `cmsghdr`, and `h` points at it with that length: CMSG_FIRSTHDR returns
                // its start, and CMSG_DATA the 2 bytes after the header inside it.
                unsafe {
                    let c = libc::CMSG_FIRSTHDR(h);
                    (*c).cmsg_level = libc::SOL_UDP;
                    (*c).cmsg_type = UDP_SEGMENT;
                    (*c).cmsg_len = libc::CMSG_LEN(size_of::<u16>() as u32) as usize;
                    std::ptr::write_unaligned(libc::CMSG_DATA(c).cast::<u16>(), seg);
                }
            }
        }
    }
    let mut done = 0;
    while done < n {
        // SAFETY: `hdrs[done..n]` are headers set above whose names, iovecs and control
        // messages point at `names`, `iovs`, `ctl` and the callers' datagrams, all alive
        // for the call; the kernel only reads them and writes each header's `msg_len`.
        // The raw system call, not libc's wrapper: the wrapper makes `sendmmsg` a thread
        // cancellation point (two more calls into libc), and no thread here is cancelled.
        let r = unsafe {
            libc::syscall(
                libc::SYS_sendmmsg,
                fd,
                hdrs[done..].as_mut_ptr(),
                (n - done) as libc::c_uint,
                0,
            )
        };
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return if done == 0 { Err(e) } else { Ok(done) };
        }
        done += r as usize;
        if r == 0 {
            break;
        }
    }
    Ok(done)
}

/// `UDP_SEGMENT` (`include/uapi/linux/udp.h`): a `u16` control message giving a send's
/// GSO segment size, and the socket option of the same number.
pub(crate) const UDP_SEGMENT: libc::c_int = 103;
/// `UDP_GRO`: the socket option that lets the kernel hand a receiver coalesced datagrams,
/// each with an `int` control message of this type giving the segment size.
pub(crate) const UDP_GRO: libc::c_int = 104;

/// One received datagram: its length, sender, and whether it was longer than its buffer.
#[derive(Clone, Copy, Debug)]
pub(crate) struct In {
    pub(crate) len: usize,
    pub(crate) src: Option<SocketAddr>,
    pub(crate) truncated: bool,
    /// With `UDP_GRO` on: the size of the datagrams the kernel coalesced into this one
    /// (back to back, the last possibly shorter); `None`: one datagram.
    pub(crate) seg: Option<usize>,
    /// The IPv4 Identification and flags word of the (first) datagram, where the port saw
    /// its IP header (the packet ring); `None` from a UDP socket, which hides them.
    pub(crate) ipv4: Option<(u16, u16)>,
}

/// Receives up to `bufs.len()` (at most [`BATCH`]) waiting datagrams on `fd` without
/// blocking, one into each buffer from byte `at` on, describing them in `got`; returns how
/// many.
pub(crate) fn recv_batch(
    fd: RawFd,
    room: &mut Room,
    bufs: &mut [Box<[u8]>],
    at: usize,
    got: &mut [In],
) -> io::Result<usize> {
    let n = bufs.len().min(got.len()).min(BATCH);
    let Room {
        names,
        iovs,
        hdrs,
        ctl,
    } = room;
    for i in 0..n {
        let b = &mut bufs[i][at..];
        iovs[i] = libc::iovec {
            iov_base: b.as_mut_ptr().cast(),
            iov_len: b.len(),
        };
        hdrs[i].msg_len = 0;
        let h = &mut hdrs[i].msg_hdr;
        h.msg_name = std::ptr::from_mut(&mut names[i]).cast();
        h.msg_namelen = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
        h.msg_iov = std::ptr::from_mut(&mut iovs[i]);
        h.msg_iovlen = 1;
        h.msg_control = ctl[i].as_mut_ptr().cast();
        h.msg_controllen = CMSG_ROOM;
        h.msg_flags = 0;
    }
    loop {
        // SAFETY: `hdrs[..n]` point at `names`, `iovs`, `ctl` and the callers' buffers, all
        // alive and exclusively ours for the call; the kernel writes at most each iovec's
        // length into its buffer, at most `msg_namelen` bytes into each name, and the
        // lengths and flags of the headers, and at most `CMSG_ROOM` bytes of control
        // messages into each `ctl` entry. MSG_DONTWAIT: it never blocks; no timeout is
        // passed. The raw system call, as in `send_msgs`.
        let r = unsafe {
            libc::syscall(
                libc::SYS_recvmmsg,
                fd,
                hdrs.as_mut_ptr(),
                n as libc::c_uint,
                libc::MSG_DONTWAIT,
                std::ptr::null_mut::<libc::timespec>(),
            )
        };
        if r < 0 {
            let e = io::Error::last_os_error();
            match e.kind() {
                io::ErrorKind::Interrupted => continue,
                io::ErrorKind::WouldBlock => return Ok(0),
                _ => return Err(e),
            }
        }
        let r = (r as usize).min(n);
        for i in 0..r {
            got[i] = In {
                len: (hdrs[i].msg_len as usize).min(bufs[i].len() - at),
                // The kernel wrote this datagram's sender into `names[i]` and its length
                // into `msg_namelen` (a UDP receive always names it); none: no sender.
                src: (hdrs[i].msg_hdr.msg_namelen > 0)
                    .then(|| from_raw(&names[i]))
                    .flatten(),
                truncated: hdrs[i].msg_hdr.msg_flags & libc::MSG_TRUNC != 0,
                seg: gro_size(&hdrs[i].msg_hdr),
                ipv4: None,
            };
        }
        return Ok(r);
    }
}

/// The segment size of a `UDP_GRO` control message in a received header, if it has one.
fn gro_size(h: &libc::msghdr) -> Option<usize> {
    // SAFETY: `h` is a header the kernel filled: `msg_control`/`msg_controllen` describe
    // the control messages it wrote into our buffer, which the CMSG macros walk without
    // leaving it; the data of a UDP_GRO message is an `int`, read unaligned.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(h);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_UDP && (*c).cmsg_type == UDP_GRO {
                let v = std::ptr::read_unaligned(libc::CMSG_DATA(c).cast::<libc::c_int>());
                return usize::try_from(v).ok().filter(|&v| v > 0);
            }
            c = libc::CMSG_NXTHDR(h, c);
        }
    }
    None
}

/// The IP addresses of the network interface `name`, in the kernel's order, each with the
/// interface's index as its scope (for IPv6 link-local addresses); empty if there is no
/// such interface or it has no address.
pub(crate) fn interface_addrs(name: &str) -> io::Result<Vec<(IpAddr, u32)>> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs writes a list it allocated into `head`; we free it below.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let mut out = Vec::new();
    let mut p = head;
    while !p.is_null() {
        // SAFETY: `p` is a node of the list getifaddrs returned, not freed yet.
        let ifa = unsafe { &*p };
        p = ifa.ifa_next;
        if ifa.ifa_addr.is_null() || ifa.ifa_name.is_null() {
            continue;
        }
        // SAFETY: `ifa_name` is a NUL-terminated string of the list.
        let n = unsafe { std::ffi::CStr::from_ptr(ifa.ifa_name) };
        if n.to_bytes() != name.as_bytes() {
            continue;
        }
        // SAFETY: `ifa_addr` points at a socket address of the family it starts with;
        // `from_raw` reads only as much as that family's structure, which the kernel
        // provides in full.
        let family = libc::c_int::from(unsafe { (*ifa.ifa_addr).sa_family });
        let addr = match family {
            libc::AF_INET => {
                // SAFETY: as above, an AF_INET address is a whole `sockaddr_in`.
                let sin: libc::sockaddr_in = unsafe { std::ptr::read(ifa.ifa_addr.cast()) };
                IpAddr::from(sin.sin_addr.s_addr.to_ne_bytes())
            }
            libc::AF_INET6 => {
                // SAFETY: as above, an AF_INET6 address is a whole `sockaddr_in6`.
                let s: libc::sockaddr_in6 = unsafe { std::ptr::read(ifa.ifa_addr.cast()) };
                IpAddr::from(s.sin6_addr.s6_addr)
            }
            _ => continue,
        };
        // SAFETY: `ifa_name` as above.
        let index = unsafe { libc::if_nametoindex(ifa.ifa_name) };
        out.push((addr, index));
    }
    // SAFETY: `head` came from getifaddrs and is freed once; no reference into it remains.
    unsafe { libc::freeifaddrs(head) };
    Ok(out)
}

/// The name of the interface that has `addr`, if one has.
pub(crate) fn interface_of(addr: IpAddr) -> io::Result<Option<String>> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: as in `interface_addrs`.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let mut names = Vec::new();
    let mut p = head;
    while !p.is_null() {
        // SAFETY: a node of the list, not freed yet.
        let ifa = unsafe { &*p };
        p = ifa.ifa_next;
        if !ifa.ifa_name.is_null() {
            // SAFETY: a NUL-terminated string of the list.
            let n = unsafe { std::ffi::CStr::from_ptr(ifa.ifa_name) };
            names.push(n.to_string_lossy().into_owned());
        }
    }
    // SAFETY: freed once, nothing refers to it any more.
    unsafe { libc::freeifaddrs(head) };
    names.dedup();
    for n in names {
        if interface_addrs(&n)?.iter().any(|&(a, _)| a == addr) {
            return Ok(Some(n));
        }
    }
    Ok(None)
}
