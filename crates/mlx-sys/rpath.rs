//! The build script of every crate that links MLX (its `build = "../mlx-sys/rpath.rs"`): passes
//! mlx-sys's rpath flags on to the crate's binaries and test binaries, so they find libmlx.so.
fn main() {
    if let Ok(args) = std::env::var("DEP_MLX_LINK_ARGS") {
        for arg in args.split('\x1f') {
            println!("cargo:rustc-link-arg={arg}");
        }
    }
}
