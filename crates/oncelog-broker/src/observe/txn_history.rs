//! What happened to each transactional id recently, for an operator hunting
//! a zombie producer: which client held which epoch, every fence (when, why,
//! old → new epoch, and the client id and address of whoever caused it), and
//! the recent events (init, begin, add partitions, commit, abort, fence,
//! requests and writes refused because their producer was fenced).
//!
//! The Kafka protocol has no field for any of this, so it is served as JSON
//! on the broker's HTTP port (`GET /v1/transactions/<id>/history`, see
//! [`crate::observe::metrics`]).
//!
//! Invariants:
//! * Bounded memory: at most [`MAX_IDS`] ids (the least recently touched one
//!   is forgotten first), and per id at most [`MAX_EVENTS`] events,
//!   [`MAX_FENCES`] fences and [`MAX_EPOCHS`] epochs (oldest dropped first,
//!   counted in `*_dropped`). Refusals of the same kind in a row are folded
//!   into one event with a count, so a looping zombie cannot push the fence
//!   that explains it out of the window.
//! * In memory only: a restart starts empty (`history_since_ms` says when).
//!   Nothing in recovery reads it.
//! * Pure bookkeeping: no I/O, no clock (callers pass the time), so it is
//!   tested without a broker.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

/// Transactional ids whose history is kept.
pub const MAX_IDS: usize = 2048;
/// Events kept per id.
pub const MAX_EVENTS: usize = 32;
/// Fences kept per id (apart from the events, so they outlive busy periods).
pub const MAX_FENCES: usize = 16;
/// Epochs kept per id.
pub const MAX_EPOCHS: usize = 16;

/// Who sent a request: the `client.id` of its Kafka request header and the
/// connection's peer address.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Requester {
    pub client_id: Option<String>,
    pub peer: Option<SocketAddr>,
}

impl Requester {
    pub fn new(client_id: Option<&str>, peer: SocketAddr) -> Self {
        Self {
            client_id: client_id.map(str::to_string),
            peer: Some(peer),
        }
    }

    fn client_id(&self) -> Option<String> {
        self.client_id.clone()
    }

    fn peer(&self) -> Option<String> {
        self.peer.map(|p| p.to_string())
    }
}

/// Why a producer was fenced.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FenceCause {
    /// A producer with the same transactional id called InitProducerId.
    NewerProducer,
    /// The open transaction outlived `transaction.timeout.ms`.
    Timeout,
    /// An operator aborted the open transaction (WriteTxnMarkers).
    Administrator,
    /// A cut-over handed the topic to another writer (`oncelog cutover`).
    Cutover,
}

impl FenceCause {
    pub fn as_str(self) -> &'static str {
        match self {
            FenceCause::NewerProducer => "newer_producer",
            FenceCause::Cutover => "cutover",
            FenceCause::Timeout => "timeout",
            FenceCause::Administrator => "administrator",
        }
    }
}

/// What an event was.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    /// InitProducerId: a new id, or a producer re-initialising its own identity.
    Init,
    /// The first partition of a transaction was added.
    Begin,
    /// More partitions joined the open transaction.
    AddPartitions,
    Commit,
    Abort,
    Fence,
    /// AddPartitionsToTxn, EndTxn or InitProducerId refused: producer fenced.
    FencedRequest,
    /// A transactional produce refused (stale epoch, or not in a transaction).
    RejectedWrite,
    /// The id was idle past `transactional.id.expiration.ms` and forgotten.
    Expired,
}

/// One thing that happened to a transactional id.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    pub time_ms: i64,
    pub event: EventKind,
    pub producer_id: i64,
    /// The epoch the event concerns (for a fence or a bump: the new one).
    pub epoch: i16,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub old_epoch: Option<i16>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cause: Option<FenceCause>,
    pub client_id: Option<String>,
    pub peer: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub partitions: Vec<String>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub detail: String,
    /// How many times in a row this happened (refusals are folded).
    pub count: u64,
    /// When the last of `count` happened.
    pub last_time_ms: i64,
    /// A commit's or abort's time since its transaction began.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<i64>,
}

/// One fence of a transactional id.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fence {
    pub time_ms: i64,
    pub cause: FenceCause,
    pub producer_id: i64,
    pub old_epoch: i16,
    pub new_epoch: i16,
    /// The client that caused it (none for a timeout).
    pub client_id: Option<String>,
    pub peer: Option<String>,
    /// Whether a transaction was open (and so aborted by the fence).
    pub open_transaction: bool,
    pub aborted_partitions: Vec<String>,
}

/// One epoch of a transactional id: who got it, how, and how it ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Epoch {
    pub producer_id: i64,
    pub epoch: i16,
    pub since_ms: i64,
    /// How the id got to this epoch: init, fence, timeout, administrator, end_txn.
    pub via: String,
    /// The client the epoch was handed to, when one asked for it.
    pub client_id: Option<String>,
    pub peer: Option<String>,
    pub ended_ms: Option<i64>,
    pub ended_by: Option<String>,
}

/// Everything kept about one transactional id.
#[derive(Debug, Clone, Default, Serialize)]
pub struct IdHistory {
    pub epochs: VecDeque<Epoch>,
    pub fences: VecDeque<Fence>,
    pub events: VecDeque<Event>,
    pub epochs_dropped: u64,
    pub fences_dropped: u64,
    pub events_dropped: u64,
    #[serde(skip)]
    touched: u64,
}

/// One change to an id's history, as a value: local mode applies it to the
/// broker's [`TxnHistory`] at once; cluster mode stores it (a row in
/// PostgreSQL) and every broker replays an id's notes into a history when
/// asked, so each answers alike.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "note", rename_all = "snake_case")]
pub enum Note {
    /// [`TxnHistory::event`].
    Event { event: Event },
    /// [`TxnHistory::event_if_known`].
    EventIfKnown { event: Event },
    /// [`TxnHistory::fence`].
    Fence { fence: Fence },
    /// [`TxnHistory::epoch`] (its `ended_*` unset).
    Epoch { epoch: Epoch },
}

impl Note {
    /// When it happened (by the clock of the broker that noted it).
    pub fn time_ms(&self) -> i64 {
        match self {
            Note::Event { event } | Note::EventIfKnown { event } => event.time_ms,
            Note::Fence { fence } => fence.time_ms,
            Note::Epoch { epoch } => epoch.since_ms,
        }
    }

    /// [`TxnHistory::epoch`]'s note: the id is now at (pid, epoch), reached
    /// `via` for `who`.
    pub fn epoch(
        producer_id: i64,
        epoch: i16,
        now: i64,
        via: &str,
        who: Option<&Requester>,
    ) -> Self {
        Note::Epoch {
            epoch: Epoch {
                producer_id,
                epoch,
                since_ms: now,
                via: via.to_string(),
                client_id: who.and_then(Requester::client_id),
                peer: who.and_then(Requester::peer),
                ended_ms: None,
                ended_by: None,
            },
        }
    }
}

/// The histories of all tracked ids.
#[derive(Debug)]
pub struct TxnHistory {
    ids: HashMap<String, IdHistory>,
    since_ms: i64,
    clock: u64,
    max_ids: usize,
}

fn push_bounded<T>(q: &mut VecDeque<T>, item: T, max: usize, dropped: &mut u64) {
    while q.len() >= max {
        q.pop_front();
        *dropped += 1;
    }
    q.push_back(item);
}

impl Event {
    /// An event at `time_ms` of `kind` for (pid, epoch), by `who`.
    pub fn new(time_ms: i64, event: EventKind, producer_id: i64, epoch: i16) -> Self {
        Self {
            time_ms,
            event,
            producer_id,
            epoch,
            old_epoch: None,
            cause: None,
            client_id: None,
            peer: None,
            partitions: Vec::new(),
            detail: String::new(),
            count: 1,
            last_time_ms: time_ms,
            duration_ms: None,
        }
    }

    pub fn by(mut self, who: &Requester) -> Self {
        self.client_id = who.client_id();
        self.peer = who.peer();
        self
    }

    pub fn old_epoch(mut self, old: i16) -> Self {
        self.old_epoch = Some(old);
        self
    }

    pub fn partitions<'a>(mut self, parts: impl IntoIterator<Item = &'a (String, i32)>) -> Self {
        self.partitions = parts.into_iter().map(|(t, p)| format!("{t}-{p}")).collect();
        self
    }

    pub fn detail(mut self, d: impl Into<String>) -> Self {
        self.detail = d.into();
        self
    }

    /// Whether `next` repeats this event (a refusal of the same kind, from
    /// the same producer and epoch, with the same detail and partitions).
    fn folds(&self, next: &Event) -> bool {
        matches!(
            self.event,
            EventKind::FencedRequest | EventKind::RejectedWrite
        ) && self.event == next.event
            && self.producer_id == next.producer_id
            && self.epoch == next.epoch
            && self.detail == next.detail
            && self.partitions == next.partitions
            && self.client_id == next.client_id
    }
}

impl TxnHistory {
    pub fn new(since_ms: i64) -> Self {
        Self::with_capacity(since_ms, MAX_IDS)
    }

    /// A history keeping at most `max_ids` ids (at least one).
    pub fn with_capacity(since_ms: i64, max_ids: usize) -> Self {
        Self {
            ids: HashMap::new(),
            since_ms,
            clock: 0,
            max_ids: max_ids.max(1),
        }
    }

    /// When this history started (the broker's start: it is not persisted).
    pub fn since_ms(&self) -> i64 {
        self.since_ms
    }

    pub fn len(&self) -> usize {
        self.ids.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// The id's history, created (evicting the least recently touched id
    /// when full) when `create`.
    fn entry(&mut self, id: &str, create: bool) -> Option<&mut IdHistory> {
        self.clock += 1;
        let clock = self.clock;
        if !self.ids.contains_key(id) {
            if !create {
                return None;
            }
            if self.ids.len() >= self.max_ids {
                let oldest = self
                    .ids
                    .iter()
                    .min_by_key(|(_, h)| h.touched)
                    .map(|(k, _)| k.clone());
                if let Some(k) = oldest {
                    self.ids.remove(&k);
                }
            }
            self.ids.insert(id.to_string(), IdHistory::default());
        }
        let h = self.ids.get_mut(id)?;
        h.touched = clock;
        Some(h)
    }

    /// Records an event (folding a repeated refusal into the previous one).
    pub fn event(&mut self, id: &str, e: Event) {
        self.record(id, e, true);
    }

    /// Records an event only for an id already tracked (refusals from
    /// producers nobody asked about must not evict real histories).
    pub fn event_if_known(&mut self, id: &str, e: Event) {
        self.record(id, e, false);
    }

    fn record(&mut self, id: &str, e: Event, create: bool) {
        let Some(h) = self.entry(id, create) else {
            return;
        };
        if let Some(last) = h.events.back_mut() {
            if last.folds(&e) {
                last.count += 1;
                last.last_time_ms = e.time_ms;
                return;
            }
        }
        push_bounded(&mut h.events, e, MAX_EVENTS, &mut h.events_dropped);
    }

    /// Records a fence (also as an event).
    pub fn fence(&mut self, id: &str, f: Fence) {
        let mut e = Event::new(f.time_ms, EventKind::Fence, f.producer_id, f.new_epoch)
            .old_epoch(f.old_epoch);
        e.cause = Some(f.cause);
        e.client_id = f.client_id.clone();
        e.peer = f.peer.clone();
        e.partitions = f.aborted_partitions.clone();
        if !f.open_transaction {
            e.detail = "no transaction was open".into();
        }
        self.event(id, e);
        if let Some(h) = self.entry(id, true) {
            push_bounded(&mut h.fences, f, MAX_FENCES, &mut h.fences_dropped);
        }
    }

    /// Applies one note.
    pub fn apply(&mut self, id: &str, note: Note) {
        match note {
            Note::Event { event } => self.event(id, event),
            Note::EventIfKnown { event } => self.event_if_known(id, event),
            Note::Fence { fence } => self.fence(id, fence),
            Note::Epoch { epoch } => self.push_epoch(id, epoch),
        }
    }

    /// Notes that the id is now at (pid, epoch), reached `via` for `who`;
    /// closes the previous epoch. Nothing happens when the identity did not
    /// change.
    pub fn epoch(
        &mut self,
        id: &str,
        producer_id: i64,
        epoch: i16,
        now: i64,
        via: &str,
        who: Option<&Requester>,
    ) {
        self.apply(id, Note::epoch(producer_id, epoch, now, via, who));
    }

    fn push_epoch(&mut self, id: &str, e: Epoch) {
        let Some(h) = self.entry(id, true) else {
            return;
        };
        if let Some(last) = h.epochs.back_mut() {
            if last.producer_id == e.producer_id && last.epoch == e.epoch {
                return;
            }
            if last.ended_ms.is_none() {
                last.ended_ms = Some(e.since_ms);
                last.ended_by = Some(e.via.clone());
            }
        }
        push_bounded(&mut h.epochs, e, MAX_EPOCHS, &mut h.epochs_dropped);
    }

    /// One id's history, if tracked.
    /// Every tracked id's history.
    pub fn iter(&self) -> impl Iterator<Item = (&String, &IdHistory)> {
        self.ids.iter()
    }

    pub fn get(&self, id: &str) -> Option<&IdHistory> {
        self.ids.get(id)
    }

    /// The JSON answer for one id (empty lists for an id never seen since
    /// `history_since_ms`).
    pub fn to_json(&self, id: &str) -> serde_json::Value {
        let empty = IdHistory::default();
        let h = self.ids.get(id).unwrap_or(&empty);
        serde_json::json!({
            "transactional_id": id,
            "tracked": self.ids.contains_key(id),
            "history_since_ms": self.since_ms,
            "persisted": false,
            "epochs": h.epochs,
            "fences": h.fences,
            "events": h.events,
            "epochs_dropped": h.epochs_dropped,
            "fences_dropped": h.fences_dropped,
            "events_dropped": h.events_dropped,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn who(c: &str, port: u16) -> Requester {
        Requester::new(Some(c), SocketAddr::from(([127, 0, 0, 1], port)))
    }

    fn fence(t: i64, old: i16, by: Option<&Requester>, cause: FenceCause) -> Fence {
        Fence {
            time_ms: t,
            cause,
            producer_id: 7,
            old_epoch: old,
            new_epoch: old + 1,
            client_id: by.and_then(|w| w.client_id.clone()),
            peer: by.and_then(|w| w.peer.map(|p| p.to_string())),
            open_transaction: true,
            aborted_partitions: vec!["t-0".into()],
        }
    }

    #[test]
    fn notes_survive_a_round_trip_through_json() {
        let w = who("c", 7);
        let mut direct = TxnHistory::new(0);
        let mut replayed = TxnHistory::new(0);
        let notes = vec![
            Note::Event {
                event: Event::new(1, EventKind::Init, 5, 0).by(&w),
            },
            Note::epoch(5, 0, 1, "init", Some(&w)),
            Note::EventIfKnown {
                event: Event::new(2, EventKind::RejectedWrite, 5, 0)
                    .partitions([&("t".to_string(), 0)])
                    .detail("stale"),
            },
        ];
        for n in notes {
            direct.apply("a", n.clone());
            let text = serde_json::to_string(&n).unwrap();
            replayed.apply("a", serde_json::from_str(&text).unwrap());
        }
        assert_eq!(direct.to_json("a"), replayed.to_json("a"));
        assert_eq!(replayed.to_json("a")["epochs"][0]["via"], "init");
    }

    #[test]
    fn two_fences_keep_their_epochs_and_clients() {
        let mut h = TxnHistory::new(0);
        let (a, b, c) = (who("a", 1), who("b", 2), who("c", 3));
        h.epoch("x", 7, 0, 1, "init", Some(&a));
        h.fence("x", fence(2, 0, Some(&b), FenceCause::NewerProducer));
        h.epoch("x", 7, 1, 2, "fence", Some(&b));
        h.fence("x", fence(3, 1, Some(&c), FenceCause::NewerProducer));
        h.epoch("x", 7, 2, 3, "fence", Some(&c));
        let x = h.get("x").unwrap();
        let f: Vec<_> = x
            .fences
            .iter()
            .map(|f| (f.old_epoch, f.new_epoch, f.client_id.as_deref()))
            .collect();
        assert_eq!(f, [(0, 1, Some("b")), (1, 2, Some("c"))]);
        assert_eq!(x.fences[0].peer.as_deref(), Some("127.0.0.1:2"));
        let e: Vec<_> = x
            .epochs
            .iter()
            .map(|e| (e.epoch, e.client_id.as_deref(), e.ended_ms))
            .collect();
        assert_eq!(
            e,
            [
                (0, Some("a"), Some(2)),
                (1, Some("b"), Some(3)),
                (2, Some("c"), None)
            ]
        );
        let kinds: Vec<_> = x.events.iter().map(|e| e.event).collect();
        assert_eq!(kinds, [EventKind::Fence, EventKind::Fence]);
        // The same identity again is no new epoch.
        h.epoch("x", 7, 2, 4, "init", Some(&c));
        assert_eq!(h.get("x").unwrap().epochs.len(), 3);
    }

    #[test]
    fn refusals_fold_and_never_push_a_fence_out() {
        let mut h = TxnHistory::new(0);
        h.fence("x", fence(1, 0, None, FenceCause::Timeout));
        for t in 0..1000 {
            h.event(
                "x",
                Event::new(10 + t, EventKind::RejectedWrite, 7, 0).detail("t-0"),
            );
        }
        let x = h.get("x").unwrap();
        assert_eq!(x.events.len(), 2);
        assert_eq!((x.events[1].count, x.events[1].last_time_ms), (1000, 1009));
        assert_eq!(x.events[0].event, EventKind::Fence);
        assert_eq!(x.events[0].cause, Some(FenceCause::Timeout));
    }

    #[test]
    fn bounded_per_id_and_in_ids() {
        let mut h = TxnHistory::with_capacity(0, 3);
        for t in 0..100 {
            h.event("x", Event::new(t, EventKind::Commit, 7, 0));
            h.fence("x", fence(t, 0, None, FenceCause::Administrator));
        }
        let x = h.get("x").unwrap();
        assert_eq!(x.events.len(), MAX_EVENTS);
        assert_eq!(x.fences.len(), MAX_FENCES);
        assert_eq!(x.events_dropped, 200 - MAX_EVENTS as u64);
        assert_eq!(x.fences_dropped, 100 - MAX_FENCES as u64);
        for id in ["a", "b", "c"] {
            h.event(id, Event::new(1, EventKind::Init, 1, 0));
        }
        assert_eq!(h.len(), 3);
        assert!(h.get("x").is_none(), "the least recently touched id goes");
        // An unknown id's refusal does not evict anyone.
        h.event_if_known("zzz", Event::new(1, EventKind::RejectedWrite, 1, 0));
        assert!(h.get("zzz").is_none() && h.get("a").is_some());
        assert_eq!(h.to_json("nope")["tracked"], false);
        assert_eq!(h.to_json("a")["events"][0]["event"], "init");
    }
}
