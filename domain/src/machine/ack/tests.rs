use super::LeaseIndex;

#[test]
fn a_lease_index_answers_by_the_bytes_not_the_hash() {
    let mut m = LeaseIndex::with_capacity(4);
    for i in 0..1000u64 {
        m.add(&format!("txn-{i}"), 500 + i);
    }
    // Two ids under one hash, and one id stored twice (the later offset is the live one).
    m.add_hashed("a", 7, 1);
    m.add_hashed("b", 7, 2);
    m.add_hashed("c", 9, 3);
    m.add_hashed("c", 9, 4);
    m.seal();
    for i in (0..1000u64).step_by(37) {
        assert_eq!(m.get(&format!("txn-{i}")), Some(500 + i));
    }
    assert_eq!(m.get("txn-1000"), None);
    assert_eq!(m.get(""), None);
    assert_eq!(m.get_hashed("a", 7), Some(1));
    assert_eq!(m.get_hashed("b", 7), Some(2));
    assert_eq!(m.get_hashed("c", 9), Some(4));
    assert_eq!(m.get_hashed("d", 7), None);
}
