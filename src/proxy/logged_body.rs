//! A response body that counts the bytes it yields and writes the access record when
//! it is dropped (finished or abandoned by the client), so the record carries the real
//! totals. It also holds the request's registration and concurrency slot until then
//! (shared with the request body, which may outlive it).

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};

use super::BoxError;
use super::registry::Hold;
use crate::access_log::AccessRecord;

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
