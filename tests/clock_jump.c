/*
 * A tiny LD_PRELOAD shim for tests: adds an offset to the wall clock of the
 * process it is loaded into (CLOCK_REALTIME and its coarse twin through
 * clock_gettime, gettimeofday and time); the monotonic clocks are left
 * alone. The offset, in microseconds as a decimal integer, is read from the
 * file named by $RESILIENT_CLOCK_JUMP_FILE, looked at again at most once a
 * millisecond (of the real monotonic clock), so a test jumps the clock by
 * rewriting that file. No threads, timers or signals of its own: only
 * these three functions are replaced. Built by tests/test_lock_clock_jump.py.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static long long offset_us;
static long long looked_ns = -1;

static int real_clock_gettime(clockid_t id, struct timespec *ts) {
    return (int)syscall(SYS_clock_gettime, id, ts);
}

static long long offset(void) {
    struct timespec mono;
    const char *path;
    char buf[32];
    long long now_ns;
    ssize_t n;
    int fd;

    real_clock_gettime(CLOCK_MONOTONIC, &mono);
    now_ns = (long long)mono.tv_sec * 1000000000LL + mono.tv_nsec;
    if (looked_ns >= 0 && now_ns - looked_ns < 1000000LL)
        return __atomic_load_n(&offset_us, __ATOMIC_RELAXED);
    looked_ns = now_ns;
    path = getenv("RESILIENT_CLOCK_JUMP_FILE");
    if (path == NULL)
        return 0;
    fd = (int)syscall(SYS_openat, AT_FDCWD, path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return __atomic_load_n(&offset_us, __ATOMIC_RELAXED);
    n = (ssize_t)syscall(SYS_read, fd, buf, sizeof buf - 1);
    syscall(SYS_close, fd);
    if (n > 0) {
        buf[n] = '\0';
        __atomic_store_n(&offset_us, strtoll(buf, NULL, 10), __ATOMIC_RELAXED);
    }
    return __atomic_load_n(&offset_us, __ATOMIC_RELAXED);
}

static void shift(struct timespec *ts, long long us) {
    long long ns = (long long)ts->tv_nsec + (us % 1000000LL) * 1000LL;
    ts->tv_sec += (time_t)(us / 1000000LL);
    if (ns >= 1000000000LL) {
        ns -= 1000000000LL;
        ts->tv_sec += 1;
    } else if (ns < 0) {
        ns += 1000000000LL;
        ts->tv_sec -= 1;
    }
    ts->tv_nsec = (long)ns;
}

int clock_gettime(clockid_t id, struct timespec *ts) {
    int rc = real_clock_gettime(id, ts);
    if (rc == 0 && (id == CLOCK_REALTIME || id == CLOCK_REALTIME_COARSE))
        shift(ts, offset());
    return rc;
}

int gettimeofday(struct timeval *tv, void *tz) {
    struct timespec ts;
    int rc = real_clock_gettime(CLOCK_REALTIME, &ts);
    (void)tz;
    if (rc != 0)
        return rc;
    shift(&ts, offset());
    tv->tv_sec = ts.tv_sec;
    tv->tv_usec = ts.tv_nsec / 1000;
    return 0;
}

time_t time(time_t *out) {
    struct timespec ts;
    real_clock_gettime(CLOCK_REALTIME, &ts);
    shift(&ts, offset());
    if (out != NULL)
        *out = ts.tv_sec;
    return ts.tv_sec;
}
