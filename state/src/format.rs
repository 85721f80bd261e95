//! The keyed snapshot format (being written).
