//! Keys that identify entries in the stores and serialize operations in the executor.

use std::fmt::Debug;
use std::hash::Hash;
use std::path::PathBuf;

/// A key of a desired/actual store and of the operations planned for it.
///
/// Keys may be **hierarchical**: a key may name a [`parent`](Key::parent). The executor never runs
/// two operations at once on keys that are equal or where one is an ancestor of the other, so an
/// operation on a volume (`Volume("v")`) waits for operations on every volume+pod pair below it
/// (`VolumePod("v", "p")`) and vice versa, while pairs of different pods run in parallel.
///
/// Methods: [`parent`](Key::parent) (the one to override; default: no parent, so flat keys
/// implement the trait with an empty `impl`), and two derived from it that the executor uses,
/// [`is_ancestor_of`](Key::is_ancestor_of) and [`conflicts_with`](Key::conflicts_with). The
/// supertraits are `Clone + Eq + Hash + Debug + Send + Sync + 'static`. `String`, `&'static str`,
/// the integer types, `PathBuf` and pairs `(A, B)` of keys implement it already (flat; a pair has
/// no parent).
///
/// ```
/// use reconcile_engine::Key;
///
/// #[derive(Clone, PartialEq, Eq, Hash, Debug)]
/// enum VolKey {
///     Device(String),
///     Pod(String, String),
/// }
///
/// impl Key for VolKey {
///     fn parent(&self) -> Option<Self> {
///         match self {
///             VolKey::Device(_) => None,
///             VolKey::Pod(vol, _) => Some(VolKey::Device(vol.clone())),
///         }
///     }
/// }
///
/// let pod = VolKey::Pod("v".into(), "p".into());
/// assert!(pod.conflicts_with(&VolKey::Device("v".into())));
/// assert!(!pod.conflicts_with(&VolKey::Pod("v".into(), "q".into())));
/// ```
pub trait Key: Clone + Eq + Hash + Debug + Send + Sync + 'static {
    /// The key one level up, if any. Default: none (a flat key).
    fn parent(&self) -> Option<Self> {
        None
    }

    /// Whether `self` is a strict ancestor of `other`.
    fn is_ancestor_of(&self, other: &Self) -> bool {
        let mut cur = other.parent();
        while let Some(p) = cur {
            if &p == self {
                return true;
            }
            cur = p.parent();
        }
        false
    }

    /// Whether operations on `self` and `other` must not overlap: they are equal, or one is an
    /// ancestor of the other.
    fn conflicts_with(&self, other: &Self) -> bool {
        self == other || self.is_ancestor_of(other) || other.is_ancestor_of(self)
    }
}

macro_rules! flat_key {
    ($($t:ty),* $(,)?) => { $(impl Key for $t {})* };
}

flat_key!(String, &'static str, u8, u16, u32, u64, u128, usize, i8, i16, i32, i64, i128, isize, PathBuf);

impl<A: Key, B: Key> Key for (A, B) {}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Clone, PartialEq, Eq, Hash, Debug)]
    struct Path3(Vec<u8>);

    impl Key for Path3 {
        fn parent(&self) -> Option<Self> {
            if self.0.is_empty() { None } else { Some(Path3(self.0[..self.0.len() - 1].to_vec())) }
        }
    }

    #[test]
    fn ancestors_conflict_at_any_depth_but_siblings_do_not() {
        let root = Path3(vec![]);
        let a = Path3(vec![1]);
        let ab = Path3(vec![1, 2]);
        let ac = Path3(vec![1, 3]);
        assert!(root.is_ancestor_of(&ab));
        assert!(a.is_ancestor_of(&ab));
        assert!(!ab.is_ancestor_of(&a));
        assert!(ab.conflicts_with(&root));
        assert!(ab.conflicts_with(&ab));
        assert!(!ab.conflicts_with(&ac));
    }

    #[test]
    fn flat_keys_only_conflict_with_themselves() {
        assert!("a".conflicts_with(&"a"));
        assert!(!"a".conflicts_with(&"b"));
        assert!(!(1u64, 2u64).conflicts_with(&(1u64, 3u64)));
    }
}
