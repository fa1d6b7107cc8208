"""A process's clocks made wrong on purpose: an ``LD_PRELOAD`` library, built with ``gcc`` on first use.

:class:`SkewedClock` gives the processes started with its :meth:`~SkewedClock.prefix`

* a wall clock (``CLOCK_REALTIME``, ``gettimeofday``, ``time``) that :meth:`~SkewedClock.step` moves by any
  number of seconds while they run (an operator's ``date -s``, an NTP step), read from a shared file at
  every call;
* a monotonic clock (``CLOCK_MONOTONIC``, ``CLOCK_BOOTTIME`` and their coarse forms) that runs at ``rate``
  times the real rate from the moment the process starts (a clock that drifts, a VM whose time runs slow).

Only processes that call the C library's clock functions are affected (redis-server, CPython's ``time``);
the rest of the machine keeps its clocks. Linux's time namespaces offset the monotonic clock only, never
the wall clock, and never change a clock's rate: hence the library.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import struct
import subprocess
import tempfile

from .binaries import require_binary
from .processes import track, untrack

__all__ = ["SkewedClock"]

_SOURCE = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static int (*real)(clockid_t, struct timespec *);
static volatile int64_t *step_ns;     /* added to the wall clock; the file is rewritten by the test */
static double rate = 1.0;             /* of the monotonic clocks, from AIOELECT_CLOCK_RATE */
static int64_t origin[16];            /* each monotonic clock's reading when the library loaded */

static int64_t ns(const struct timespec *t) { return (int64_t)t->tv_sec * 1000000000 + t->tv_nsec; }
static void set(struct timespec *t, int64_t v) { t->tv_sec = v / 1000000000; t->tv_nsec = v % 1000000000; }
static int monotonic(clockid_t id) {
    return id == CLOCK_MONOTONIC || id == CLOCK_MONOTONIC_COARSE || id == CLOCK_BOOTTIME;
}

__attribute__((constructor)) static void init(void) {
    real = (int (*)(clockid_t, struct timespec *))dlsym(RTLD_NEXT, "clock_gettime");
    const char *path = getenv("AIOELECT_CLOCK_FILE"), *r = getenv("AIOELECT_CLOCK_RATE");
    if (path) {
        int fd = open(path, O_RDONLY);
        if (fd >= 0) {
            void *p = mmap(NULL, sizeof(int64_t), PROT_READ, MAP_SHARED, fd, 0);
            if (p != MAP_FAILED) step_ns = (volatile int64_t *)p;
            close(fd);
        }
    }
    if (r) rate = strtod(r, NULL);
    clockid_t ids[] = {CLOCK_MONOTONIC, CLOCK_MONOTONIC_COARSE, CLOCK_BOOTTIME};
    for (unsigned i = 0; i < sizeof ids / sizeof ids[0]; i++) {
        struct timespec t;
        real(ids[i], &t);
        origin[ids[i]] = ns(&t);
    }
}

int clock_gettime(clockid_t id, struct timespec *t) {
    if (!real) init();
    int rc = real(id, t);
    if (rc != 0) return rc;
    if ((id == CLOCK_REALTIME || id == CLOCK_REALTIME_COARSE) && step_ns) set(t, ns(t) + *step_ns);
    else if (monotonic(id) && rate != 1.0) set(t, origin[id] + (int64_t)((double)(ns(t) - origin[id]) * rate));
    return 0;
}

int gettimeofday(struct timeval *tv, void *tz) {
    (void)tz;
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    if (tv) { tv->tv_sec = t.tv_sec; tv->tv_usec = t.tv_nsec / 1000; }
    return 0;
}

time_t time(time_t *out) {
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    if (out) *out = t.tv_sec;
    return t.tv_sec;
}
"""


def _library() -> str:
    """The shared library, built once per source (kept in the temporary directory)."""
    digest = hashlib.sha256(_SOURCE.encode()).hexdigest()[:16]
    path = os.path.join(tempfile.gettempdir(), f"aioelect-skewed-clock-{digest}.so")
    if not os.path.exists(path):
        gcc = require_binary("gcc", "cc")
        with tempfile.TemporaryDirectory(prefix="aioelect-clock-") as work:
            source, built = os.path.join(work, "clock.c"), os.path.join(work, "clock.so")
            with open(source, "w") as fh:
                fh.write(_SOURCE)
            subprocess.run([gcc, "-O2", "-shared", "-fPIC", "-o", built, source, "-ldl"], check=True, timeout=60)
            os.replace(built, path)  # atomic: a parallel test process never loads a half-written file
    return path


class SkewedClock:
    """The clocks of the processes started with :meth:`prefix`: the wall clock stepped by :meth:`step`, the
    monotonic clock running at ``rate`` times the real rate."""

    def __init__(self, rate: float = 1.0) -> None:
        self.rate = rate
        self.library = _library()
        fd, self.path = tempfile.mkstemp(prefix="aioelect-clock-step-")
        with os.fdopen(fd, "wb") as fh:
            fh.write(struct.pack("q", 0))
        self.stepped = 0.0
        track(self, self.cleanup)

    def prefix(self) -> list[str]:
        """``env ...``: put it before a command to run that command on these clocks (it execs in its place)."""
        return [
            "env",
            f"LD_PRELOAD={self.library}",
            f"AIOELECT_CLOCK_FILE={self.path}",
            f"AIOELECT_CLOCK_RATE={self.rate!r}",
        ]

    def step(self, seconds: float) -> None:
        """Move the wall clock of every process on these clocks by ``seconds`` (forward if positive), at once."""
        self.stepped += seconds
        with open(self.path, "r+b") as fh:  # one aligned 8-byte write: readers see the old value or the new
            fh.write(struct.pack("q", round(self.stepped * 1e9)))

    def cleanup(self) -> None:
        untrack(self)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
