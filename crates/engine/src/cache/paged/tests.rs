//! Block accounting tests of the paged cache: sharing, copy-on-write, eviction, and no leak after
//! 10,000 random operations.
use super::alloc::{AllocError, BlockAllocator};

fn toks(n: usize, salt: u32) -> Vec<u32> {
    (0..n as u32).map(|i| i * 7 + salt).collect()
}

#[test]
fn identical_prefixes_share_full_blocks() {
    let mut a = BlockAllocator::new(4, 100);
    let p = toks(10, 0);
    let (s1, reused) = a.allocate(&p);
    assert_eq!(reused, 0);
    a.extend(s1, 10).unwrap();
    assert_eq!(a.used_blocks(), 3);
    // Same prompt: the two full blocks are shared; one token at least is left to compute.
    let (s2, reused) = a.allocate(&p);
    assert_eq!(reused, 8);
    assert_eq!(a.block_table(s2).unwrap(), &a.block_table(s1).unwrap()[..2]);
    a.extend(s2, 2).unwrap();
    assert_eq!(a.used_blocks(), 4);
    // A prompt of exactly two blocks reuses only the first (the last token must be computed).
    let (s3, reused) = a.allocate(&p[..8]);
    assert_eq!(reused, 4);
    a.check().unwrap();
    for s in [s1, s2, s3] {
        a.free(s).unwrap();
    }
    a.check().unwrap();
    assert_eq!(a.used_blocks(), 0);
    assert_eq!(a.cached_blocks(), 2, "the full prompt blocks stay cached");
    let (s4, reused) = a.allocate(&p);
    assert_eq!(reused, 8, "a cached prefix is reused after its sequences ended");
    a.free(s4).unwrap();
    a.clear_cached();
    assert_eq!(a.cached_blocks(), 0);
    a.check().unwrap();
}

#[test]
fn fork_copies_the_shared_partial_block_on_write() {
    let mut a = BlockAllocator::new(4, 100);
    let (s1, _) = a.allocate(&toks(6, 1));
    a.extend(s1, 6).unwrap();
    let s2 = a.fork(s1).unwrap();
    assert_eq!(a.used_blocks(), 2);
    let copies = a.extend(s2, 1).unwrap();
    let t1 = a.block_table(s1).unwrap().to_vec();
    let t2 = a.block_table(s2).unwrap().to_vec();
    assert_eq!(copies, vec![(t1[1], t2[1])]);
    assert_eq!(t1[0], t2[0], "the full block stays shared");
    assert_ne!(t1[1], t2[1]);
    // The original writes its own partial block without a copy now.
    assert!(a.extend(s1, 1).unwrap().is_empty());
    a.check().unwrap();
}

#[test]
fn unreferenced_prefixes_are_evicted_least_recently_used_first() {
    let mut a = BlockAllocator::new(2, 4);
    let (s1, _) = a.allocate(&toks(4, 10));
    a.extend(s1, 4).unwrap();
    a.free(s1).unwrap();
    let (s2, _) = a.allocate(&toks(4, 20));
    a.extend(s2, 4).unwrap();
    a.free(s2).unwrap();
    assert_eq!(a.cached_blocks(), 4);
    // Two new blocks evict the oldest cached ones (s1's prefix).
    let (s3, _) = a.allocate(&toks(4, 30));
    a.extend(s3, 4).unwrap();
    assert_eq!(a.allocate(&toks(5, 10)).1, 0, "s1's prefix was evicted");
    let (s5, reused) = a.allocate(&toks(5, 20));
    assert_eq!(reused, 4, "s2's prefix is still cached");
    // Everything referenced: no room.
    assert_eq!(a.extend(s5, 2), Err(AllocError::OutOfBlocks));
    a.check().unwrap();
}

#[test]
fn truncate_then_write_into_a_cached_block_unregisters_or_copies_it() {
    let mut a = BlockAllocator::new(4, 100);
    let p = toks(9, 3);
    let (s1, _) = a.allocate(&p);
    a.extend(s1, 9).unwrap();
    let (s2, reused) = a.allocate(&p);
    assert_eq!(reused, 8);
    a.truncate(s1, 6).unwrap();
    let copies = a.extend(s1, 1).unwrap();
    assert_eq!(copies.len(), 1, "block 2 is shared with s2: copied before the write");
    a.free(s2).unwrap();
    a.truncate(s1, 2).unwrap();
    assert!(a.extend(s1, 1).unwrap().is_empty());
    a.check().unwrap();
}

#[test]
fn ten_thousand_random_operations_leave_the_pool_empty() {
    let mut rng = 0x2545_f491_4f6c_dd1du64;
    let mut next = |n: usize| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        (rng % n as u64) as usize
    };
    let mut a = BlockAllocator::new(4, 64);
    let prompts: Vec<Vec<u32>> = (0..6).map(|i| toks(5 + 6 * i, (i % 3) as u32)).collect();
    let mut live: Vec<usize> = Vec::new();
    for _ in 0..10_000 {
        match next(5) {
            0 if live.len() < 12 => {
                let (s, reused) = a.allocate(&prompts[next(prompts.len())]);
                let len = a.seq_len(s).unwrap();
                assert_eq!(len, reused);
                live.push(s);
            }
            1 if !live.is_empty() => {
                let s = live[next(live.len())];
                match a.extend(s, 1 + next(9)) {
                    Ok(_) | Err(AllocError::OutOfBlocks) => {}
                    Err(e) => panic!("{e}"),
                }
            }
            2 if !live.is_empty() && live.len() < 12 => {
                let s = live[next(live.len())];
                live.push(a.fork(s).unwrap());
            }
            3 if !live.is_empty() => {
                let s = live.swap_remove(next(live.len()));
                a.free(s).unwrap();
            }
            4 if !live.is_empty() => {
                let s = live[next(live.len())];
                let len = a.seq_len(s).unwrap();
                a.truncate(s, next(len + 1)).unwrap();
            }
            _ => {}
        }
        a.check().unwrap();
    }
    for s in live {
        a.free(s).unwrap();
    }
    a.check().unwrap();
    assert_eq!(a.used_blocks(), 0);
    assert_eq!(a.num_sequences(), 0);
    a.clear_cached();
    assert_eq!(a.cached_blocks(), 0);
    a.check().unwrap();
}
