//! A member most sessions leave empty, held as a pointer that allocates
//! only once it holds something: every session carries the field, and a
//! session struct over 256 bytes takes jemalloc's 320-byte class (64 B of a
//! 30 x 200 B session that costs ~7 KB).

use std::collections::BTreeMap;
use std::ops::{Deref, DerefMut};

/// A value with an empty state that needs no allocation to read.
pub trait Empty: Default + PartialEq + 'static {
    fn empty() -> &'static Self;
}

impl<K: Ord + 'static, V: PartialEq + 'static> Empty for BTreeMap<K, V>
where
    BTreeMap<K, V>: Sync,
{
    fn empty() -> &'static Self {
        // A fresh `&BTreeMap::new()` is promoted to a static per type.
        const { &BTreeMap::new() }
    }
}

/// `T`, boxed while it is not empty. Reads see `T::empty()` when nothing
/// is held; a mutable borrow allocates, so callers that may leave it empty
/// check first (or [`Sparse::settle`] after).
#[derive(Clone, Debug, Default)]
pub struct Sparse<T: Empty>(Option<Box<T>>);

impl<T: Empty> Sparse<T> {
    pub fn new(value: T) -> Sparse<T> {
        let mut s = Sparse(Some(Box::new(value)));
        s.settle();
        s
    }

    /// Bytes of the box (MEMORY USAGE), not of what `T` itself points to.
    pub fn boxed_bytes(&self) -> usize {
        self.0.as_ref().map_or(0, |_| std::mem::size_of::<T>())
    }

    /// An edit that can only take things away (remove, retain, clear a
    /// field): run on what is held, none when nothing is (no box made for
    /// it), and the box freed if it leaves the value empty.
    pub fn shrink(&mut self, edit: impl FnOnce(&mut T)) {
        if let Some(value) = self.0.as_deref_mut() {
            edit(value);
            self.settle();
        }
    }

    /// Frees the box when what it holds is empty.
    pub fn settle(&mut self) {
        if self.0.as_deref().is_some_and(|v| v == T::empty()) {
            self.0 = None;
        }
    }
}

impl<T: Empty> Deref for Sparse<T> {
    type Target = T;
    fn deref(&self) -> &T {
        self.0.as_deref().unwrap_or(T::empty())
    }
}

impl<T: Empty> DerefMut for Sparse<T> {
    fn deref_mut(&mut self) -> &mut T {
        self.0.get_or_insert_with(Box::default)
    }
}

impl<T: Empty> From<T> for Sparse<T> {
    fn from(value: T) -> Sparse<T> {
        Sparse::new(value)
    }
}

impl<'a, T: Empty> IntoIterator for &'a Sparse<T>
where
    &'a T: IntoIterator,
{
    type Item = <&'a T as IntoIterator>::Item;
    type IntoIter = <&'a T as IntoIterator>::IntoIter;
    fn into_iter(self) -> Self::IntoIter {
        (**self).into_iter()
    }
}

impl<T: Empty> PartialEq for Sparse<T> {
    fn eq(&self, other: &Sparse<T>) -> bool {
        **self == **other
    }
}

impl<T: Empty + Eq> Eq for Sparse<T> {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nothing_is_allocated_until_something_is_held() {
        let mut s: Sparse<BTreeMap<String, i64>> = Sparse::default();
        assert!(s.is_empty() && s.0.is_none());
        s.insert("a".into(), 1);
        assert_eq!(s.get("a"), Some(&1));
        s.remove("a");
        s.settle();
        assert!(s.0.is_none());
        assert_eq!(Sparse::new(BTreeMap::<String, i64>::new()), s);
        assert!(Sparse::new(BTreeMap::<String, i64>::new()).0.is_none());
    }
}
