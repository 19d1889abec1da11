//! Executions, tested without a sandbox.

use super::*;

fn execs(max_execs: u64, ttl_ms: u64) -> Execs {
    let limits = Limits {
        max_execs,
        reservation_ttl_ms: ttl_ms,
        ..Limits::default()
    };
    Execs::new(limits, std::env::temp_dir(), Arc::new(Reaper::default()))
}

#[test]
fn reservations_are_bounded_by_max_execs() {
    let e = execs(2, 60_000);
    e.reserve(None).unwrap();
    e.reserve(None).unwrap();
    let err = e.reserve(None).unwrap_err();
    assert_eq!(err.kind(), Kind::LimitExceeded);
    assert_eq!(err.limit_name, namzu_proto::limits::MAX_EXECS);
    assert_eq!(err.limit, 2);
}

#[test]
fn unused_reservations_expire() {
    let e = execs(1, 0);
    e.reserve(None).unwrap();
    std::thread::sleep(Duration::from_millis(5));
    e.reserve(None).expect("the expired reservation was not released");
}

#[tokio::test]
async fn cancel_of_a_reservation_is_remembered_and_unknown_ids_are_typed() {
    let e = execs(4, 60_000);
    let (id, _) = e.reserve(None).unwrap();
    assert_eq!(e.cancel(&id).await.unwrap(), Outcome::NotStarted);
    assert_eq!(e.cancel(&id).await.unwrap(), Outcome::NotStarted);
    let err = e.cancel("x-nope").await.unwrap_err();
    assert_eq!(err.kind(), Kind::UnknownExec);
    // A name is reserved once; asking again answers the same reservation.
    assert_eq!(e.reserve(Some("job")).unwrap(), ("job".to_owned(), false));
    assert_eq!(e.reserve(Some("job")).unwrap(), ("job".to_owned(), false));
    let bad = e.reserve(Some("a/b")).unwrap_err();
    assert_eq!(bad.kind(), Kind::InvalidArgument);
    let err = e.cancel("x-nope").await.unwrap_err();
    assert_eq!(err.kind(), Kind::UnknownExec);
    assert_eq!(err.execution_id, "x-nope");
}

/// The live count moves with every change of a slot: a cancelled
/// reservation, a finished execution and an expired reservation each give
/// their place back, a re-reserved name takes one once, and finished
/// records kept take none.
#[test]
fn capacity_follows_every_slot_change() {
    let e = execs(2, 60_000);
    let (a, _) = e.reserve(None).unwrap();
    e.reserve(Some("job")).unwrap();
    e.reserve(Some("job")).unwrap();
    assert_eq!(e.reserve(None).unwrap_err().kind(), Kind::LimitExceeded);
    // Cancelled before it started: no longer live.
    {
        let mut t = e.table();
        t.slots.insert(a.clone(), Slot::CancelledBeforeStart);
    }
    let (b, _) = e.reserve(None).unwrap();
    assert_eq!(e.reserve(None).unwrap_err().kind(), Kind::LimitExceeded);
    e.finish(&a);
    e.finish(&b);
    e.finish("job");
    // Three finished records are kept, and two places are free.
    assert_eq!(e.table().slots.map.len(), 3);
    e.reserve(None).unwrap();
    e.reserve(None).unwrap();
    assert_eq!(e.reserve(None).unwrap_err().kind(), Kind::LimitExceeded);
}

#[test]
fn expired_reservations_give_their_places_back() {
    let e = execs(2, 1_000);
    e.reserve(None).unwrap();
    e.reserve(None).unwrap();
    assert_eq!(e.reserve(None).unwrap_err().kind(), Kind::LimitExceeded);
    std::thread::sleep(Duration::from_millis(1_100));
    // Both expire at the next reservation, which then takes one place.
    e.reserve(None).unwrap();
    e.reserve(None).unwrap();
    let t = e.table();
    assert_eq!((t.slots.live, t.slots.reserved), (2, 2));
}
