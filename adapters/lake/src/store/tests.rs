use std::sync::Mutex;

use super::s3::{retryable, virtual_hosted_endpoint};
use super::*;

const SECRET: &str = "wJalrXUtnFEMI-K7MDENG-bPxRfiCYEXAMPLEKEY";

fn s3_target(endpoint: Option<&str>) -> S3Target {
    S3Target {
        endpoint: endpoint.map(str::to_owned),
        region: "us-east-1".into(),
        path_style: true,
        bucket: "lake".into(),
        access_key: "testkey".into(),
        secret_key: Secret::new(SECRET),
        sse: Some(Sse::Kms {
            key_id: Some("arn:aws:kms:eu-central-1:1:key/abc".into()),
        }),
        addresses: AddressPolicy::Any,
    }
}

type Calls = Arc<Mutex<Vec<(&'static str, u16)>>>;

fn recording(lake: Lake) -> (Lake, Calls) {
    let calls: Calls = Arc::default();
    let sink = Arc::clone(&calls);
    let lake = lake.with_observer(Arc::new(move |op, status| {
        if let Ok(mut calls) = sink.lock() {
            calls.push((op, status));
        }
    }));
    (lake, calls)
}

fn taken(calls: &Calls) -> Vec<(&'static str, u16)> {
    calls
        .lock()
        .map(|mut c| std::mem::take(&mut *c))
        .unwrap_or_default()
}

fn big(len: usize, seed: u8) -> Bytes {
    Bytes::from(
        (0..len)
            .map(|i| (i % 251) as u8 ^ seed)
            .collect::<Vec<u8>>(),
    )
}

async fn create_identical_different(lake: &Lake, key: &str, calls: &Calls) {
    let a = Bytes::from_static(b"{\"partition\":\"p\",\"offset\":0}\n");
    let b = Bytes::from_static(b"{\"partition\":\"p\",\"offset\":1}\n");
    assert_eq!(
        lake.put_create(key, a.clone()).await.unwrap(),
        PutOutcome::Created
    );
    assert_eq!(taken(calls), vec![("put", 200)]);
    assert_eq!(
        lake.put_create(key, a.clone()).await.unwrap(),
        PutOutcome::Identical
    );
    assert_eq!(taken(calls), vec![("put", 412), ("get", 200)]);
    assert_eq!(
        lake.put_create(key, b).await.unwrap(),
        PutOutcome::Different {
            existing_sha256: sha256_hex(&a)
        }
    );
    assert_eq!(
        lake.get(key).await.unwrap(),
        Some(a.clone()),
        "a different put never replaces the object"
    );
    taken(calls);
    assert_eq!(lake.get("queen/none/here.json").await.unwrap(), None);
    assert_eq!(taken(calls), vec![("get", 404)]);
    let listed = lake.list("queen").await.unwrap();
    assert_eq!(listed, vec![(key.to_owned(), a.len() as u64)]);
    assert_eq!(taken(calls), vec![("list", 200)]);
    lake.probe("queen").await.unwrap();
}

const KEY: &str = "queen/tenant=t%2F1/queue=orders/dt=2026-10-03/hour=06/w-0000000001-1-2.jsonl";

#[tokio::test]
async fn memory_put_create_tells_created_identical_and_different() {
    let (lake, calls) = recording(Lake::open(&LakeTarget::Memory).unwrap());
    assert!(lake.supports_create_only());
    assert_eq!(lake.describe(), "memory");
    create_identical_different(&lake, KEY, &calls).await;
    // Clones share the store; a new open is a new empty lake.
    assert!(lake.clone().get(KEY).await.unwrap().is_some());
    assert!(
        Lake::open(&LakeTarget::Memory)
            .unwrap()
            .get(KEY)
            .await
            .unwrap()
            .is_none()
    );
}

#[tokio::test]
async fn local_put_create_tells_created_identical_and_different() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("lake").join("nested");
    let (lake, calls) = recording(Lake::open(&LakeTarget::Local(root.clone())).unwrap());
    assert!(root.is_dir(), "the folder is created");
    create_identical_different(&lake, KEY, &calls).await;
    assert!(lake.describe().starts_with("local dir="));
}

#[tokio::test]
async fn large_objects_go_up_in_parts_and_compare_like_small_ones() {
    let dir = tempfile::tempdir().unwrap();
    let (lake, calls) = recording(Lake::open(&LakeTarget::Local(dir.path().to_owned())).unwrap());
    let key = "queen/tenant=t/queue=q/dt=2026-10-03/hour=06/w-0000000001-1-2.parquet";
    let len = MULTIPART_THRESHOLD_BYTES + MULTIPART_PART_BYTES / 2 + 3; // 3 parts: 8 + 8 + 4 MiB
    let a = big(len, 0);
    assert_eq!(
        lake.put_create(key, a.clone()).await.unwrap(),
        PutOutcome::Created
    );
    let seen = taken(&calls);
    assert_eq!(seen.first(), Some(&("head", 404)));
    assert_eq!(
        seen.iter().filter(|c| **c == ("multipart", 200)).count(),
        1 + 3 + 1,
        "{seen:?}"
    );
    assert_eq!(lake.get(key).await.unwrap().as_deref(), Some(&a[..]));
    assert_eq!(
        lake.put_create(key, a.clone()).await.unwrap(),
        PutOutcome::Identical
    );
    let b = big(len, 1);
    assert_eq!(
        lake.put_create(key, b).await.unwrap(),
        PutOutcome::Different {
            existing_sha256: sha256_hex(&a)
        }
    );
    assert_eq!(lake.get(key).await.unwrap().as_deref(), Some(&a[..]));
    let listed = lake.list("queen").await.unwrap();
    assert_eq!(
        listed,
        vec![(key.to_owned(), len as u64)],
        "no part files left behind"
    );
}

#[test]
fn the_secret_never_prints() {
    let secret = Secret::new(SECRET);
    assert_eq!(format!("{secret}"), "***");
    assert_eq!(format!("{secret:?}"), "***");
    let target = LakeTarget::S3(s3_target(Some("http://127.0.0.1:9")));
    let debug = format!("{target:?} {target:#?}");
    assert!(!debug.contains(SECRET) && debug.contains("***"), "{debug}");
    let lake = Lake::open(&target).unwrap();
    let shown = format!("{} {lake:?}", lake.describe());
    assert!(
        !shown.contains(SECRET) && !shown.contains("testkey"),
        "{shown}"
    );
    assert!(
        shown.contains("bucket=lake") && shown.contains("http://127.0.0.1:9"),
        "{shown}"
    );
}

#[test]
fn bad_targets_are_refused_without_echoing_secrets() {
    let with = |f: &dyn Fn(&mut S3Target)| {
        let mut t = s3_target(Some("http://127.0.0.1:9"));
        f(&mut t);
        Lake::open(&LakeTarget::S3(t))
            .map(|_| ())
            .map_err(|e| e.to_string())
    };
    for case in [
        with(&|t| t.bucket = String::new()),
        with(&|t| t.secret_key = Secret::new("")),
        with(&|t| t.endpoint = Some("127.0.0.1:9".into())),
        with(&|t| t.endpoint = Some(format!("http://testkey:{SECRET}@127.0.0.1:9"))),
    ] {
        let text = case.unwrap_err();
        assert!(
            text.starts_with("invalid lake target: ") && !text.contains(SECRET),
            "{text}"
        );
    }
    assert!(with(&|t| t.endpoint = None).is_ok());
    assert!(with(&|t| t.sse = Some(Sse::Aes256)).is_ok());
    assert!(with(&|t| t.sse = Some(Sse::Kms { key_id: None })).is_ok());
}

#[tokio::test]
async fn a_failing_probe_says_what_to_check_and_hides_the_secret() {
    // Port 9 (discard) is closed on loopback: connection refused, retried, then reported.
    let lake = Lake::open(&LakeTarget::S3(s3_target(Some("http://127.0.0.1:9")))).unwrap();
    let (lake, calls) = recording(lake);
    let e = lake.probe("queen").await.unwrap_err();
    let text = format!("{e} {e:?}");
    assert!(!text.contains(SECRET), "{text}");
    assert!(text.contains("check the endpoint URL"), "{text}");
    assert!(e.retryable());
    assert_eq!(taken(&calls), vec![("list", 0)]);
    let put = lake
        .put_create("queen/x.json", Bytes::from_static(b"{}"))
        .await
        .unwrap_err();
    let text = format!("{put} {put:?}");
    assert!(!text.contains(SECRET), "{text}");
    assert!(matches!(
        put,
        LakeError::Store {
            operation: "put",
            ..
        }
    ));
}

/// A public-only lake never connects to a name that resolves to loopback: the resolver refuses
/// it at connection time and the probe says so with a class, not the peer's words.
#[tokio::test]
async fn a_public_only_lake_refuses_a_name_that_resolves_to_loopback() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let mut t = s3_target(Some(&format!("http://localhost:{port}")));
    t.addresses = AddressPolicy::PublicOnly;
    let e = Lake::open(&LakeTarget::S3(t))
        .unwrap()
        .probe("queen")
        .await
        .unwrap_err();
    assert_eq!(
        e.failure().map(|f| f.reason),
        Some(crate::FailureReason::RefusedAddress),
        "{e}"
    );
    assert!(!e.retryable() || matches!(e, LakeError::Probe { .. }));
    assert!(listener.accept().is_err(), "the lake connected");
    let mut literal = s3_target(Some(&format!("http://127.0.0.1:{port}")));
    literal.addresses = AddressPolicy::PublicOnly;
    assert!(Lake::open(&LakeTarget::S3(literal)).is_err());
}

#[test]
fn sse_parses_the_documented_forms() {
    assert_eq!("AES256".parse::<Sse>().unwrap(), Sse::Aes256);
    assert_eq!("aws:kms".parse::<Sse>().unwrap(), Sse::Kms { key_id: None });
    let arn = "aws:kms:arn:aws:kms:eu-central-1:111:key/abc";
    assert_eq!(
        arn.parse::<Sse>().unwrap(),
        Sse::Kms {
            key_id: Some("arn:aws:kms:eu-central-1:111:key/abc".into())
        }
    );
    assert_eq!(arn.parse::<Sse>().unwrap().to_string(), arn);
    assert!("aws:kms:".parse::<Sse>().is_err());
    assert!("sse-c".parse::<Sse>().is_err());
}

#[test]
fn virtual_hosted_endpoints_get_the_bucket_in_the_host() {
    assert_eq!(
        virtual_hosted_endpoint("https://s3.eu-central-1.amazonaws.com", "acme"),
        "https://acme.s3.eu-central-1.amazonaws.com"
    );
    assert_eq!(
        virtual_hosted_endpoint("https://acme.example.com", "acme"),
        "https://acme.example.com"
    );
}

#[test]
fn statuses_come_from_the_error() {
    let err =
        |source: &str| -> Box<dyn std::error::Error + Send + Sync> { source.to_owned().into() };
    let generic = |text: &str| object_store::Error::Generic {
        store: "S3",
        source: err(text),
    };
    assert_eq!(
        status_of(&object_store::Error::NotFound {
            path: "k".into(),
            source: err("x")
        }),
        404
    );
    assert_eq!(
        status_of(&object_store::Error::AlreadyExists {
            path: "k".into(),
            source: err("x")
        }),
        412
    );
    assert_eq!(
        status_of(&generic(
            "Error performing PUT in 1ms - Server returned non-2xx status code: 503 Service Unavailable: "
        )),
        503
    );
    assert_eq!(
        status_of(&generic("error sending request: connection refused")),
        0
    );
    assert!(retryable(&generic(
        "status code: 500 Internal Server Error"
    )));
    assert!(!retryable(&generic("status code: 400 Bad Request")));
    assert!(retryable(&generic("status code: 429 Too Many Requests")));
}

#[tokio::test]
async fn keys_that_are_not_object_paths_are_refused() {
    let lake = Lake::open(&LakeTarget::Memory).unwrap();
    for key in ["a//b", "a/../b", "a/\u{7}"] {
        assert!(
            matches!(lake.get(key).await, Err(LakeError::InvalidKey { .. })),
            "{key}"
        );
    }
}

/// Against a real S3 API when the CI recipe exported one (moto: `S3_ENDPOINT`, `S3_BUCKET`,
/// `S3_REGION`, `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`); skipped otherwise. Covers what
/// memory and local folders hide: 412 on create-only puts, the 5 MiB part minimum, a missing
/// bucket failing the probe.
#[tokio::test]
#[allow(
    clippy::disallowed_methods,
    reason = "a test: the CI recipe's S3 server, when there is one"
)]
async fn s3_when_a_server_is_configured() {
    let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    let (Some(endpoint), Some(bucket)) = (var("S3_ENDPOINT"), var("S3_BUCKET")) else {
        eprintln!("skipped: S3_ENDPOINT and S3_BUCKET are not set");
        return;
    };
    let target = |bucket: String| S3Target {
        endpoint: Some(endpoint.clone()),
        region: var("S3_REGION").unwrap_or_else(|| "us-east-1".into()),
        path_style: true,
        bucket,
        access_key: var("AWS_ACCESS_KEY_ID").unwrap_or_else(|| "testkey".into()),
        secret_key: Secret::new(
            var("AWS_SECRET_ACCESS_KEY").unwrap_or_else(|| "testsecret".into()),
        ),
        sse: Some(Sse::Aes256),
        addresses: AddressPolicy::Any,
    };
    let (lake, calls) = recording(Lake::open(&LakeTarget::S3(target(bucket))).unwrap());
    lake.probe("queen").await.unwrap();
    let run = format!("{}", std::process::id());
    let key = format!(
        "lake-test-{run}/tenant=t/queue=q%2Fx/dt=2026-10-03/hour=06/w-0000000001-1-2.jsonl"
    );
    taken(&calls);
    create_small_on_s3(&lake, &key, &calls).await;
    let big_key = format!("lake-test-{run}/big.parquet");
    let a = big(MULTIPART_THRESHOLD_BYTES + 1, 0);
    assert_eq!(
        lake.put_create(&big_key, a.clone()).await.unwrap(),
        PutOutcome::Created
    );
    assert_eq!(lake.get(&big_key).await.unwrap().as_deref(), Some(&a[..]));
    assert_eq!(
        lake.put_create(&big_key, a.clone()).await.unwrap(),
        PutOutcome::Identical
    );
    let listed = lake.list(&format!("lake-test-{run}")).await.unwrap();
    assert_eq!(listed.len(), 2, "{listed:?}");
    let missing = Lake::open(&LakeTarget::S3(target(format!("no-such-bucket-{run}")))).unwrap();
    let e = missing.probe("queen").await.unwrap_err();
    assert!(e.to_string().contains("bucket exists"), "{e}");
}

async fn create_small_on_s3(lake: &Lake, key: &str, calls: &Calls) {
    let a = Bytes::from_static(b"{\"a\":1}\n");
    assert_eq!(
        lake.put_create(key, a.clone()).await.unwrap(),
        PutOutcome::Created
    );
    assert_eq!(
        lake.put_create(key, a.clone()).await.unwrap(),
        PutOutcome::Identical
    );
    assert_eq!(
        lake.put_create(key, Bytes::from_static(b"{\"a\":2}\n"))
            .await
            .unwrap(),
        PutOutcome::Different {
            existing_sha256: sha256_hex(&a)
        }
    );
    assert_eq!(
        taken(calls),
        vec![
            ("put", 200),
            ("put", 412),
            ("get", 200),
            ("put", 412),
            ("get", 200)
        ]
    );
    assert_eq!(lake.get(key).await.unwrap(), Some(a));
}
