//! The Linux UDP loop: `recvmmsg(2)` takes every datagram waiting on the socket (up to
//! a batch) in one call and `sendmmsg(2)` sends all their answers in one, so under load
//! the thread makes two system calls, and wakes its clients once, per batch rather
//! than per query.

use std::io::{IoSlice, IoSliceMut};
use std::net::{SocketAddr, SocketAddrV4, SocketAddrV6, UdpSocket};
use std::os::fd::AsRawFd;

use hickory_net::xfer::Protocol;
use nix::errno::Errno;
use nix::sys::socket::{MsgFlags, MultiHeaders, SockaddrStorage, recvmmsg, sendmmsg};
use tokio_util::sync::CancellationToken;

use super::firewall::Handler;
use super::wire::{MAX_DATAGRAM, UDP_POLL, answer_bytes};

/// Most datagrams taken or sent per call.
const BATCH: usize = 32;

pub fn serve(socket: UdpSocket, handler: &Handler, shutdown: &CancellationToken) {
    if let Err(e) = socket.set_read_timeout(Some(UDP_POLL)) {
        tracing::error!(error = %e, "dns udp socket unusable");
        return;
    }
    let fd = socket.as_raw_fd();
    let mut bufs = vec![vec![0u8; MAX_DATAGRAM]; BATCH];
    let mut rx = MultiHeaders::<SockaddrStorage>::preallocate(BATCH, None);
    let mut tx = MultiHeaders::<SockaddrStorage>::preallocate(BATCH, None);
    let mut got: Vec<(usize, Option<SocketAddr>)> = Vec::with_capacity(BATCH);
    let mut replies: Vec<(Vec<u8>, Option<SockaddrStorage>)> = Vec::with_capacity(BATCH);
    let mut batches: u32 = 0;
    loop {
        // Looking at the token takes a lock: do it when idle and every 256 batches.
        batches = batches.wrapping_add(1);
        if batches.is_multiple_of(256) && shutdown.is_cancelled() {
            return;
        }
        got.clear();
        {
            let mut iovs: Vec<[IoSliceMut<'_>; 1]> = bufs.iter_mut().map(|b| [IoSliceMut::new(b)]).collect();
            // Blocks (up to the socket's read timeout) for the first datagram only.
            match recvmmsg(fd, &mut rx, iovs.iter_mut(), MsgFlags::MSG_WAITFORONE, None) {
                Ok(results) => got.extend(results.map(|r| (r.bytes, r.address.and_then(to_std)))),
                Err(Errno::EAGAIN | Errno::EINTR) => {
                    if shutdown.is_cancelled() {
                        return;
                    }
                    continue;
                }
                Err(e) => {
                    tracing::debug!(error = %e, "dns udp receive failed");
                    continue;
                }
            }
        }
        replies.clear();
        for (buf, (n, src)) in bufs.iter().zip(&got) {
            // Port 0 cannot be answered.
            let Some(src) = src.filter(|s| s.port() != 0) else { continue };
            let raw = buf.get(..*n).unwrap_or_default();
            if let Some(reply) = futures_executor::block_on(answer_bytes(raw, src, Protocol::Udp, handler)) {
                replies.push((reply, Some(SockaddrStorage::from(src))));
            }
        }
        send_all(fd, &mut tx, &replies);
    }
}

/// Sends every reply, in as few calls as the socket allows; on an error the rest of
/// the batch is dropped (UDP: the client retries).
fn send_all(fd: i32, tx: &mut MultiHeaders<SockaddrStorage>, replies: &[(Vec<u8>, Option<SockaddrStorage>)]) {
    let mut start = 0;
    while start < replies.len() {
        let rest = &replies[start..];
        let iovs: Vec<[IoSlice<'_>; 1]> = rest.iter().map(|(r, _)| [IoSlice::new(r)]).collect();
        let addrs: Vec<Option<SockaddrStorage>> = rest.iter().map(|(_, a)| *a).collect();
        match sendmmsg(fd, tx, &iovs, &addrs, [], MsgFlags::empty()) {
            Ok(sent) => {
                let n = sent.count();
                if n == 0 {
                    return;
                }
                start += n;
            }
            Err(Errno::EINTR) => {}
            Err(e) => {
                tracing::debug!(error = %e, "dns udp send failed");
                // Skip the datagram that failed (e.g. an unreachable address) and go on.
                start += 1;
            }
        }
    }
}

fn to_std(a: SockaddrStorage) -> Option<SocketAddr> {
    if let Some(v4) = a.as_sockaddr_in() {
        return Some(SocketAddr::V4(SocketAddrV4::from(*v4)));
    }
    a.as_sockaddr_in6().map(|v6| SocketAddr::V6(SocketAddrV6::from(*v6)))
}
