//! The engine's own CUDA kernels compile: the sources a CUDA GPU compiles at first use (the
//! few-row and gathered quantized products in each float type and width, the residual add fused
//! with the RMS norm, attention of a few query positions, the gated-delta recurrence, constrained
//! decoding's token mask) go through
//! NVRTC here, with no GPU, for the H100/H200's sm_90 and a consumer card's sm_86. NVRTC comes
//! from the oracle venv (scripts/oracle-venv.sh, pip's nvidia-cuda-nvrtc); the test fails, never
//! skips, when it cannot be had.
use std::path::PathBuf;
use std::process::{Command, Stdio};

fn nvrtc_library() -> String {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let out = Command::new("bash").arg(root.join("scripts/oracle-venv.sh")).stdin(Stdio::null()).output().expect("run oracle-venv.sh");
    assert!(out.status.success(), "oracle venv: {}", String::from_utf8_lossy(&out.stderr));
    let python = String::from_utf8_lossy(&out.stdout).lines().last().unwrap_or("").trim().to_owned();
    let find = "import glob, sysconfig; print(sorted(glob.glob(sysconfig.get_paths()['purelib'] + '/nvidia/*/lib/libnvrtc.so.*'))[0])";
    let out = Command::new(&python).args(["-c", find]).stdin(Stdio::null()).output().expect("run the venv's python");
    assert!(out.status.success(), "no NVRTC in the oracle venv: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

#[test]
fn every_kernel_variant_compiles_with_nvrtc() {
    let lib = nvrtc_library();
    for arch in ["90", "86"] {
        // 2 float types x 2 widths x (4 row counts, one row as (1, M, K), the gathered product), 3 column counts, the
        // fused norm at 6 (type, hidden size) pairs, attention in 5 (types, head size, mask) mixes,
        // the gated-delta recurrence in 4 (types, mask, rounding), the token mask in 3 float types.
        let compiled = mlx::fast::check_kernel_sources(&lib, arch).unwrap_or_else(|e| panic!("sm_{arch}: {e}"));
        assert_eq!(compiled, 45, "sm_{arch}");
    }
}

#[test]
fn a_missing_library_is_an_error_naming_it() {
    let e = mlx::fast::check_kernel_sources("/nonexistent/libnvrtc.so.13", "90").unwrap_err();
    assert!(e.message.contains("/nonexistent/libnvrtc.so.13"), "{}", e.message);
}
