//! The kubelet's client-side rate limit for API requests (`kubeAPIQPS`, `kubeAPIBurst`): a token
//! bucket that refills at `qps` tokens per second up to `burst`; each request takes one token and
//! waits (without blocking a thread) while there is none. Watches count once, when they start.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::time::{Instant, Sleep};

/// The shared bucket.
#[derive(Debug)]
struct Bucket {
    qps: f64,
    burst: f64,
    state: Mutex<(f64, Instant)>,
}

impl Bucket {
    /// Takes a token, or says how long until one is there.
    fn try_take(&self) -> Result<(), Duration> {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let now = Instant::now();
        let (tokens, last) = *state;
        let tokens = (tokens + now.duration_since(last).as_secs_f64() * self.qps).min(self.burst);
        if tokens >= 1.0 {
            *state = (tokens - 1.0, now);
            Ok(())
        } else {
            *state = (tokens, now);
            Err(Duration::from_secs_f64((1.0 - tokens) / self.qps))
        }
    }
}

/// A [`tower::Layer`] that rate limits every request of the service below it.
#[derive(Debug, Clone)]
pub(crate) struct RateLimitLayer {
    bucket: Arc<Bucket>,
}

impl RateLimitLayer {
    /// `qps` requests per second (at least 0.001), bursts of `burst` (at least 1).
    pub(crate) fn new(qps: f64, burst: u32) -> Self {
        let burst = f64::from(burst.max(1));
        let bucket = Bucket { qps: qps.max(0.001), burst, state: Mutex::new((burst, Instant::now())) };
        Self { bucket: Arc::new(bucket) }
    }
}

impl<S> tower::Layer<S> for RateLimitLayer {
    type Service = RateLimit<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimit { inner, bucket: self.bucket.clone(), permit: false, sleep: None }
    }
}

/// The rate-limited service.
pub(crate) struct RateLimit<S> {
    inner: S,
    bucket: Arc<Bucket>,
    /// A token was taken for the next call.
    permit: bool,
    /// Waiting for a token.
    sleep: Option<Pin<Box<Sleep>>>,
}

impl<S: std::fmt::Debug> std::fmt::Debug for RateLimit<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RateLimit").field("inner", &self.inner).field("permit", &self.permit).finish()
    }
}

impl<S, Req> tower::Service<Req> for RateLimit<S>
where
    S: tower::Service<Req>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        while !self.permit {
            if let Some(sleep) = self.sleep.as_mut() {
                if sleep.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                self.sleep = None;
            }
            match self.bucket.try_take() {
                Ok(()) => self.permit = true,
                Err(wait) => self.sleep = Some(Box::pin(tokio::time::sleep(wait))),
            }
        }
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Req) -> Self::Future {
        self.permit = false;
        self.inner.call(req)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tower::{Service, ServiceExt};

    #[tokio::test(start_paused = true)]
    async fn burst_then_qps() {
        let layer = RateLimitLayer::new(2.0, 3);
        let mut svc = tower::Layer::layer(&layer, tower::service_fn(|()| async { Ok::<_, ()>(()) }));
        let start = Instant::now();
        for _ in 0..3 {
            svc.ready().await.map_err(|()| "not ready").unwrap_or_else(|e| panic!("{e}"));
            let _ = svc.call(()).await;
        }
        assert_eq!(start.elapsed(), Duration::ZERO, "the burst goes at once");
        for _ in 0..4 {
            svc.ready().await.map_err(|()| "not ready").unwrap_or_else(|e| panic!("{e}"));
            let _ = svc.call(()).await;
        }
        // Four more at 2 per second: 2 s.
        let elapsed = start.elapsed();
        assert!(
            elapsed >= Duration::from_millis(1990) && elapsed <= Duration::from_millis(2100),
            "{elapsed:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn refills_up_to_burst_only() {
        let layer = RateLimitLayer::new(10.0, 2);
        let mut svc = tower::Layer::layer(&layer, tower::service_fn(|()| async { Ok::<_, ()>(()) }));
        tokio::time::sleep(Duration::from_secs(60)).await;
        let start = Instant::now();
        for _ in 0..3 {
            svc.ready().await.map_err(|()| "not ready").unwrap_or_else(|e| panic!("{e}"));
            let _ = svc.call(()).await;
        }
        // Two from the full bucket, the third after 100 ms.
        assert!(start.elapsed() >= Duration::from_millis(99), "{:?}", start.elapsed());
    }
}
