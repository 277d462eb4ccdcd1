//! What an operator sees: Prometheus metrics, the HTTP listener that
//! serves them with the admin endpoints and the console, and the history
//! of each transactional id.

pub mod console;
pub mod exposition;
pub mod histogram;
pub mod http;
pub mod httpmsg;
pub mod metrics;
pub mod samples;
pub mod txn_history;
pub mod verify;
