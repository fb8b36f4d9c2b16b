//! Checks of the safe API against values worked out by hand.
use mlx::{fast, ops, Array, Dtype};

#[test]
fn arithmetic_and_reductions() {
    let a = Array::from_slice(&[1.0f32, 2.0, 3.0, 4.0], &[2, 2]).unwrap();
    let b = a.add(&a).unwrap().mul_scalar(0.5).unwrap();
    assert_eq!(b.to_vec::<f32>().unwrap(), vec![1.0, 2.0, 3.0, 4.0]);
    assert_eq!(a.sum(&[1], false).unwrap().to_vec::<f32>().unwrap(), vec![3.0, 7.0]);
    assert_eq!(a.argmax(1, false).unwrap().to_vec::<u32>().unwrap(), vec![1, 1]);
    assert_eq!(a.matmul(&a).unwrap().to_vec::<f32>().unwrap(), vec![7.0, 10.0, 15.0, 22.0]);
    assert_eq!(a.t().unwrap().to_vec::<f32>().unwrap(), vec![1.0, 3.0, 2.0, 4.0]);
}

#[test]
fn weak_scalars_keep_the_dtype() {
    let a = Array::from_slice(&[1.0f32, 2.0], &[2]).unwrap().astype(Dtype::BF16).unwrap();
    assert_eq!(a.mul_scalar(0.125).unwrap().dtype(), Dtype::BF16);
}

#[test]
fn slicing_and_updates() {
    let a = ops::arange(0.0, 12.0, 1.0, Dtype::F32).unwrap().reshape(&[3, 4]).unwrap();
    let s = a.slice_axis(1, 1, 3).unwrap();
    assert_eq!(s.shape(), vec![3, 2]);
    assert_eq!(s.to_vec::<f32>().unwrap(), vec![1.0, 2.0, 5.0, 6.0, 9.0, 10.0]);
    let z = ops::zeros(&[3, 4], Dtype::F32).unwrap();
    let u = z.slice_update(&s, &[0, 0], &[3, 2]).unwrap();
    assert_eq!(u.to_vec::<f32>().unwrap()[..3], [1.0, 2.0, 0.0]);
}

#[test]
fn errors_carry_the_mlx_message() {
    let a = Array::from_slice(&[1.0f32, 2.0, 3.0], &[3]).unwrap();
    let b = Array::from_slice(&[1.0f32, 2.0], &[2]).unwrap();
    let e = a.matmul(&b).unwrap_err();
    assert_eq!(e.what, "matmul");
    assert!(!e.message.is_empty());
    assert!(e.location.file().ends_with("tests/ops.rs"), "{}", e.location);
    assert!(Array::from_slice(&[1.0f32], &[2]).is_err());
}

#[test]
fn rms_norm_matches_the_formula() {
    let x = Array::from_slice(&[3.0f32, 4.0], &[1, 2]).unwrap();
    let y = fast::rms_norm(&x, None, 0.0).unwrap().to_vec::<f32>().unwrap();
    let rms = (12.5f32).sqrt();
    assert!((y[0] - 3.0 / rms).abs() < 1e-6 && (y[1] - 4.0 / rms).abs() < 1e-6);
}

#[test]
fn quantize_round_trip() {
    let w = ops::arange(0.0, 128.0, 1.0, Dtype::F32).unwrap().reshape(&[2, 64]).unwrap();
    let q = ops::QuantSpec::affine(64, 8);
    let (qw, s, b) = ops::quantize_affine(&w, q).unwrap();
    assert_eq!(qw.dtype(), Dtype::U32);
    assert_eq!(qw.shape(), vec![2, 16]);
    let back = ops::dequantize(&qw, &s, Some(&b), q).unwrap().to_vec::<f32>().unwrap();
    assert!(back.iter().enumerate().all(|(i, v)| (v - i as f32).abs() < 0.5));
}

#[test]
fn add_rms_norm_is_the_add_then_the_norm() {
    // h = x + y; out = h / sqrt(mean(h^2) + eps) * w, per row (hand-worked for row 0: h = [3, 4],
    // mean 12.5). With or without the kernel asked for, the CPU gives MLX's two operations.
    let x = Array::from_slice(&[1.0f32, 2.0, -1.0, 0.5], &[1, 2, 2]).unwrap();
    let y = Array::from_slice(&[2.0f32, 2.0, 0.0, 0.5], &[1, 2, 2]).unwrap();
    let w = Array::from_slice(&[1.0f32, 2.0], &[2]).unwrap();
    for kernel in [false, true] {
        let (h, out) = fast::add_rms_norm(&x, &y, &w, 0.0, kernel).unwrap();
        assert_eq!(h.shape(), vec![1, 2, 2]);
        assert_eq!(h.to_vec::<f32>().unwrap(), vec![3.0, 4.0, -1.0, 1.0]);
        let out = out.to_vec::<f32>().unwrap();
        let r0 = 12.5f32.sqrt();
        for (got, want) in out.iter().zip([3.0 / r0, 8.0 / r0, -1.0, 2.0]) {
            assert!((got - want).abs() < 1e-6, "{out:?}");
        }
    }
    // Inputs the kernel does not take (mixed dtypes) still give the add and the norm.
    let (h, _) = fast::add_rms_norm(&x, &y.astype(Dtype::BF16).unwrap(), &w, 1e-5, true).unwrap();
    assert_eq!(h.dtype(), Dtype::F32);
}

#[test]
fn qmm_rows_is_the_transposed_quantized_product_where_its_kernel_does_not_run() {
    // x (3, 64) @ dequantize(w)ᵀ for w (2, 64) in 4 bits, groups of 32: row i of x is i + 1 times a
    // ramp, so out[i][n] = (i + 1) * sum_k k/64 * w[n][k]; checked against the dequantized product.
    let q = ops::QuantSpec::affine(32, 4);
    let w = Array::from_slice(&(0..128).map(|i| (i % 16) as f32 - 7.0).collect::<Vec<_>>(), &[2, 64]).unwrap();
    let (qw, s, b) = ops::quantize(&w, q).unwrap();
    let x = Array::from_slice(&(0..192).map(|i| ((i / 64 + 1) * (i % 64)) as f32 / 64.0).collect::<Vec<_>>(), &[3, 64]).unwrap();
    let got = fast::qmm_rows(&x, &qw, &s, b.as_ref(), q).unwrap();
    assert_eq!(got.shape(), vec![3, 2]);
    let deq = ops::dequantize(&qw, &s, b.as_ref(), q).unwrap();
    let want = x.matmul(&deq.t().unwrap()).unwrap().to_vec::<f32>().unwrap();
    for (g, w) in got.to_vec::<f32>().unwrap().iter().zip(&want) {
        assert!((g - w).abs() <= 1e-4 * w.abs().max(1.0), "{g} against {w}");
    }
    // x as (1, 3, 64), a single sequence's rows: (1, 3, 2), the same values.
    let got1 = fast::qmm_rows(&x.reshape(&[1, 3, 64]).unwrap(), &qw, &s, b.as_ref(), q).unwrap();
    assert_eq!(got1.shape(), vec![1, 3, 2]);
    assert_eq!(got1.to_vec::<f32>().unwrap(), got.to_vec::<f32>().unwrap());
    // A bit width MLX has and the kernel does not (3) is MLX's product too.
    let q3 = ops::QuantSpec::affine(32, 3);
    let (qw3, s3, b3) = ops::quantize(&w, q3).unwrap();
    let got3 = fast::qmm_rows(&x, &qw3, &s3, b3.as_ref(), q3).unwrap().to_vec::<f32>().unwrap();
    let want3 = ops::quantized_matmul(&x, &qw3, &s3, b3.as_ref(), true, q3).unwrap().to_vec::<f32>().unwrap();
    assert_eq!(got3, want3);
}

#[test]
fn qmm_mma_is_the_transposed_quantized_product_where_its_kernel_does_not_run() {
    // 9 rows (the tensor-core kernel's range) of x (9, 128) and (1, 9, 128) @ dequantize(w)ᵀ, w (3, 128) in 4 bits.
    let q = ops::QuantSpec::affine(64, 4);
    let w = Array::from_slice(&(0..384).map(|i| ((i * 7) % 16) as f32 - 7.5).collect::<Vec<_>>(), &[3, 128]).unwrap();
    let (qw, s, b) = ops::quantize(&w, q).unwrap();
    let x = Array::from_slice(&(0..1152).map(|i| ((i % 13) as f32 - 6.0) / 8.0).collect::<Vec<_>>(), &[9, 128]).unwrap();
    let want = ops::quantized_matmul(&x, &qw, &s, b.as_ref(), true, q).unwrap();
    let got = fast::qmm_mma(&x, &qw, &s, b.as_ref(), q).unwrap();
    assert_eq!(got.shape(), vec![9, 3]);
    assert_eq!(got.to_vec::<f32>().unwrap(), want.to_vec::<f32>().unwrap());
    let got3 = fast::qmm_mma(&x.reshape(&[1, 9, 128]).unwrap(), &qw, &s, b.as_ref(), q).unwrap();
    assert_eq!(got3.shape(), vec![1, 9, 3]);
    assert_eq!(got3.to_vec::<f32>().unwrap(), want.to_vec::<f32>().unwrap());
}

#[test]
fn gather_qmm_rows_multiplies_each_slot_by_its_expert() {
    // 3 experts of (4, 64) in 4 bits; 2 tokens choosing experts [2, 0] and [1, 2]. Slot (t, j) is
    // x's row for it times expert indices[t][j]'s dequantized weight, transposed: x with a row a
    // token (shared by its slots) and with a row a slot; checked against each slot's product.
    let q = ops::QuantSpec::affine(32, 4);
    let w = Array::from_slice(&(0..768).map(|i| ((i * 7) % 16) as f32 - 7.5).collect::<Vec<_>>(), &[3, 4, 64]).unwrap();
    let (qw, s, b) = ops::quantize(&w, q).unwrap();
    let deq = ops::dequantize(&qw, &s, b.as_ref(), q).unwrap(); // (3, 4, 64)
    let idx = Array::from_slice(&[2u32, 0, 1, 2], &[2, 2]).unwrap();
    let experts = [[2, 0], [1, 2]];
    for rows in [2, 4] {
        let x = Array::from_slice(&(0..rows * 64).map(|i| ((i % 64) as f32 - 20.0) * (1 + i / 64) as f32 / 64.0).collect::<Vec<_>>(), &[rows, 64]).unwrap();
        let got = fast::gather_qmm_rows(&x, &qw, &s, b.as_ref(), &idx, q).unwrap();
        assert_eq!(got.shape(), vec![2, 2, 4]);
        let got = got.to_vec::<f32>().unwrap();
        for (t, chosen) in experts.iter().enumerate() {
            for (j, &e) in chosen.iter().enumerate() {
                let xr = if rows == 2 { t } else { t * 2 + j } as i32;
                let xrow = x.slice_axis(0, xr, xr + 1).unwrap();
                let we = deq.slice_axis(0, e, e + 1).unwrap().squeeze(&[0]).unwrap();
                let want = xrow.matmul(&we.t().unwrap()).unwrap().to_vec::<f32>().unwrap();
                for (n, w) in want.iter().enumerate() {
                    let g = got[(t * 2 + j) * 4 + n];
                    assert!((g - w).abs() <= 1e-3 * w.abs().max(1.0), "slot ({t}, {j}) column {n}: {g} against {w}");
                }
            }
        }
    }
    // x with neither a row a token nor a row a slot is an error naming what it needs.
    let x3 = Array::from_slice(&[0.0f32; 192], &[3, 64]).unwrap();
    let err = fast::gather_qmm_rows(&x3, &qw, &s, b.as_ref(), &idx, q).unwrap_err().to_string();
    assert!(err.contains("a row a token or a row a (token, expert) slot"), "{err}");
}

#[test]
fn sdpa_few_is_refused_where_its_kernel_does_not_run() {
    // The CPU has no custom kernels: unavailable, and a call is an error naming what it needs (the
    // engine asks `sdpa_few_available` first and composes the attention otherwise).
    let q = Array::from_slice(&[0.5f32; 2 * 32], &[1, 2, 1, 32]).unwrap();
    let k = Array::from_slice(&[0.25f32; 3 * 32], &[1, 1, 3, 32]).unwrap();
    if mlx::runtime::gpu_available() {
        return;
    }
    assert!(!fast::sdpa_few_available(&q, &k, &k));
    let err = fast::sdpa_few(&q, &k, &k, 1.0, fast::Mask::None).unwrap_err().to_string();
    assert!(err.contains("CUDA GPU"), "{err}");
}

#[test]
fn mailbox_reads_posted_tokens_before_the_rest_of_their_evaluation() {
    use mlx::{async_eval, Mailbox};
    let mailbox = Mailbox::new().expect("the CPU has a token mailbox");
    let scores = ops::arange(0.0, 32.0, 1.0, Dtype::F32).unwrap().reshape(&[4, 8]).unwrap();
    let scores = scores.mul(&Array::from_slice(&[1.0f32, -1.0, 1.0, -1.0], &[4, 1]).unwrap()).unwrap();
    let tokens = scores.argmax(1, false).unwrap(); // (4,) [7, 0, 7, 0]
    let (posted, ticket) = mailbox.post(&tokens).unwrap();
    assert_eq!(posted.shape(), vec![4]);
    // Work queued behind the tokens, over them, in the same evaluation.
    let table = ops::arange(0.0, 8.0 * 256.0, 1.0, Dtype::F32).unwrap().reshape(&[8, 256]).unwrap();
    let chain = |rows: Array| {
        let mut x = rows.mul_scalar(1.0 / 2048.0).unwrap(); // (4, 256), values in [0, 1)
        for _ in 0..8 {
            x = x.matmul(&x.t().unwrap()).unwrap().matmul(&x).unwrap().mul_scalar(1.0 / 1024.0).unwrap();
        }
        x
    };
    let behind = chain(table.take(&posted, 0).unwrap());
    async_eval(&[&posted, &behind]).unwrap();
    assert_eq!(mailbox.read(ticket, &posted).unwrap(), vec![7, 0, 7, 0]);
    let expected = chain(table.take(&tokens, 0).unwrap());
    assert_eq!(behind.to_vec::<f32>().unwrap(), expected.to_vec::<f32>().unwrap());

    // A post never queued is read from its array (evaluating it).
    let (lone, t1) = mailbox.post(&Array::from_slice(&[3i32, 5], &[2]).unwrap()).unwrap();
    assert_eq!(mailbox.read(t1, &lone).unwrap(), vec![3, 5]);
    // A post whose block a later post took is read from its array too.
    let (a, ta) = mailbox.post(&Array::from_slice(&[11u32], &[1]).unwrap()).unwrap();
    let (b, tb) = mailbox.post(&Array::from_slice(&[12u32, 13], &[2]).unwrap()).unwrap();
    assert_ne!(ta, tb);
    async_eval(&[&a, &b]).unwrap();
    assert_eq!(mailbox.read(tb, &b).unwrap(), vec![12, 13]);
    assert_eq!(mailbox.read(ta, &a).unwrap(), vec![11]);
    // Tokens must be one row of 32-bit integers.
    let e = mailbox.post(&Array::from_slice(&[1u32, 2], &[1, 2]).unwrap()).unwrap_err();
    assert!(e.message.contains("32-bit integer tokens"), "{}", e.message);
    assert!(mailbox.post(&Array::from_slice(&[1.0f32], &[1]).unwrap()).is_err());
}
