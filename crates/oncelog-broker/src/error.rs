//! Kafka error codes with their wire numbers (a removed code is never
//! reused), and the storage-side error of the topic catalogue.

use oncelog_log::LogError;
use uuid::Uuid;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(i16)]
pub enum ErrorCode {
    UnknownServerError = -1,
    None = 0,
    OffsetOutOfRange = 1,
    CorruptMessage = 2,
    UnknownTopicOrPartition = 3,
    InvalidFetchSize = 4,
    LeaderNotAvailable = 5,
    NotLeaderOrFollower = 6,
    RequestTimedOut = 7,
    MessageTooLarge = 10,
    InvalidTopicException = 17,
    RecordListTooLarge = 18,
    NotEnoughReplicas = 19,
    IllegalGeneration = 22,
    InconsistentGroupProtocol = 23,
    InvalidGroupId = 24,
    UnknownMemberId = 25,
    InvalidSessionTimeout = 26,
    RebalanceInProgress = 27,
    InvalidRequiredAcks = 21,
    InvalidTimestamp = 32,
    TopicAuthorizationFailed = 29,
    UnsupportedVersion = 35,
    TopicAlreadyExists = 36,
    InvalidPartitions = 37,
    InvalidReplicationFactor = 38,
    InvalidReplicaAssignment = 39,
    InvalidConfig = 40,
    InvalidRequest = 42,
    PolicyViolation = 44,
    UnsupportedForMessageFormat = 43,
    KafkaStorageError = 56,
    CoordinatorLoadInProgress = 14,
    CoordinatorNotAvailable = 15,
    NotCoordinator = 16,
    OutOfOrderSequenceNumber = 45,
    DuplicateSequenceNumber = 46,
    InvalidProducerEpoch = 47,
    InvalidTxnState = 48,
    InvalidProducerIdMapping = 49,
    InvalidTransactionTimeout = 50,
    ConcurrentTransactions = 51,
    TransactionCoordinatorFenced = 52,
    OperationNotAttempted = 55,
    UnknownProducerId = 59,
    NonEmptyGroup = 68,
    GroupIdNotFound = 69,
    GroupSubscribedToTopic = 86,
    MemberIdRequired = 79,
    FencedInstanceId = 82,
    UnstableOffsetCommit = 88,
    TransactionalIdNotFound = 105,
    UnknownTopicId = 100,
    InvalidRegularExpression = 128,
    InvalidRecord = 87,
    ProducerFenced = 90,
    TransactionalIdAuthorizationFailed = 53,
    GroupAuthorizationFailed = 30,
    ClusterAuthorizationFailed = 31,
    SecurityDisabled = 54,
    UnsupportedSaslMechanism = 33,
    IllegalSaslState = 34,
    SaslAuthenticationFailed = 58,
    ResourceNotFound = 91,
    DuplicateResource = 92,
    UnacceptableCredential = 93,
    ListenerNotFound = 72,
}

impl ErrorCode {
    pub const fn code(self) -> i16 {
        self as i16
    }
}

#[derive(Debug, thiserror::Error)]
pub enum TopicError {
    #[error("topic {0} already exists")]
    AlreadyExists(String),
    #[error("topic {0} does not exist")]
    Unknown(String),
    #[error("no topic has id {0}")]
    UnknownId(Uuid),
    #[error("invalid topic name {0:?}: {1}")]
    InvalidName(String, &'static str),
    #[error("invalid partition count {0}")]
    InvalidPartitions(String),
    #[error("invalid config: {0}")]
    InvalidConfig(String),
    #[error("{topic} is an internal topic owned by the broker: clients cannot {action} it")]
    Internal { topic: String, action: &'static str },
    #[error("storage: {0}")]
    Storage(String),
    /// The data directory cannot be used (not a directory, owned by another broker).
    #[error("{0}")]
    DataDir(String),
}

impl From<LogError> for TopicError {
    fn from(e: LogError) -> Self {
        TopicError::Storage(e.to_string())
    }
}

/// Why a transactional write or commit is refused or held by the topic's
/// writer fence or cut-over (`crate::coordinators::cutover`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Gate {
    /// Refused for good: TRANSACTIONAL_ID_AUTHORIZATION_FAILED.
    #[error("{0}")]
    Refused(String),
    /// Not yet: CONCURRENT_TRANSACTIONS, which clients retry.
    #[error("{0}")]
    Held(String),
}
