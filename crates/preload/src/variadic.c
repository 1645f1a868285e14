/* The variadic functions of libspillway_preload.so. Each reads its optional argument the way
 * glibc does and calls the Rust implementation (src/intercept.rs), which decides whether the
 * call is Spillway's or libc's. The exported names (`open`, …) are Rust trampolines that jump
 * here with every register intact (src/variadic.rs): a cdylib exports only Rust's symbols. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <sys/types.h>
#include <unistd.h>

int spillway_preload_openat(int dirfd, const char *path, int flags, mode_t mode);
int spillway_preload_fcntl(int fd, int cmd, void *arg);
int spillway_preload_ioctl(int fd, unsigned long request, void *arg);
int spillway_preload_exec(const char *file, char *const argv[], char *const envp[], int search);

static mode_t mode_argument(int flags, va_list ap) {
    if ((flags & O_CREAT) || (flags & O_TMPFILE) == O_TMPFILE)
        return (mode_t)va_arg(ap, int);
    return 0;
}

int spillway_variadic_open(const char *path, int flags, ...) {
    va_list ap;
    va_start(ap, flags);
    mode_t mode = mode_argument(flags, ap);
    va_end(ap);
    return spillway_preload_openat(AT_FDCWD, path, flags, mode);
}

int spillway_variadic_open64(const char *path, int flags, ...) {
    va_list ap;
    va_start(ap, flags);
    mode_t mode = mode_argument(flags, ap);
    va_end(ap);
    return spillway_preload_openat(AT_FDCWD, path, flags | O_LARGEFILE, mode);
}

int spillway_variadic_openat(int dirfd, const char *path, int flags, ...) {
    va_list ap;
    va_start(ap, flags);
    mode_t mode = mode_argument(flags, ap);
    va_end(ap);
    return spillway_preload_openat(dirfd, path, flags, mode);
}

int spillway_variadic_openat64(int dirfd, const char *path, int flags, ...) {
    va_list ap;
    va_start(ap, flags);
    mode_t mode = mode_argument(flags, ap);
    va_end(ap);
    return spillway_preload_openat(dirfd, path, flags | O_LARGEFILE, mode);
}

int spillway_variadic_fcntl(int fd, int cmd, ...) {
    va_list ap;
    va_start(ap, cmd);
    void *arg = va_arg(ap, void *);
    va_end(ap);
    return spillway_preload_fcntl(fd, cmd, arg);
}

int spillway_variadic_fcntl64(int fd, int cmd, ...) {
    va_list ap;
    va_start(ap, cmd);
    void *arg = va_arg(ap, void *);
    va_end(ap);
    return spillway_preload_fcntl(fd, cmd, arg);
}

int spillway_variadic_ioctl(int fd, unsigned long request, ...) {
    va_list ap;
    va_start(ap, request);
    void *arg = va_arg(ap, void *);
    va_end(ap);
    return spillway_preload_ioctl(fd, request, arg);
}

/* execl, execlp, execle: the argument list as an argv (and envp), then the common path, which
 * flushes this process's writes first (they live in its memory and would die with the image). */
static int exec_list(const char *file, const char *arg0, va_list ap, int search, int with_env) {
    va_list count_ap;
    va_copy(count_ap, ap);
    size_t count = 1;
    while (va_arg(count_ap, const char *) != NULL)
        count++;
    va_end(count_ap);
    char **argv = malloc((count + 1) * sizeof(char *));
    if (argv == NULL) {
        errno = ENOMEM;
        return -1;
    }
    argv[0] = (char *)arg0;
    for (size_t i = 1; i <= count; i++)
        argv[i] = va_arg(ap, char *); /* the last one read is the terminating NULL */
    char *const *envp = with_env ? va_arg(ap, char *const *) : environ;
    int rc = spillway_preload_exec(file, argv, envp, search);
    int saved = errno;
    free(argv);
    errno = saved;
    return rc;
}

int spillway_variadic_execl(const char *path, const char *arg, ...) {
    va_list ap;
    va_start(ap, arg);
    int rc = exec_list(path, arg, ap, 0, 0);
    va_end(ap);
    return rc;
}

int spillway_variadic_execlp(const char *file, const char *arg, ...) {
    va_list ap;
    va_start(ap, arg);
    int rc = exec_list(file, arg, ap, 1, 0);
    va_end(ap);
    return rc;
}

int spillway_variadic_execle(const char *path, const char *arg, ...) {
    va_list ap;
    va_start(ap, arg);
    int rc = exec_list(path, arg, ap, 0, 1);
    va_end(ap);
    return rc;
}
