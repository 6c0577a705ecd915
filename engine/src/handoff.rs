//! A single-producer, single-consumer ring of fixed-size byte slots: how
//! engine mode hands payloads between the application thread and the
//! worker without allocating or locking. Usable on its own.

pub use crate::sys::handoff::{handoff_ring, Published, SlotReader, SlotWriter};
