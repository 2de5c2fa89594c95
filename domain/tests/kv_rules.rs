//! The rules of the replicated KV store and locks: versions, TTLs, atomic batches, counters, locks.

mod common;
use common::*;

mod kv_rules {
    use super::*;
    use queen_domain::kv::{Expiry, KvOp, KvOutcome, KvResult, LockOp, LockResult, Num};

    fn kv(s: &mut Sim, ops: Vec<KvOp>) -> KvOutcome {
        match s.apply(Command::Kv(ops)) {
            Outcome::Kv(o) => o,
            o => panic!("{o:?}"),
        }
    }

    fn put(key: &str, v: &str, expect: Option<u64>, required: bool) -> KvOp {
        KvOp::Put {
            ns: "app".into(),
            key: key.into(),
            value: v.as_bytes().to_vec(),
            expiry: Expiry::Ttl(10),
            expect,
            required,
        }
    }

    fn get(key: &str) -> KvOp {
        KvOp::Get {
            ns: "app".into(),
            key: key.into(),
        }
    }

    fn applied(r: &KvResult) -> (bool, Option<String>, Option<u64>) {
        match r {
            KvResult::Write {
                applied,
                reason,
                current,
            } => (
                *applied,
                reason.clone(),
                current.as_ref().map(|c| c.version),
            ),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn versions_rise_and_compare_and_set_uses_them() {
        let mut s = Sim::new();
        let a = kv(&mut s, vec![put("k", "1", None, false)]);
        let (ok, _, v1) = applied(&a.results[0]);
        assert!(ok);
        let b = kv(&mut s, vec![put("k", "2", v1, false)]);
        let (ok, _, v2) = applied(&b.results[0]);
        assert!(ok && v2 > v1, "versions rise");
        let stale = kv(&mut s, vec![put("k", "3", v1, false)]);
        assert_eq!(
            applied(&stale.results[0]),
            (false, Some("version".into()), v2),
            "the loser sees the winner's version"
        );
        let absent = kv(&mut s, vec![put("k", "4", Some(0), false)]);
        assert_eq!(applied(&absent.results[0]).1.as_deref(), Some("exists"));
    }

    #[test]
    fn ttl_expiry_follows_stamps_and_expired_rows_never_exist() {
        let mut s = Sim::new();
        kv(&mut s, vec![put("t", "1", None, false)]);
        s.advance_secs(11);
        let r = kv(&mut s, vec![get("t"), put("t", "2", Some(0), false)]);
        assert_eq!(r.results[0], KvResult::Get(None));
        assert!(
            applied(&r.results[1]).0,
            "expect 0 wins over an expired row"
        );
        s.advance_secs(11);
        s.apply(Command::Tick);
        assert!(matches!(
            kv(&mut s, vec![get("t")]).results[0],
            KvResult::Get(None)
        ));
    }

    #[test]
    fn a_lost_required_precondition_rolls_back_the_whole_call() {
        let mut s = Sim::new();
        let r = kv(
            &mut s,
            vec![
                put("a", "1", None, false),
                KvOp::Check {
                    ns: "app".into(),
                    key: "zzz".into(),
                    expect: 5,
                    required: true,
                },
                put("b", "1", None, false),
            ],
        );
        assert_eq!(r.failed, Some(1));
        assert_eq!(r.results.len(), 3, "index-aligned, never shorter");
        assert_eq!(applied(&r.results[0]).1.as_deref(), Some("rolled_back"));
        assert_eq!(applied(&r.results[1]).1.as_deref(), Some("absent"));
        assert!(matches!(
            kv(&mut s, vec![get("a")]).results[0],
            KvResult::Get(None)
        ));
        // Without `required` the same failure keeps the other writes.
        let r = kv(
            &mut s,
            vec![
                put("a", "1", None, false),
                KvOp::Check {
                    ns: "app".into(),
                    key: "zzz".into(),
                    expect: 5,
                    required: false,
                },
            ],
        );
        assert_eq!(r.failed, None);
        assert!(matches!(
            &kv(&mut s, vec![get("a")]).results[0],
            KvResult::Get(Some(_))
        ));
    }

    #[test]
    fn incr_counts_from_zero_refuses_out_of_bounds_and_wrong_types() {
        let mut s = Sim::new();
        let incr = |d: i64, max: Option<f64>| KvOp::Incr {
            ns: "app".into(),
            key: "n".into(),
            delta: Num::Int(d),
            min: None,
            max,
            expiry: Expiry::Forever,
            required: false,
        };
        kv(&mut s, vec![incr(2, None)]);
        let r = kv(&mut s, vec![incr(3, None)]);
        let KvResult::Write {
            current: Some(row), ..
        } = &r.results[0]
        else {
            panic!()
        };
        assert_eq!(row.value, b"5");
        assert_eq!(
            applied(&kv(&mut s, vec![incr(1, Some(5.0))]).results[0])
                .1
                .as_deref(),
            Some("limit")
        );
        kv(&mut s, vec![put("n", "\"text\"", None, false)]);
        assert_eq!(
            applied(&kv(&mut s, vec![incr(1, None)]).results[0])
                .1
                .as_deref(),
            Some("type")
        );
    }

    fn incr_op(delta: Num, min: Option<f64>, max: Option<f64>) -> KvOp {
        KvOp::Incr {
            ns: "app".into(),
            key: "c".into(),
            delta,
            min,
            max,
            expiry: Expiry::Forever,
            required: false,
        }
    }

    /// The row's text after an incr, or `refused: <reason>`.
    fn incr_text(s: &mut Sim, op: KvOp) -> String {
        match &kv(s, vec![op]).results[0] {
            KvResult::Write {
                applied: true,
                current: Some(row),
                ..
            } => String::from_utf8_lossy(&row.value).into_owned(),
            KvResult::Write {
                applied: false,
                reason,
                ..
            } => format!("refused: {}", reason.clone().unwrap_or_default()),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn incr_is_exact_for_integers_and_refuses_overflow() {
        let mut s = Sim::new();
        kv(&mut s, vec![put("c", "9007199254740992", None, false)]);
        assert_eq!(
            incr_text(&mut s, incr_op(Num::Int(1), None, None)),
            "9007199254740993",
            "2^53 + 1 is kept"
        );
        kv(&mut s, vec![put("c", "9223372036854775806", None, false)]);
        assert_eq!(
            incr_text(&mut s, incr_op(Num::Int(1), None, None)),
            "9223372036854775807"
        );
        assert_eq!(
            incr_text(&mut s, incr_op(Num::Int(1), None, None)),
            "refused: overflow",
            "i64::MAX + 1 is not applied"
        );
        kv(&mut s, vec![put("c", "-9223372036854775808", None, false)]);
        assert_eq!(
            incr_text(&mut s, incr_op(Num::Int(-1), None, None)),
            "refused: overflow"
        );
        kv(&mut s, vec![put("c", "18446744073709551616", None, false)]);
        assert_eq!(
            incr_text(&mut s, incr_op(Num::Int(1), None, None)),
            "refused: overflow",
            "a stored integer outside i64"
        );
        kv(&mut s, vec![put("c", "-0", None, false)]);
        assert_eq!(incr_text(&mut s, incr_op(Num::Int(1), None, None)), "1");
    }

    #[test]
    fn incr_uses_floats_only_for_fractions_and_refuses_infinity() {
        let mut s = Sim::new();
        kv(&mut s, vec![put("c", "1e308", None, false)]);
        assert_eq!(
            incr_text(&mut s, incr_op(Num::Float(1e308), None, None)),
            "refused: overflow",
            "1e308 + 1e308"
        );
        kv(&mut s, vec![put("c", "1e400", None, false)]);
        assert_eq!(
            incr_text(&mut s, incr_op(Num::Int(1), None, None)),
            "refused: overflow",
            "a stored 1e400 is infinite"
        );
        kv(&mut s, vec![put("c", "42.00", None, false)]);
        assert_eq!(incr_text(&mut s, incr_op(Num::Int(1), None, None)), "43.0");
        kv(&mut s, vec![put("c", "2", None, false)]);
        assert_eq!(
            incr_text(&mut s, incr_op(Num::Float(0.5), None, None)),
            "2.5"
        );
        kv(&mut s, vec![put("c", "true", None, false)]);
        assert_eq!(
            incr_text(&mut s, incr_op(Num::Int(1), None, None)),
            "refused: type"
        );
    }

    #[test]
    fn incr_limits_compare_integers_exactly() {
        let mut s = Sim::new();
        kv(&mut s, vec![put("c", "9007199254740992", None, false)]);
        // 2^53 + 1 is above the float 2^53 although it rounds to it.
        assert_eq!(
            incr_text(
                &mut s,
                incr_op(Num::Int(1), None, Some(9_007_199_254_740_992.0))
            ),
            "refused: limit"
        );
        assert_eq!(
            incr_text(
                &mut s,
                incr_op(Num::Int(0), None, Some(9_007_199_254_740_992.0))
            ),
            "9007199254740992"
        );
        assert_eq!(
            incr_text(&mut s, incr_op(Num::Int(1), None, Some(9.3e18))),
            "9007199254740993"
        );
        kv(&mut s, vec![put("c", "4503599627370495", None, false)]);
        assert_eq!(
            incr_text(
                &mut s,
                incr_op(Num::Int(0), Some(4_503_599_627_370_495.5), None)
            ),
            "refused: limit"
        );
        assert_eq!(
            incr_text(
                &mut s,
                incr_op(Num::Int(0), None, Some(4_503_599_627_370_494.5))
            ),
            "refused: limit"
        );
        assert_eq!(
            incr_text(
                &mut s,
                incr_op(Num::Int(1), None, Some(4_503_599_627_370_496.5))
            ),
            "4503599627370496"
        );
        assert_eq!(
            incr_text(&mut s, incr_op(Num::Int(1), Some(-1e300), Some(1e300))),
            "4503599627370497"
        );
    }

    #[test]
    fn locks_are_exclusive_renewals_move_the_token_and_release_needs_it() {
        let mut s = Sim::new();
        let locks = |s: &mut Sim, ops: Vec<LockOp>| match s.apply(Command::Locks(ops)) {
            Outcome::Locks(r) => r,
            o => panic!("{o:?}"),
        };
        let acq = |owner: &str| LockOp::Acquire {
            name: "job".into(),
            ttl: 5,
            owner: owner.into(),
            limit: 1,
        };
        let r = locks(&mut s, vec![acq("me")]);
        let LockResult::Acquired {
            token,
            already: false,
            slot: 0,
            ..
        } = r[0].clone()
        else {
            panic!("{r:?}")
        };
        assert!(
            matches!(
                &locks(&mut s, vec![acq("me")])[0],
                LockResult::Acquired { already: true, .. }
            ),
            "a resend is safe"
        );
        assert!(
            matches!(&locks(&mut s, vec![acq("you")])[0], LockResult::NotAcquired { reason, .. } if reason == "held")
        );
        let r = locks(
            &mut s,
            vec![LockOp::Renew {
                name: "job".into(),
                token,
                ttl: 5,
                slot: 0,
            }],
        );
        let LockResult::Renewed { token: t2, .. } = r[0].clone() else {
            panic!("{r:?}")
        };
        assert!(t2 > token);
        assert_eq!(
            locks(
                &mut s,
                vec![LockOp::Release {
                    name: "job".into(),
                    token,
                    slot: 0
                }]
            )[0],
            LockResult::Released(false)
        );
        assert_eq!(
            locks(
                &mut s,
                vec![LockOp::Release {
                    name: "job".into(),
                    token: t2,
                    slot: 0
                }]
            )[0],
            LockResult::Released(true)
        );
        assert!(matches!(
            &locks(&mut s, vec![acq("you")])[0],
            LockResult::Acquired { .. }
        ));
        // An expired permit frees the lock.
        s.advance_secs(6);
        assert!(matches!(
            &locks(&mut s, vec![acq("me")])[0],
            LockResult::Acquired { already: false, .. }
        ));
    }
}
