//! `spillway_sys::munge` against real `munged` daemons (each with its own key, started by
//! `spillway_harness::Munged`): a round trip, and each way munged refuses a credential.

use std::time::Duration;

use spillway_harness::Munged;
use spillway_sys::munge::{MungeContext, MungeError};

#[test]
fn a_credential_round_trips_with_the_encoders_uid_gid_and_payload() {
    let munged = Munged::started();
    let payload = b"spillway-auth-v2\0 and any bytes \xff\x00";
    let credential = munged.context().encode(payload).unwrap();
    assert!(credential.starts_with("MUNGE:"), "{credential}");
    let decoded = munged.context().decode(&credential).unwrap();
    assert_eq!(decoded.uid, spillway_sys::user::euid());
    assert_eq!(decoded.gid, spillway_sys::user::egid());
    assert_eq!(decoded.payload, payload);
    // An empty payload is a payload too.
    let empty = munged.context().decode(&munged.context().encode(b"").unwrap()).unwrap();
    assert!(empty.payload.is_empty());
}

#[test]
fn a_credential_of_another_key_is_invalid() {
    let (ours, theirs) = (Munged::started(), Munged::started());
    let forged = theirs.context().encode(b"let me in").unwrap();
    let error = ours.context().decode(&forged).unwrap_err();
    assert!(matches!(error, MungeError::Invalid { .. }), "{error:?}");
}

#[test]
fn garbage_is_invalid() {
    let munged = Munged::started();
    for garbage in ["", "hello", "MUNGE:AAAA:", "MUNGE:!!!!:"] {
        let error = munged.context().decode(garbage).unwrap_err();
        assert!(matches!(error, MungeError::Invalid { .. }), "{garbage:?}: {error:?}");
    }
}

#[test]
fn a_second_decode_is_a_replay() {
    let munged = Munged::started();
    let credential = munged.context().encode(b"once").unwrap();
    munged.context().decode(&credential).unwrap();
    let error = munged.context().decode(&credential).unwrap_err();
    assert!(matches!(error, MungeError::Replayed { .. }), "{error:?}");
}

#[test]
fn a_credential_past_its_ttl_is_expired() {
    let munged = Munged::started();
    let short_lived = munged.context().with_ttl(Duration::from_secs(1));
    let credential = short_lived.encode(b"soon stale").unwrap();
    std::thread::sleep(Duration::from_secs(2));
    let error = munged.context().decode(&credential).unwrap_err();
    assert!(matches!(error, MungeError::Expired { .. }), "{error:?}");
}

#[test]
fn a_stopped_munged_is_a_socket_error_naming_its_socket() {
    let munged = Munged::started();
    let context = munged.context();
    let socket = munged.socket().display().to_string();
    drop(munged);
    let error = context.encode(b"x").unwrap_err();
    let MungeError::SocketError { socket: named, message } = &error else { panic!("{error:?}") };
    assert_eq!(named, &socket);
    assert!(!message.is_empty());
    assert!(error.to_string().contains(&socket), "{error}");
    assert!(matches!(
        MungeContext::new().with_socket(context.socket().map(Into::into)).decode("MUNGE:x:"),
        Err(MungeError::SocketError { .. })
    ));
}
