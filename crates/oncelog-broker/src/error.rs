//! Kafka error codes with their wire numbers. A removed code is never reused.

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
    UnsupportedVersion = 35,
    TopicAlreadyExists = 36,
    InvalidPartitions = 37,
    InvalidReplicationFactor = 38,
    InvalidReplicaAssignment = 39,
    InvalidConfig = 40,
    InvalidRequest = 42,
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
    MemberIdRequired = 79,
    FencedInstanceId = 82,
    UnstableOffsetCommit = 88,
    TransactionalIdNotFound = 105,
    InvalidRegularExpression = 128,
    InvalidRecord = 87,
    ProducerFenced = 90,
    TransactionalIdAuthorizationFailed = 53,
}

impl ErrorCode {
    pub fn code(self) -> i16 {
        self as i16
    }
}
