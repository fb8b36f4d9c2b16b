//! The engine's own CUDA kernels compile: the sources a CUDA GPU compiles at first use (the
//! few-row and gathered quantized products in each float type and width, the residual add fused
//! with the RMS norm, attention of a few query positions, the gated-delta recurrence, constrained
//! decoding's token mask, a mixture of experts' router, the tensor-core product, the token
//! mailbox's post) go through NVRTC here, with no GPU, for the H100/H200's sm_90 and a consumer
//! card's sm_86. NVRTC comes from the oracle venv (scripts/oracle-venv.sh, pip's
//! nvidia-cuda-nvrtc); the test fails, never skips, when it cannot be had.
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
        // the gated-delta recurrence in 4 (types, mask, rounding), the token mask in 3 float types,
        // the mixture-of-experts router in 5 (type, experts, chosen, form), the tensor-core product in 8
        // (type, group, row tiles, x's axes, warps), the mailbox's post.
        let compiled = mlx::fast::check_kernel_sources(&lib, arch).unwrap_or_else(|e| panic!("sm_{arch}: {e}"));
        assert_eq!(compiled, 59, "sm_{arch}");
    }
}

#[test]
fn a_missing_library_is_an_error_naming_it() {
    let e = mlx::fast::check_kernel_sources("/nonexistent/libnvrtc.so.13", "90").unwrap_err();
    assert!(e.message.contains("/nonexistent/libnvrtc.so.13"), "{}", e.message);
}

/// The symbol-table lookup the shim uses to find MLX's device allocator (a function libmlx does not
/// export), tried on this test executable, whose functions' values are known relative to each
/// other: two functions' values differ by their addresses' difference; a name that is not there, a
/// file that is not ELF, and a missing file give 0.
#[test]
fn functions_are_found_in_an_elf_symbol_table() {
    let exe = std::env::current_exe().expect("the test executable");
    let exe = exe.to_str().expect("a UTF-8 path");
    let (a, b) = ("mlxs_mask_tokens", "mlxs_elf_function_value");
    let va = mlx::fast::elf_function_value(exe, a).expect("lookup");
    let vb = mlx::fast::elf_function_value(exe, b).expect("lookup");
    assert!(va != 0 && vb != 0, "{va:#x} {vb:#x}");
    let (pa, pb) = (mlx_sys::ffi::mlxs_mask_tokens as *const () as usize as i128, mlx_sys::ffi::mlxs_elf_function_value as *const () as usize as i128);
    assert_eq!(va as i128 - vb as i128, pa - pb);
    assert_eq!(mlx::fast::elf_function_value(exe, "no_such_function_anywhere").expect("lookup"), 0);
    let text = std::env::temp_dir().join(format!("mlx-gen-not-elf-{}", std::process::id()));
    std::fs::write(&text, "not an ELF file").expect("write");
    assert_eq!(mlx::fast::elf_function_value(text.to_str().unwrap(), a).expect("lookup"), 0);
    std::fs::remove_file(&text).expect("remove");
    assert_eq!(mlx::fast::elf_function_value("/nonexistent/libmlx.so", a).expect("lookup"), 0);
}
