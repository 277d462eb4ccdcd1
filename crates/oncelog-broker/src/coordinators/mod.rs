//! The drivers that run the pure state machines (`machines`) against a
//! backend: the transaction coordinator, the group coordinator, cut-overs
//! and second-writer detection.

pub mod cutover;
pub mod groups;
pub mod txn_service;
pub mod writers;
