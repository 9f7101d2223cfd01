//! The same workload through kube-runtime's controller machinery: `applier` over an in-memory
//! reflector store, a trigger stream of one `ObjectRef` per object, and a reconciler that returns
//! at once. No API server is involved.

use crate::clock::{Stopwatch, Timed};
use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use futures::{StreamExt, stream};
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube_runtime::controller::{Action, Config, applier};
use kube_runtime::reflector::{self, ObjectRef};
use kube_runtime::watcher;

/// A ConfigMap named after the engine's key `i` (`namespace-07` / `pod-name-012345`).
pub(crate) fn config_map(i: usize) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(format!("pod-name-{i:06}")),
            namespace: Some(format!("namespace-{:02}", i % 50)),
            ..ObjectMeta::default()
        },
        ..ConfigMap::default()
    }
}

#[derive(Debug, Default)]
struct Context {
    reconciles: AtomicUsize,
}

/// Loads `n` ConfigMaps into a reflector store (marked ready), then runs `applier` over a trigger
/// stream with one reference per object until it has reported `n` results. Returns the time from
/// creating the applier to its `n`-th result, and the number of successful reconciles.
pub(crate) async fn applier_throughput(n: usize, concurrency: u16) -> (Timed, usize) {
    let (reader, mut writer) = reflector::store::<ConfigMap>();
    writer.apply_watcher_event(&watcher::Event::Init);
    let mut refs = Vec::with_capacity(n);
    for i in 0..n {
        let object = config_map(i);
        refs.push(ObjectRef::from_obj(&object));
        writer.apply_watcher_event(&watcher::Event::InitApply(object));
    }
    writer.apply_watcher_event(&watcher::Event::InitDone);
    assert_eq!(reader.len(), n, "the reflector store should hold every object");
    let context = Arc::new(Context::default());

    let started = Stopwatch::start();
    let results = applier(
        |_object: Arc<ConfigMap>, context: Arc<Context>| {
            context.reconciles.fetch_add(1, Ordering::Relaxed);
            std::future::ready(Ok::<_, Infallible>(Action::await_change()))
        },
        |_object, _error: &Infallible, _context| Action::await_change(),
        context.clone(),
        reader,
        // The applier shuts down, dropping what it has scheduled, as soon as its trigger stream
        // ends: a real trigger stream (a watch) never ends, so neither does this one.
        stream::iter(refs.into_iter().map(Ok::<_, Infallible>)).chain(stream::pending()),
        Config::default().concurrency(concurrency),
    );
    let done =
        results.take(n).fold(0usize, |ok, result| std::future::ready(ok + usize::from(result.is_ok()))).await;
    let elapsed = started.stop();
    drop(writer);
    assert_eq!(context.reconciles.load(Ordering::Relaxed), n, "one reconcile per object");
    (elapsed, done)
}
