//! Corpus replay on stable: every fuzz target's property over its committed corpus
//! (seeds and any crash ever found), so CI catches regressions without nightly.

use std::path::Path;

#[test]
fn every_fuzz_corpus_replays_clean() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus");
    let mut total = 0;
    for (name, check) in egress_gateway::fuzzing::TARGETS {
        let dir = root.join(name);
        let entries = std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        let mut n = 0;
        for entry in entries {
            let path = entry.unwrap().path();
            let data = std::fs::read(&path).unwrap();
            let outcome = std::panic::catch_unwind(|| check(&data));
            assert!(outcome.is_ok(), "{name}: {} fails its property", path.display());
            n += 1;
        }
        assert!(n > 0, "{name}: empty corpus");
        total += n;
    }
    assert!(total >= 8);
}
