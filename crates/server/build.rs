//! Passes mlx-sys's rpath flags on to this crate's test binaries.
fn main() {
    if let Ok(args) = std::env::var("DEP_MLX_LINK_ARGS") {
        for arg in args.split('\x1f') {
            println!("cargo:rustc-link-arg={arg}");
        }
    }
}
