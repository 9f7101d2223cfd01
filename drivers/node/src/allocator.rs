//! Gives the memory allocator's free pages back to the system.
//!
//! glibc's malloc gives memory back to the system only from the top of each arena: after a peak (thousands
//! of objects made and freed at once) the pages below the live objects stay with the process, free but
//! resident, and the process keeps its high-water mark. [`trim`] asks glibc to give back every whole free
//! page of every arena (`malloc_trim(0)`, which walks the arenas with `madvise(MADV_DONTNEED)`). With
//! another C library (musl) it does nothing.

/// Gives every whole free page of the allocator's arenas back to the system; returns whether any was
/// given back. Locks each arena in turn while it walks it: call it now and then (every minute), on a
/// blocking thread, not on every free.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)]
pub fn trim() -> bool {
    // SAFETY: `malloc_trim` takes no pointer and touches only the allocator's own free lists, under the
    // same arena locks as `malloc` and `free` (glibc documents it MT-Safe).
    unsafe { libc::malloc_trim(0) == 1 }
}

/// Does nothing: only glibc keeps freed pages this way and has `malloc_trim`.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn trim() -> bool {
    false
}

#[cfg(test)]
mod tests {
    #[test]
    fn trimming_after_freeing_a_peak_gives_pages_back() {
        // Many small blocks (below the mmap threshold, so they live in the arena), then all freed but
        // the last: the arena's top is held by the last one, so only a trim gives the rest back.
        let blocks: Vec<Vec<u8>> = (0..4096).map(|_| vec![7_u8; 4000]).collect();
        let last = blocks.last().cloned();
        drop(blocks);
        let trimmed = super::trim();
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        assert!(trimmed, "16 MB of freed blocks below a live one: some whole pages are free");
        #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
        assert!(!trimmed);
        assert!(last.is_some_and(|l| l.len() == 4000));
    }
}
