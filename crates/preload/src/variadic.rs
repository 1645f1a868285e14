//! The exported variadic functions: `open`, `open64`, `openat`, `openat64`, `fcntl`,
//! `fcntl64`, `ioctl`, `execl`, `execlp`, `execle`. Stable Rust cannot define a variadic
//! function, and a cdylib exports only Rust's symbols, so each is a naked Rust function that
//! jumps, registers and stack untouched, to its C implementation in `variadic.c` (which reads
//! the optional arguments with `va_arg`, as the ABI requires).

macro_rules! trampolines {
    ($($name:ident => $target:ident;)*) => {
        unsafe extern "C" {
            $(fn $target();)*
        }
        $(
            /// The libc function of this name (variadic; see `variadic.c`).
            ///
            /// # Safety
            /// As the libc function.
            #[unsafe(naked)]
            #[no_mangle]
            pub unsafe extern "C" fn $name() {
                #[cfg(target_arch = "x86_64")]
                core::arch::naked_asm!("jmp {target}", target = sym $target);
                #[cfg(target_arch = "aarch64")]
                core::arch::naked_asm!("b {target}", target = sym $target);
            }
        )*
    };
}

trampolines! {
    open => spillway_variadic_open;
    open64 => spillway_variadic_open64;
    openat => spillway_variadic_openat;
    openat64 => spillway_variadic_openat64;
    fcntl => spillway_variadic_fcntl;
    fcntl64 => spillway_variadic_fcntl64;
    ioctl => spillway_variadic_ioctl;
    execl => spillway_variadic_execl;
    execlp => spillway_variadic_execlp;
    execle => spillway_variadic_execle;
}
