//! Finds or fetches MLX 0.32.4, compiles the C++ shim against it, and tells dependents how to link.
//!
//! MLX comes from, in order: `MLX_DIR` (a folder with `include/` and `lib/`, such as a pip-installed
//! `site-packages/mlx`), or the official wheel for the backend (`MLX_GEN_BACKEND=cpu|cuda|metal`,
//! default `metal` on macOS and `cpu` elsewhere), downloaded once with this machine's pip into
//! `$MLX_GEN_CACHE` (default `$XDG_CACHE_HOME/mlx-gen` or `~/.cache/mlx-gen`) and verified by sha256.
//! Dependents receive `DEP_MLX_LINK_ARGS` (rpath flags) to pass on with `cargo:rustc-link-arg`.
//!
//! `MLX_GEN_BLAS=openblas` (or a path to a BLAS shared library) on Linux links that BLAS into the
//! binary ahead of the reference BLAS the `mlx-cpu` wheel bundles: the dynamic linker then binds
//! libmlx's `cblas_sgemm` (every float32 matrix product on the CPU) to it. Unset: MLX as shipped.
use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

const MLX_VERSION: &str = "0.32.4";

/// Known wheels: (backend, pip name, file-name prefix, sha256 of the manylinux x86_64 wheel).
const WHEELS: &[(&str, &str, &str, Option<&str>)] = &[
    ("cpu", "mlx-cpu", "mlx_cpu-", Some("0e0a24fa2ce8b6b94d2e6a90604e8813aa8e29fcb918bb2aa01cfb6d133d8cee")),
    ("cuda", "mlx-cuda-13", "mlx_cuda_13-", Some("94cb48fba73e5ee39467e51c35c51c691123359ca17bafd1a24cf92ad6732bee")),
    // The macOS wheels differ per OS version (macosx_14_0, 15_0, ...): pip picks one, unpinned.
    ("metal", "mlx-metal", "mlx_metal-", None),
];

fn main() {
    for var in ["MLX_DIR", "MLX_GEN_BACKEND", "MLX_GEN_BLAS", "MLX_GEN_CACHE", "XDG_CACHE_HOME", "HOME"] {
        println!("cargo:rerun-if-env-changed={var}");
    }
    // The whole folder: any of its sources or headers (a list here had missed jit.cpp).
    println!("cargo:rerun-if-changed=shim");

    let macos = env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("macos");
    let backend = env::var("MLX_GEN_BACKEND").unwrap_or_else(|_| if macos { "metal" } else { "cpu" }.into());
    let mlx_dir = match env::var_os("MLX_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => fetch_wheel(&backend).unwrap_or_else(|e| fail(&e)),
    };
    let include = mlx_dir.join("include");
    let lib = mlx_dir.join("lib");
    if !include.join("mlx/mlx.h").is_file() {
        fail(&format!("{} has no include/mlx/mlx.h: MLX_DIR must name an MLX install", mlx_dir.display()));
    }

    cc::Build::new()
        .cpp(true)
        .std("c++20")
        .file("shim/shim.cpp")
        .file("shim/eval.cpp")
        .file("shim/distributed.cpp")
        .file("shim/recurrent.cpp")
        .file("shim/norm.cpp")
        .file("shim/qmm.cpp")
        .file("shim/attention.cpp")
        .file("shim/mask.cpp")
        .file("shim/mailbox.cpp")
        .file("shim/route.cpp")
        .file("shim/mma.cpp")
        .file("shim/elf.cpp")
        .file("shim/jit.cpp")
        .flag(format!("-isystem{}", include.display()))
        .flag_if_supported("-Wno-unused-parameter")
        .warnings(true)
        .compile("mlxshim");

    println!("cargo:rustc-link-search=native={}", lib.display());
    println!("cargo:rustc-link-lib=dylib=mlx");
    if !macos {
        println!("cargo:rustc-link-lib=dylib=stdc++");
    }

    // rpath: next to the binary first (a relocated lib/ folder), then the MLX install itself.
    // DT_RPATH (not RUNPATH) so that it also applies to libmlx's own dependencies.
    let mut args: Vec<String> = Vec::new();
    if macos {
        args.push("-Wl,-rpath,@loader_path/lib".into());
        args.push(format!("-Wl,-rpath,{}", lib.display()));
    } else {
        args.push("-Wl,--disable-new-dtags".into());
        args.push("-Wl,-rpath,$ORIGIN/lib:$ORIGIN/../lib".into());
        args.push(format!("-Wl,-rpath,{}", lib.display()));
        args.push(format!("-Wl,-rpath-link,{}", lib.display()));
        // The CUDA wheel's libraries (cuBLAS, NCCL, ...) need not be present where we link.
        args.push("-Wl,--allow-shlib-undefined".into());
    }
    let blas = match env::var("MLX_GEN_BLAS").ok().filter(|v| !v.is_empty() && v != "reference") {
        None => "reference (as the MLX wheel ships)".to_owned(),
        Some(_) if macos => fail("MLX_GEN_BLAS is for Linux: the Metal wheel uses Accelerate"),
        Some(v) => {
            let path = find_blas(&v).unwrap_or_else(|| {
                fail(&format!("MLX_GEN_BLAS={v}: no such library (install libopenblas0-pthread, or name the .so file)"))
            });
            // A direct dependency of the binary is searched before libmlx's own dependencies.
            args.push("-Wl,--push-state,--no-as-needed".into());
            args.push(path.display().to_string());
            args.push("-Wl,--pop-state".into());
            path.display().to_string()
        }
    };
    println!("cargo:rustc-env=MLX_GEN_BUILD_BLAS={blas}");
    println!("cargo:link_args={}", args.join("\x1f"));
    println!("cargo:lib_dir={}", lib.display());
    println!("cargo:rustc-env=MLX_GEN_BUILD_BACKEND={backend}");
    println!("cargo:rustc-env=MLX_GEN_BUILD_LIB_DIR={}", lib.display());
}

/// `openblas`: the distribution's OpenBLAS; anything else: the path of a BLAS shared library.
fn find_blas(name: &str) -> Option<PathBuf> {
    if name != "openblas" {
        return Some(PathBuf::from(name)).filter(|p| p.is_file());
    }
    let arch = env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_default();
    [format!("/usr/lib/{arch}-linux-gnu"), "/usr/lib64".into(), "/usr/lib".into(), "/usr/local/lib".into()]
        .iter()
        .map(|dir| Path::new(dir).join("libopenblas.so.0"))
        .find(|p| p.is_file())
}

fn fail(msg: &str) -> ! {
    eprintln!("error: mlx-sys: {msg}");
    std::process::exit(1);
}

fn cache_root() -> PathBuf {
    if let Some(dir) = env::var_os("MLX_GEN_CACHE") {
        return PathBuf::from(dir);
    }
    if let Some(dir) = env::var_os("XDG_CACHE_HOME") {
        return PathBuf::from(dir).join("mlx-gen");
    }
    match env::var_os("HOME") {
        Some(home) => PathBuf::from(home).join(".cache/mlx-gen"),
        None => PathBuf::from(env::var("OUT_DIR").unwrap()).join("mlx-gen-cache"),
    }
}

/// Downloads and unpacks the pinned wheel once; returns its `mlx` folder.
fn fetch_wheel(backend: &str) -> Result<PathBuf, String> {
    let &(_, pip_name, prefix, sha) = WHEELS
        .iter()
        .find(|w| w.0 == backend)
        .ok_or_else(|| format!("MLX_GEN_BACKEND={backend}: expected cpu, cuda or metal"))?;
    let root = cache_root();
    let dest = root.join(format!("mlx-{MLX_VERSION}-{backend}"));
    let mlx = dest.join("mlx");
    if mlx.join("include/mlx/mlx.h").is_file() {
        return Ok(mlx);
    }
    std::fs::create_dir_all(&root).map_err(|e| format!("cannot create {}: {e}", root.display()))?;
    let tmp = root.join(format!(".tmp-{backend}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).map_err(|e| e.to_string())?;
    let python = env::var("PYTHON").unwrap_or_else(|_| "python3".into());
    run(Command::new(&python).args(["-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:", "-d"])
        .arg(&tmp)
        .arg(format!("{pip_name}=={MLX_VERSION}")))?;
    let wheel = std::fs::read_dir(&tmp)
        .map_err(|e| e.to_string())?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with(prefix)))
        .ok_or_else(|| format!("pip downloaded no {pip_name} wheel"))?;
    if let Some(expected) = sha {
        let sum = sha256_of(&wheel)?;
        if sum != expected {
            return Err(format!("{} has sha256 {sum}, expected {expected}", wheel.display()));
        }
    }
    let unpacked = tmp.join("unpacked");
    run(Command::new(&python).args(["-m", "zipfile", "-e"]).arg(&wheel).arg(&unpacked))?;
    let _ = std::fs::remove_dir_all(&dest);
    std::fs::rename(&unpacked, &dest).map_err(|e| format!("cannot move the wheel into {}: {e}", dest.display()))?;
    let _ = std::fs::remove_dir_all(&tmp);
    Ok(mlx)
}

fn sha256_of(path: &Path) -> Result<String, String> {
    let out = Command::new("sha256sum").arg(path).output();
    let text = match out {
        Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout).into_owned(),
        _ => {
            let o = Command::new("shasum").args(["-a", "256"]).arg(path).output().map_err(|e| e.to_string())?;
            String::from_utf8_lossy(&o.stdout).into_owned()
        }
    };
    text.split_whitespace().next().map(str::to_owned).ok_or_else(|| "no sha256 tool".into())
}

fn run(cmd: &mut Command) -> Result<(), String> {
    let status = cmd.status().map_err(|e| format!("cannot run {cmd:?}: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("{cmd:?} failed with {status}"))
    }
}
