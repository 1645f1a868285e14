//! Compiles the C entry points of the variadic POSIX functions (`open`, `fcntl`, `execl`, …):
//! stable Rust cannot define a variadic function, and reading a variadic argument any other
//! way is undefined behaviour.

fn main() {
    println!("cargo:rerun-if-changed=src/variadic.c");
    cc::Build::new()
        .file("src/variadic.c")
        .flag("-fvisibility=default")
        .compile("spillway_preload_variadic");
}
