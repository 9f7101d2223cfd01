//! Bytes per key of a [`Store`](reconcile_engine::Store): resident memory measured in a fresh child
//! process before and after filling a store, and the size computed from the data layout.

use std::hint::black_box;
use std::mem::size_of;
use std::process::Command;
use std::sync::Arc;

use reconcile_engine::store;

use crate::domain::{PodState, key};

/// The argument that turns the benchmark binary into the memory-measuring child.
pub(crate) const CHILD_ARG: &str = "--rss-child";

/// Resident set size of this process, from `/proc/self/status`.
fn rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|line| line.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Child side: fills a store with `n` entries and prints `before after len` (bytes, bytes,
/// entries). Keys are created inside the measured region, so their heap counts.
pub(crate) fn child(n: usize) -> Result<(), String> {
    let before = rss_bytes().ok_or("cannot read VmRSS from /proc/self/status")?;
    let (reader, mut writer) = store::<String, PodState>();
    for i in 0..n {
        writer.insert(key(i), PodState::new(i));
    }
    let after = rss_bytes().ok_or("cannot read VmRSS from /proc/self/status")?;
    println!("{before} {after} {}", black_box(&reader).len());
    Ok(())
}

/// What [`measure`] found for one store size.
#[derive(Debug, Clone, Copy)]
pub(crate) struct MemoryFigures {
    pub(crate) entries: usize,
    /// Resident memory added by the filled store, if the child could measure it.
    pub(crate) rss_delta: Option<u64>,
    /// Size per entry computed from the layout (see [`theoretical_bytes_per_entry`]).
    pub(crate) theoretical: f64,
}

impl MemoryFigures {
    pub(crate) fn measured_per_key(&self) -> Option<f64> {
        self.rss_delta.map(|delta| delta as f64 / self.entries as f64)
    }
}

/// Runs this binary as a child that fills a store with `entries` entries; a fresh process keeps
/// memory freed by the other measurements out of the figure.
pub(crate) fn measure(entries: usize) -> MemoryFigures {
    let rss_delta = std::env::current_exe().ok().and_then(|exe| {
        let output = Command::new(exe).arg(CHILD_ARG).arg(entries.to_string()).output().ok()?;
        if !output.status.success() {
            eprintln!("memory child failed: {}", String::from_utf8_lossy(&output.stderr).trim());
            return None;
        }
        let text = String::from_utf8(output.stdout).ok()?;
        let fields: Vec<u64> = text.split_whitespace().filter_map(|f| f.parse().ok()).collect();
        match fields[..] {
            [before, after, len] if len == entries as u64 => Some(after.saturating_sub(before)),
            _ => None,
        }
    });
    MemoryFigures { entries, rss_delta, theoretical: theoretical_bytes_per_entry(entries) }
}

/// glibc malloc's chunk size for a request on 64-bit Linux: 8 bytes of header, 16-byte
/// alignment, 32 bytes at least.
fn malloc_chunk(request: usize) -> usize {
    ((request + 8 + 15) & !15).max(32)
}

/// Shards of a `DashMap` with its default shard amount on this machine.
fn dashmap_shards() -> usize {
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    (cores * 4).next_power_of_two()
}

/// Hash table buckets a hashbrown table has after growing to `items` entries by insertion: a
/// power of two, at most 7/8 full.
fn hashbrown_buckets(items: usize) -> usize {
    if items < 4 {
        return 4;
    }
    let mut buckets = 8usize;
    while items > buckets / 8 * 7 {
        buckets *= 2;
    }
    buckets
}

/// Bytes per entry from the layout: the key's heap block, the `Arc<V>` block, and the entry's
/// share of the hash table (one `(String, Arc<V>)` slot plus one control byte per bucket, with
/// the power-of-two growth of every shard).
pub(crate) fn theoretical_bytes_per_entry(entries: usize) -> f64 {
    let shards = dashmap_shards();
    let per_shard = entries.div_ceil(shards);
    let slot = size_of::<(String, Arc<PodState>)>();
    let table = shards * (hashbrown_buckets(per_shard) * (slot + 1) + 16);
    let key_heap = malloc_chunk(key(entries.saturating_sub(1)).capacity());
    let arc_heap = malloc_chunk(2 * size_of::<usize>() + size_of::<PodState>());
    table as f64 / entries as f64 + (key_heap + arc_heap) as f64
}

/// A one-line account of [`theoretical_bytes_per_entry`] for the report.
pub(crate) fn layout_note() -> String {
    format!(
        "slot {} B (String + Arc ptr) + 1 ctrl byte / load factor; key heap {} B; Arc<PodState> heap {} B (glibc chunks); {} shards",
        size_of::<(String, Arc<PodState>)>(),
        malloc_chunk(key(0).capacity()),
        malloc_chunk(2 * size_of::<usize>() + size_of::<PodState>()),
        dashmap_shards()
    )
}
