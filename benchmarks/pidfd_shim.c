// For profiling the store client under valgrind 3.19 (Debian 12), which
// does not know pidfd_open (syscall 434): without it the engine's
// same-host shared-memory path gives up and every copy goes over TCP.
// percall.py builds this and LD_PRELOADs it into a client it runs under
// callgrind. It answers pidfd_open with an eventfd that never turns
// readable (the peer is taken to stay alive) and passes every other
// syscall through.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdarg.h>
#include <sys/eventfd.h>

long syscall(long n, ...) {
    va_list ap;
    va_start(ap, n);
    long a[6];
    for (int i = 0; i < 6; i++) a[i] = va_arg(ap, long);
    va_end(ap);
    if (n == 434) return eventfd(0, EFD_CLOEXEC);
    static long (*real)(long, ...) = 0;
    if (!real) real = (long (*)(long, ...))dlsym(RTLD_NEXT, "syscall");
    return real(n, a[0], a[1], a[2], a[3], a[4], a[5]);
}
