//! Body adapters shared by the handlers that stream: byte counting, an idle timeout,
//! and the response body that writes its access record when it ends.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};

use super::BoxError;
use super::registry::Hold;
use crate::access_log::AccessRecord;

/// Counts a request or response head (its first line, `line` bytes, and its header
/// fields as sent) against the request's byte budgets: headers can carry as much as a
/// body. Refused when a budget is spent (a head never waits on the shared store: it is
/// at most `proxy.max_header_bytes`).
pub fn charge_head(
    hold: &Hold,
    dir: crate::budget::Dir,
    line: usize,
    headers: &http::HeaderMap,
) -> Result<(), super::Refusal> {
    let Some(meter) = hold.meter() else { return Ok(()) };
    match meter.add(dir, (line + fields_len(headers)) as u64) {
        crate::budget::Flow::Stop => {
            let spent = meter.why().cloned().unwrap_or_else(|| crate::budget::Exhausted {
                budget: "upload_bytes".into(),
                retry_after: 1,
                hint: "a byte budget is spent".into(),
            });
            Err(super::Refusal::budget(spent))
        }
        _ => Ok(()),
    }
}

/// The bytes of header fields as sent: `name: value\r\n` each, and the blank line
/// that ends them. What a head (past its first line) or a trailers block costs.
pub fn fields_len(headers: &http::HeaderMap) -> usize {
    headers.iter().map(|(k, v)| k.as_str().len() + v.len() + 4).sum::<usize>() + 2
}

/// The length of a request line: `METHOD TARGET HTTP/1.1\r\n`.
pub fn request_line_len<B>(req: &http::Request<B>) -> usize {
    req.method().as_str().len() + req.uri().path_and_query().map_or(1, |p| p.as_str().len()) + 12
}

/// Counts data bytes into a shared counter.
pub struct Counting<B> {
    inner: B,
    count: Arc<AtomicU64>,
}

impl<B> Counting<B> {
    pub fn new(inner: B, count: Arc<AtomicU64>) -> Self {
        Counting { inner, count }
    }
}

impl<B: Body<Data = Bytes> + Unpin> Body for Counting<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let r = Pin::new(&mut self.inner).poll_frame(cx);
        if let Poll::Ready(Some(Ok(f))) = &r
            && let Some(d) = f.data_ref()
        {
            self.count.fetch_add(d.len() as u64, Ordering::Relaxed);
        }
        r
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// What becomes of a body's trailers.
#[derive(Clone, Copy)]
enum TrailerRule {
    /// Dropped: a request's trailers would be fields no rule judged (and no
    /// placeholder check saw).
    Drop,
    /// Passed without the fields only the gateway writes: an upstream's trailers.
    FromUpstream,
}

/// Passes a body's data and applies a [`TrailerRule`] to its trailers.
pub struct Trailers<B> {
    inner: B,
    rule: TrailerRule,
}

impl<B> Trailers<B> {
    /// For a request whose head the policy judged.
    pub fn dropped(inner: B) -> Self {
        Trailers { inner, rule: TrailerRule::Drop }
    }

    /// For an upstream's response.
    pub fn from_upstream(inner: B) -> Self {
        Trailers { inner, rule: TrailerRule::FromUpstream }
    }
}

impl<B: Body<Data = Bytes> + Unpin> Body for Trailers<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        loop {
            let frame = match std::task::ready!(Pin::new(&mut self.inner).poll_frame(cx)) {
                Some(Ok(f)) if f.is_trailers() => f,
                other => return Poll::Ready(other),
            };
            match self.rule {
                TrailerRule::Drop => continue,
                TrailerRule::FromUpstream => {
                    let Ok(mut trailers) = frame.into_trailers() else { continue };
                    super::headers::strip_gateway_fields(&mut trailers);
                    return Poll::Ready(Some(Ok(Frame::trailers(trailers))));
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// Fails a body that yields nothing for `idle` (an idle timeout, not a total one: a
/// large pack may take as long as it needs while bytes flow). The clock starts when a
/// poll first finds nothing ready, so a body that is always ready (a small response
/// read with its head) never sets a timer.
pub struct IdleBody<B> {
    inner: B,
    idle: Duration,
    timer: Option<Pin<Box<tokio::time::Sleep>>>,
    /// A frame came since the timer was set: the next wait starts a new idle period.
    moved: bool,
}

impl<B> IdleBody<B> {
    pub fn new(inner: B, idle: Duration) -> Self {
        IdleBody { inner, idle, timer: None, moved: false }
    }
}

#[derive(Debug, thiserror::Error)]
#[error("body idle for too long")]
pub struct IdleTimeout;

impl<B> Body for IdleBody<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match Pin::new(&mut self.inner).poll_frame(cx) {
            Poll::Ready(r) => {
                self.moved = true;
                Poll::Ready(r.map(|x| x.map_err(Into::into)))
            }
            Poll::Pending => {
                let idle = self.idle;
                let this = &mut *self;
                let timer = match &mut this.timer {
                    Some(t) if this.moved => {
                        t.as_mut().reset(tokio::time::Instant::now() + idle);
                        t
                    }
                    Some(t) => t,
                    None => this.timer.insert(Box::pin(tokio::time::sleep(idle))),
                };
                this.moved = false;
                match timer.as_mut().poll(cx) {
                    Poll::Ready(()) => Poll::Ready(Some(Err(Box::new(IdleTimeout)))),
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// A response body that counts the bytes it yields and writes the access record when
/// it is dropped (finished or abandoned by the client), so the record carries the real
/// totals. It also holds the request's registration and concurrency slot until then
/// (shared with the request body, which may outlive it).
pub struct LoggedBody<B> {
    inner: B,
    bytes: u64,
    bytes_up: Arc<AtomicU64>,
    rec: Option<AccessRecord>,
    _hold: Arc<Hold>,
}

impl<B> LoggedBody<B> {
    pub fn new(inner: B, bytes_up: Arc<AtomicU64>, rec: AccessRecord, hold: Arc<Hold>) -> Self {
        LoggedBody { inner, bytes: 0, bytes_up, rec: Some(rec), _hold: hold }
    }
}

impl<B> Body for LoggedBody<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match Pin::new(&mut self.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    self.bytes += data.len() as u64;
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(e.into()))),
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl<B> Drop for LoggedBody<B> {
    fn drop(&mut self) {
        if let Some(mut rec) = self.rec.take() {
            rec.bytes_down = self.bytes;
            rec.bytes_up = self.bytes_up.load(Ordering::Relaxed);
            rec.emit();
        }
    }
}

/// Most bytes of a refused request's body read and discarded.
const MAX_DRAIN_BYTES: u64 = 64 * 1024 * 1024;

/// Longest a refused request's body is read for, however steadily it trickles in (as
/// nginx's `lingering_time`).
const MAX_DRAIN_TIME: Duration = Duration::from_secs(30);

/// Reads and discards the rest of a refused request's body (bounded in bytes and time,
/// with the idle timeout between reads), so that a client still sending reads the
/// refusal instead of a reset connection or stream. Nothing of it goes anywhere.
/// Whether the body was read to its end.
pub async fn drain(mut body: hyper::body::Incoming, idle: Duration) -> bool {
    use http_body_util::BodyExt;
    let until = tokio::time::Instant::now() + MAX_DRAIN_TIME;
    let mut seen = 0u64;
    while seen < MAX_DRAIN_BYTES {
        let next = tokio::time::timeout(idle, body.frame());
        match tokio::time::timeout_at(until, next).await {
            Ok(Ok(Some(Ok(frame)))) => seen += frame.data_ref().map_or(0, |d| d.len() as u64),
            Ok(Ok(None)) => return true,
            _ => return false,
        }
    }
    http_body::Body::is_end_stream(&body)
}

/// Whether the client sent `Expect: 100-continue` and waits for it before its body.
fn expects_continue(h: &http::HeaderMap) -> bool {
    h.get_all(http::header::EXPECT).iter().any(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"))
}

/// Serves `req` with its body apart: `serve` takes the body from the `Option` when it
/// sends the request on. A body still there when `serve` answers belongs to a refused
/// request, and is drained ([`drain_refused`]) before the refusal goes out.
pub async fn body_apart(
    req: http::Request<hyper::body::Incoming>,
    idle: Duration,
    serve: impl AsyncFnOnce(http::Request<()>, &mut Option<hyper::body::Incoming>) -> http::Response<super::ProxyBody>,
) -> http::Response<super::ProxyBody> {
    let (parts, body) = req.into_parts();
    let waits = expects_continue(&parts.headers);
    let mut body = Some(body);
    let mut resp = serve(http::Request::from_parts(parts, ()), &mut body).await;
    if let Some(rest) = body {
        closing_unless(drain_refused(rest, waits, idle).await, &mut resp);
    }
    resp
}

/// A refusal of `req`, sent once its body is drained ([`drain_refused`]).
pub async fn refuse_request(
    req: http::Request<hyper::body::Incoming>,
    idle: Duration,
    mut refusal: http::Response<super::ProxyBody>,
) -> http::Response<super::ProxyBody> {
    let (parts, body) = req.into_parts();
    closing_unless(drain_refused(body, expects_continue(&parts.headers), idle).await, &mut refusal);
    refusal
}

/// Marks `resp` as the connection's last unless the request's body was read to its
/// end: hyper closes a connection whose request body is left unread (its framing is
/// lost, or the client was never told to send it), and the client should hear so
/// rather than find out on its next request.
fn closing_unless(read_all: bool, resp: &mut http::Response<super::ProxyBody>) {
    if !read_all {
        resp.headers_mut().insert(http::header::CONNECTION, http::HeaderValue::from_static("close"));
    }
}

/// [`drain`] for a request refused before anything of it was sent on, with the idle
/// timeout capped at 5 s. Not when the client waits on `Expect: 100-continue`: it has
/// sent no body, and reading would have hyper ask it for one. Whether the body was
/// read to its end.
pub async fn drain_refused(body: hyper::body::Incoming, waits_for_continue: bool, idle: Duration) -> bool {
    if http_body::Body::is_end_stream(&body) {
        return true;
    }
    if waits_for_continue {
        return false;
    }
    drain(body, idle.min(Duration::from_secs(5))).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;
    use tokio::sync::mpsc;

    /// A body fed by hand, one chunk per send; ends when the sender is dropped.
    struct Fed(mpsc::Receiver<Bytes>);

    impl Body for Fed {
        type Data = Bytes;
        type Error = std::convert::Infallible;
        fn poll_frame(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
            self.0.poll_recv(cx).map(|b| b.map(|b| Ok(Frame::data(b))))
        }
    }

    #[tokio::test(start_paused = true)]
    async fn idle_body_fails_only_after_a_silence_of_idle() {
        let (tx, rx) = mpsc::channel(4);
        let mut body = IdleBody::new(Fed(rx), Duration::from_secs(10));
        // Chunks 6 s apart for 30 s: never idle for 10 s, so never failed.
        let feeder = tokio::spawn(async move {
            for _ in 0..5 {
                tokio::time::sleep(Duration::from_secs(6)).await;
                tx.send(Bytes::from_static(b"x")).await.unwrap();
            }
            tokio::time::sleep(Duration::from_secs(60)).await;
            drop(tx);
        });
        let started = tokio::time::Instant::now();
        for _ in 0..5 {
            let frame = body.frame().await.unwrap().unwrap();
            assert_eq!(frame.into_data().unwrap(), "x");
        }
        // Then silence: it fails 10 s after the last chunk, not 10 s after the first wait.
        let err = body.frame().await.unwrap().unwrap_err();
        assert!(err.is::<IdleTimeout>(), "{err}");
        assert_eq!(started.elapsed(), Duration::from_secs(40));
        feeder.abort();
    }

    #[tokio::test(start_paused = true)]
    async fn idle_body_sets_no_timer_for_a_ready_body() {
        let mut body = IdleBody::new(http_body_util::Full::new(Bytes::from_static(b"ready")), Duration::from_secs(1));
        assert_eq!(body.frame().await.unwrap().unwrap().into_data().unwrap(), "ready");
        assert!(body.frame().await.is_none());
        assert!(body.timer.is_none());
    }
}
