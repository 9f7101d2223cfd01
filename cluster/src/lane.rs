//! The heartbeat lane: a thread of its own, with a single-threaded tokio runtime, on which the nodes' Lease
//! renewals run, each over a connection of its own (`certificates::NodeClients::lease`).
//!
//! The node's other work (pod sync, status patches, events, the pod watch, and every request on the
//! node's main connection) runs on the process's runtime, whose queue of ready tasks is served in turn. When
//! that work outgrows the CPU the process gets, a task that wakes up (a renewal whose time has come, the
//! connection that carries its request, the answer coming back) waits behind everything queued before
//! it, and a renewal can miss its 10 s limit several times in a row: the Node's Lease lapses and the node
//! lifecycle controller marks it `NotReady`, although the node is alive and only busy. The lane's queue
//! holds the renewals and their connections only, and the operating system schedules its thread beside
//! the runtime's, so a renewal starts on time and its request is written and answered at once, however
//! busy the node is. (The kubelet's lease controller is a goroutine of its own, which Go's preemptive
//! scheduler runs in time the same way.)
//!
//! A real node starts one lane; the hollow nodes of one `nodelet hollow` process share one.

use std::future::Future;
use std::sync::Arc;

use tokio::runtime::Handle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;

/// Where the Lease renewals run: a thread of its own ([`HeartbeatLane::start`]). Clones share the thread,
/// which ends when the last clone is dropped.
#[derive(Clone)]
pub struct HeartbeatLane {
    handle: Handle,
    /// Held for its `Drop`, which stops the thread once the last clone goes.
    _thread: Arc<LaneThread>,
}

impl std::fmt::Debug for HeartbeatLane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HeartbeatLane").finish_non_exhaustive()
    }
}

/// Stops the lane's thread when dropped.
struct LaneThread {
    stop: CancellationToken,
}

impl Drop for LaneThread {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl HeartbeatLane {
    /// The name of the lane's thread.
    pub const THREAD: &'static str = "nodelet-heartbeat";

    /// Starts the lane's thread and its runtime (timers and I/O enabled). The thread runs until the last
    /// clone of the lane is dropped; the tasks still on it are dropped then.
    pub fn start() -> std::io::Result<Self> {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        let handle = runtime.handle().clone();
        let stop = CancellationToken::new();
        let until = stop.clone();
        std::thread::Builder::new().name(Self::THREAD.to_owned()).spawn(move || {
            runtime.block_on(until.cancelled());
        })?;
        Ok(Self { handle, _thread: Arc::new(LaneThread { stop }) })
    }

    /// Calls `make` in the lane's runtime context: what it spawns (a client's request queue, a
    /// connection) runs on the lane.
    pub(crate) fn enter<T>(&self, make: impl FnOnce() -> T) -> T {
        let _context = self.handle.enter();
        make()
    }

    /// Runs `task` on the lane; it is aborted when the returned handle is dropped.
    pub(crate) fn spawn<F>(&self, task: F) -> AbortOnDropHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        AbortOnDropHandle::new(self.handle.spawn(task))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_task_on_the_lane_runs_while_the_spawning_runtime_is_blocked() {
        let lane = HeartbeatLane::start().expect("lane");
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        rt.block_on(async {
            let (tx, rx) = std::sync::mpsc::channel();
            let task = lane.spawn(async move {
                tokio::time::sleep(Duration::from_millis(10)).await;
                let _ = tx.send(std::thread::current().name().map(str::to_owned));
            });
            // The spawning runtime's only thread is blocked here, waiting for the lane's task.
            let name = rx.recv_timeout(Duration::from_secs(10)).expect("the lane ran the task");
            assert_eq!(name.as_deref(), Some(HeartbeatLane::THREAD));
            assert!(task.await.is_ok());
        });
    }

    #[test]
    fn dropping_the_handle_aborts_the_task_and_the_last_clone_stops_the_thread() {
        let lane = HeartbeatLane::start().expect("lane");
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let task = lane.spawn(async move {
            let _tx = tx;
            std::future::pending::<()>().await;
        });
        drop(task);
        // The task (and the sender it holds) is dropped once aborted.
        assert_eq!(
            rx.recv_timeout(Duration::from_secs(10)),
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected)
        );
        let weak = Arc::downgrade(&lane._thread);
        let stop = lane._thread.stop.clone();
        drop(lane);
        assert!(weak.upgrade().is_none());
        assert!(stop.is_cancelled(), "the thread is told to stop");
    }
}
