//! The smallest useful reconciler: keep an in-memory "world" equal to a desired map.
//! Run: `cargo run -p reconcile-engine --example minimal`
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use reconcile_engine::{
    CancellationToken, Driver, Engine, Operation, Outcome, Plan, Reconciler, Update, View,
};

#[derive(Clone, PartialEq, Debug)]
enum Op {
    Set(String),
    Delete,
}

impl Operation for Op {
    fn kind(&self) -> &'static str {
        if matches!(self, Op::Set(_)) { "set" } else { "delete" }
    }
}

/// Desired and actual values are strings; `None` in the actual store means "unknown".
struct Mirror;

impl Reconciler<String, Option<String>> for Mirror {
    type Key = String;
    type Op = Op;
    type Inputs = ();

    fn reconcile(&self, v: &View<'_, String, String, Option<String>>) -> Plan<Op> {
        match (v.desired, v.actual) {
            (Some(want), Some(Some(have))) if want == have => Plan::Idle,
            (Some(want), _) => Plan::Run(Op::Set(want.clone())),
            (None, Some(_)) => Plan::Run(Op::Delete),
            (None, None) => Plan::Idle,
        }
    }

    fn uncertain(&self, _key: &String, _op: &Op, _actual: Option<&Option<String>>) -> Update<Option<String>> {
        Update::Set(None) // unknown: the next pass sets or deletes it again
    }
}

#[derive(Default)]
struct World(Mutex<HashMap<String, String>>);

impl Driver<String, Op, Option<String>> for World {
    type Error = std::convert::Infallible;

    async fn execute(
        &self,
        key: &String,
        op: &Op,
        _: &CancellationToken,
    ) -> Outcome<Option<String>, Self::Error> {
        let mut world = self.0.lock().unwrap_or_else(|e| e.into_inner());
        match op {
            Op::Set(value) => {
                world.insert(key.clone(), value.clone());
                Outcome::Done(Update::Set(Some(value.clone())))
            }
            Op::Delete => {
                world.remove(key);
                Outcome::Done(Update::Remove)
            }
        }
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let (desired, mut writer) = reconcile_engine::store();
    writer.insert("greeting".to_string(), "hello".to_string());
    writer.insert("target".to_string(), "world".to_string());
    writer.mark_synced();
    let world = Arc::new(World::default());
    let engine = Engine::builder("mirror", Mirror, world.clone(), desired.clone()).build();
    let actual = engine.actual();
    let stop = async move {
        while actual.len() < 2 {
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
    };
    engine.run(stop).await;
    println!("world = {:?}", world.0.lock().unwrap_or_else(|e| e.into_inner()));
}
