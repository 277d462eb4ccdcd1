//! The drivers that run the pure state machines (`machines`) against a
//! backend: the transaction coordinator, the group coordinator, and cut-overs.

pub mod cutover;
pub mod groups;
pub mod txn_service;
pub mod verify;
pub mod verify_lineage;
pub mod verify_unique;
