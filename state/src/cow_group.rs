//! A key group's table as the heap backend holds it: owned while no snapshot holds it, so a
//! write costs no atomic operation, and shared behind an `Arc` from a snapshot until the next
//! write (which takes it back, copying it only if the snapshot still holds it).

use std::sync::Arc;

/// One key group's table: owned, or shared with snapshots.
#[derive(Debug)]
pub(crate) enum CowGroup<G> {
    /// No snapshot holds it: written in place.
    Owned(G),
    /// Snapshots may hold it: the next write takes it back ([`Arc::unwrap_or_clone`]).
    Shared(Arc<G>),
}

impl<G: Clone + Default> CowGroup<G> {
    /// An owned table.
    pub(crate) fn new(group: G) -> Self {
        CowGroup::Owned(group)
    }

    /// A table restored or handed over behind an `Arc`.
    pub(crate) fn from_shared(group: Arc<G>) -> Self {
        CowGroup::Shared(group)
    }

    /// The table, for reading.
    #[inline]
    pub(crate) fn get(&self) -> &G {
        match self {
            CowGroup::Owned(g) => g,
            CowGroup::Shared(g) => g,
        }
    }

    /// The table, for writing: a shared table is taken back first, copied if a snapshot
    /// still holds it.
    #[inline]
    pub(crate) fn get_mut(&mut self) -> &mut G {
        if matches!(self, CowGroup::Shared(_)) {
            self.unshare();
        }
        match self {
            CowGroup::Owned(g) => g,
            // Not reached (unshare made it owned); correct all the same.
            CowGroup::Shared(g) => Arc::make_mut(g),
        }
    }

    #[cold]
    fn unshare(&mut self) {
        if let CowGroup::Shared(shared) = std::mem::replace(self, CowGroup::Owned(G::default())) {
            *self = CowGroup::Owned(Arc::unwrap_or_clone(shared));
        }
    }

    /// The table for a snapshot: from now on shared (O(1): the table moves behind an `Arc`,
    /// nothing is copied).
    pub(crate) fn share(&mut self) -> Arc<G> {
        if let CowGroup::Owned(g) = self {
            let g = std::mem::take(g);
            *self = CowGroup::Shared(Arc::new(g));
        }
        match self {
            CowGroup::Shared(g) => Arc::clone(g),
            // Not reached (made shared above); correct all the same.
            CowGroup::Owned(g) => Arc::new(g.clone()),
        }
    }

    /// Whether a snapshot may hold the table, and how many holders its `Arc` has (tests).
    #[cfg(test)]
    pub(crate) fn holders(&self) -> usize {
        match self {
            CowGroup::Owned(_) => 1,
            CowGroup::Shared(g) => Arc::strong_count(g),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_after_a_snapshot_copies_only_while_the_snapshot_holds_the_table() {
        let mut group = CowGroup::new(vec![1, 2]);
        group.get_mut().push(3);
        let frozen = group.share();
        assert_eq!(group.holders(), 2);
        // The snapshot still holds it: the write copies, the snapshot keeps its view.
        group.get_mut().push(4);
        assert_eq!(*frozen, vec![1, 2, 3]);
        assert_eq!(group.get(), &vec![1, 2, 3, 4]);
        assert_eq!(group.holders(), 1);
        // Shared, then the snapshot is dropped: the write takes the table back without a copy.
        let frozen = group.share();
        let address = frozen.as_ptr();
        drop(frozen);
        group.get_mut().push(5);
        assert_eq!(group.get().as_ptr(), address);
        assert_eq!(group.get(), &vec![1, 2, 3, 4, 5]);
        let restored = CowGroup::from_shared(Arc::new(vec![9]));
        assert_eq!(restored.get(), &vec![9]);
    }
}
