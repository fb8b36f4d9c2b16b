//! Block accounting tests of the paged cache: sharing, copy-on-write, eviction, no sharing between
//! different prompts whose hashes collide, and no leak after 10,000 random operations; and the rotating window as a ring of blocks: the same keys, values
//! and masks as the rotating cache, a fixed set of blocks once the window is full, none left after.
use super::alloc::{AllocError, BlockAllocator};
use super::PagedPool;
use crate::cache::{CacheMask, KvCache, RotatingCache};
use mlx::Array;

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

/// Every block hashes alike: a block is found by its hash but shared only when its tokens and the
/// blocks before it are the prompt's own.
#[test]
fn colliding_hashes_never_share_different_tokens() {
    let mut a = BlockAllocator::with_hash(4, 100, |_, _| 7);
    let p = toks(9, 0);
    let (s1, _) = a.allocate(&p);
    a.extend(s1, 9).unwrap();
    a.free(s1).unwrap();
    let (s2, reused) = a.allocate(&toks(9, 1));
    assert_eq!(reused, 0, "another prompt with the same hashes takes none of the cached blocks");
    a.free(s2).unwrap();
    let (s3, reused) = a.allocate(&p);
    assert_eq!(reused, 4, "the prompt itself still finds its first block (the second collided and was never registered)");
    a.free(s3).unwrap();
    a.check().unwrap();
}

/// A hash blind to the blocks before (so only the parent check can tell): after a prompt's first
/// block was evicted and reused for other tokens, its old second block no longer matches, though
/// its own tokens and hash still do.
#[test]
fn a_block_whose_parent_was_reused_is_not_shared() {
    let mut a = BlockAllocator::with_hash(2, 2, |_, t| t.iter().map(|&x| u64::from(x)).sum());
    let (s1, _) = a.allocate(&[1, 2, 3, 4]);
    a.extend(s1, 4).unwrap();
    a.free(s1).unwrap();
    // Evicts the oldest cached block ([1, 2]) and registers [7, 8] in it.
    let (s2, _) = a.allocate(&[7, 8]);
    a.extend(s2, 2).unwrap();
    a.free(s2).unwrap();
    let (s3, reused) = a.allocate(&[7, 8, 3, 4, 9]);
    assert_eq!(reused, 2, "[3, 4] was computed after [1, 2], not after [7, 8]");
    a.free(s3).unwrap();
    a.check().unwrap();
}

/// Through the pool: keys and values stored for one prompt are never handed to another whose
/// block hashes are forced equal.
#[test]
fn the_pool_keeps_colliding_prompts_apart() {
    let pool = PagedPool::with_hash(1, 4, 1 << 20, |_, _| 0);
    let (k, v) = kv_at(0, 9);
    pool.store(&toks(9, 0), &[(k, v)]).unwrap();
    let (n, kv) = pool.lookup(&toks(9, 5)).unwrap();
    assert_eq!((n, kv.len()), (0, 0));
    let (n, kv) = pool.lookup(&toks(9, 0)).unwrap();
    assert_eq!(n, 4);
    assert_eq!(kv[0].0.to_vec::<f32>().unwrap(), kv_at(0, 4).0.to_vec::<f32>().unwrap());
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

/// Keys (1, 2, n, 3) whose every element names its position (and the values, negated), so that any
/// reordering or stale slot shows.
fn kv_at(start: i32, n: i32) -> (Array, Array) {
    let data: Vec<f32> = (0..2).flat_map(|h| (start..start + n).flat_map(move |p| (0..3).map(move |d| (p * 100 + h * 10 + d) as f32))).collect();
    let k = Array::from_slice(&data, &[1, 2, n, 3]).unwrap();
    let v = k.neg().unwrap();
    (k, v)
}

fn mask_of(m: CacheMask) -> Option<(Vec<i32>, Vec<u8>)> {
    match m {
        CacheMask::None => None,
        CacheMask::Causal => Some((vec![], vec![])),
        CacheMask::Array(a) => Some((a.shape(), a.astype(mlx::Dtype::U8).unwrap().to_vec::<u8>().unwrap())),
    }
}

/// Runs `steps` random updates (mostly single positions, some chunks, some trims) through two
/// layers of rotating caches and of paged rings, checking equal outputs, masks and block accounting.
fn ring_matches_rotating(max_size: i32, keep: i32, block_size: usize, steps: usize, seed: u64) {
    let mut rng = seed;
    let mut next = |n: usize| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        (rng % n as u64) as usize
    };
    let pool = PagedPool::new(2, block_size, 1 << 30);
    let (mut ring, reused) = pool.new_windowed_sequence(&[1, 2, 3], &[Some((max_size, keep)); 2]).unwrap();
    assert_eq!(reused, 0);
    let mut rot: Vec<RotatingCache> = (0..2).map(|_| RotatingCache::new(max_size, keep)).collect();
    let case = format!("window {max_size}, keep {keep}, blocks of {block_size}");
    let mut wrapped_tables = 0;
    for step in 0..steps {
        let buffer = |rot: &[RotatingCache]| rot.iter().map(|c| c.state().first().map_or(0, |k| k.dim(2))).max().unwrap();
        let full = buffer(&rot) == max_size && rot[0].offset() >= max_size;
        let table_before = pool.lock().alloc.block_table(0).map(<[usize]>::to_vec);
        let n = match next(10) {
            0 => 2 + next(3 * max_size as usize) as i32,
            1 if rot[0].is_trimmable() => {
                let t = next(4) as i32;
                for l in 0..2 {
                    assert_eq!(ring[l].trim(t).unwrap(), rot[l].trim(t).unwrap(), "{case}: trim");
                }
                continue;
            }
            _ => 1,
        };
        let off = rot[0].offset();
        let (k, v) = kv_at(off, n);
        for l in 0..2 {
            assert_eq!(mask_of(ring[l].make_mask(n, None).unwrap()), mask_of(rot[l].make_mask(n, None).unwrap()), "{case}: mask");
            let w = Some(max_size / 2 + 1);
            assert_eq!(mask_of(ring[l].make_mask(n, w).unwrap()), mask_of(rot[l].make_mask(n, w).unwrap()), "{case}: window mask");
            let (rk, rv) = ring[l].update_and_fetch(&k, &v).unwrap();
            let (ek, ev) = rot[l].update_and_fetch(&k, &v).unwrap();
            assert_eq!(rk.shape(), ek.shape(), "{case}: step {step} layer {l}: keys shape");
            assert_eq!(rk.to_vec::<f32>().unwrap(), ek.to_vec::<f32>().unwrap(), "{case}: step {step} layer {l}: keys");
            assert_eq!(rv.to_vec::<f32>().unwrap(), ev.to_vec::<f32>().unwrap(), "{case}: step {step} layer {l}: values");
            assert_eq!(ring[l].offset(), rot[l].offset());
        }
        let inner = pool.lock();
        inner.alloc.check().unwrap();
        let table = inner.alloc.block_table(0).unwrap().to_vec();
        let cap = buffer(&rot);
        assert_eq!(table.len(), (cap as usize).div_ceil(block_size), "{case}: step {step}: blocks for a buffer of {cap}");
        if full && n == 1 {
            // The window is full: the new position went into the ring's blocks, none was added.
            assert_eq!(Some(&table), table_before.as_ref(), "{case}: step {step}: the ring changed its blocks");
            wrapped_tables += 1;
        }
    }
    assert!(wrapped_tables > max_size as usize, "{case}: the window wrapped only {wrapped_tables} single steps");
    drop(ring);
    let inner = pool.lock();
    inner.alloc.check().unwrap();
    assert_eq!((inner.alloc.used_blocks(), inner.alloc.cached_blocks(), inner.alloc.num_sequences()), (0, 0, 0));
}

#[test]
fn a_window_is_a_ring_of_blocks() {
    ring_matches_rotating(10, 4, 4, 400, 1);
    ring_matches_rotating(13, 4, 4, 400, 2);
    ring_matches_rotating(16, 0, 4, 400, 3); // sliding-window layers keep nothing
    ring_matches_rotating(7, 2, 16, 300, 4); // one partial block
    ring_matches_rotating(260, 4, 32, 600, 5); // grows in steps of 256 first
}

#[test]
fn windowed_sequences_mix_full_and_ring_layers_and_free_everything() {
    let pool = PagedPool::new(3, 4, 1 << 30);
    for round in 0..3 {
        let windows = [None, Some((9, 4)), Some((6, 0))];
        let (mut caches, _) = pool.new_windowed_sequence(&[], &windows).unwrap();
        let (mut full, _) = pool.new_sequence(&[7, 8, 9]);
        for step in 0..40 {
            let n = if step % 7 == 0 { 5 } else { 1 };
            let (k, v) = kv_at(caches[0].offset(), n);
            for c in caches.iter_mut().chain(full.iter_mut()) {
                c.update_and_fetch(&k, &v).unwrap();
            }
            pool.lock().alloc.check().unwrap();
        }
        assert_eq!(caches[1].window(), Some((9, 4)));
        assert_eq!(caches[0].window(), None);
        // Full layers hold every position, rings their window.
        assert_eq!(caches[0].update_and_fetch(&kv_at(0, 1).0, &kv_at(0, 1).1).unwrap().0.dim(2), caches[0].offset());
        drop(caches);
        drop(full);
        assert_eq!(pool.usage().0, 0, "round {round}: blocks leaked");
        assert_eq!(pool.usage().2, 0, "round {round}: sequences leaked");
    }
    let bad = pool.new_windowed_sequence(&[], &[None, Some((4, 4)), None]);
    assert!(bad.err().expect("keep >= window is refused").to_string().contains("window must be larger"));
}

/// Two sequences sharing a prompt prefix, each extended with its own positions: the second's
/// blocks are not consecutive (shared ones, then fresh ones after the first's), so it is read by
/// gathering; both read back exactly what was written, in order.
#[test]
fn shared_and_scattered_blocks_read_back_in_order() {
    let pool = PagedPool::new(1, 4, 1 << 20);
    let prompt = toks(10, 3);
    let (mut a, reused) = pool.new_sequence(&prompt);
    assert_eq!(reused, 0);
    let (k, v) = kv_at(0, 10);
    a[0].update_and_fetch(&k, &v).unwrap();
    let (k, v) = kv_at(10, 3);
    let (ak, av) = a[0].update_and_fetch(&k, &v).unwrap();
    assert_eq!(ak.to_vec::<f32>().unwrap(), kv_at(0, 13).0.to_vec::<f32>().unwrap());
    assert_eq!(av.to_vec::<f32>().unwrap(), kv_at(0, 13).1.to_vec::<f32>().unwrap());
    // The second sequence reuses the two full prompt blocks and writes the rest elsewhere.
    let (mut b, reused) = pool.new_sequence(&prompt);
    assert_eq!(reused, 8);
    let (k, v) = kv_at(8, 9);
    let (bk, bv) = b[0].update_and_fetch(&k, &v).unwrap();
    assert_eq!(bk.shape(), vec![1, 2, 17, 3]);
    assert_eq!(bk.to_vec::<f32>().unwrap(), kv_at(0, 17).0.to_vec::<f32>().unwrap());
    assert_eq!(bv.to_vec::<f32>().unwrap(), kv_at(0, 17).1.to_vec::<f32>().unwrap());
    // The first is unchanged by the second's writes.
    let (k, v) = kv_at(13, 1);
    let (ak, _) = a[0].update_and_fetch(&k, &v).unwrap();
    assert_eq!(ak.to_vec::<f32>().unwrap(), kv_at(0, 14).0.to_vec::<f32>().unwrap());
    drop((a, b));
    assert_eq!(pool.usage().0, 0);
}
