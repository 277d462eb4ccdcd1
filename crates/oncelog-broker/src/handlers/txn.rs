//! InitProducerId. Idempotent producers (no transactional id) get a fresh
//! producer id with epoch 0 every time, as Kafka does.

use std::sync::Arc;

use kafka_protocol::messages::init_producer_id_request::InitProducerIdRequest;
use kafka_protocol::messages::init_producer_id_response::InitProducerIdResponse;
use kafka_protocol::messages::ProducerId;

use crate::error::ErrorCode;
use crate::Broker;

pub fn init_producer_id(
    b: &Arc<Broker>,
    req: InitProducerIdRequest,
    _version: i16,
) -> InitProducerIdResponse {
    let resp = InitProducerIdResponse::default()
        .with_producer_id(ProducerId(-1))
        .with_producer_epoch(-1);
    if req.transactional_id.is_some() {
        return resp.with_error_code(ErrorCode::TransactionalIdAuthorizationFailed.code());
    }
    match b.producer_ids.next() {
        Ok(pid) => {
            tracing::debug!(producer_id = pid, "idempotent producer id allocated");
            resp.with_producer_id(ProducerId(pid))
                .with_producer_epoch(0)
        }
        Err(e) => {
            tracing::error!(error = %e, "could not allocate a producer id");
            resp.with_error_code(ErrorCode::CoordinatorNotAvailable.code())
        }
    }
}
