//! The pure state machines: each takes a state and an input and returns
//! the next state and what to do, with no I/O, clock or lock of its own.
//! The drivers in `coordinators` and the partitions in `backend` run them.

pub mod cutover;
pub mod group;
pub mod names;
pub mod placement;
pub mod producer_state;
pub mod txn_coordinator;
pub mod writers;
