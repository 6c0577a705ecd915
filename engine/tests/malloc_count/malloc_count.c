/*
 * An LD_PRELOAD interposer that counts a process's C heap allocations —
 * every call of the malloc family, from Rust's allocator or from any C
 * library (librdmacm, libibverbs, libc itself) — and forwards each to the
 * real allocator.
 *
 * The counts live in a shared mapping of the file named by
 * $PINPOLL_MALLOC_COUNT_FILE (struct counts below, native byte order), so
 * the process reads them with pread(2) — no call into this library, and no
 * allocation — before and after a measured region. The magic is written
 * only once the mapping is in place: a reader that finds it knows the
 * counting is live.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* Keep in step with src/lib.rs. */
#define MAGIC 0x706e706c6d616c63ULL
enum kind { MALLOC, CALLOC, REALLOC, POSIX_MEMALIGN, ALIGNED_ALLOC, MEMALIGN, VALLOC, PVALLOC, KINDS };
#define FILE_BYTES 4096

struct counts {
    uint64_t magic;
    uint64_t calls[KINDS];
};

/* Counts made before the constructor maps the file (other libraries'
 * constructors may allocate first); copied into the mapping. */
static struct counts early;
static struct counts *counts = &early;

static void count(enum kind k)
{
    struct counts *c = __atomic_load_n(&counts, __ATOMIC_ACQUIRE);
    __atomic_fetch_add(&c->calls[k], 1, __ATOMIC_RELAXED);
}

static void *(*real_malloc)(size_t);
static void *(*real_calloc)(size_t, size_t);
static void *(*real_realloc)(void *, size_t);
static void (*real_free)(void *);
static int (*real_posix_memalign)(void **, size_t, size_t);
static void *(*real_aligned_alloc)(size_t, size_t);
static void *(*real_memalign)(size_t, size_t);
static void *(*real_valloc)(size_t);
static void *(*real_pvalloc)(size_t);

/*
 * dlsym may allocate (its error state) while the real functions are being
 * looked up; those requests are served from this arena, never freed, and
 * never counted: they are this library's, not the program's.
 */
static _Alignas(16) unsigned char arena[8192];
static size_t arena_used;
static int resolving;

struct arena_header {
    size_t size;
    size_t pad;
};

static void *arena_alloc(size_t size)
{
    size_t need = sizeof(struct arena_header) + ((size + 15) & ~(size_t)15);
    if (need > sizeof arena - arena_used)
        return NULL;
    struct arena_header *h = (struct arena_header *)(arena + arena_used);
    arena_used += need;
    h->size = size;
    return memset(h + 1, 0, size);
}

static int in_arena(const void *p)
{
    return (const unsigned char *)p >= arena && (const unsigned char *)p < arena + sizeof arena;
}

static void resolve(void)
{
    if (__atomic_load_n(&real_free, __ATOMIC_ACQUIRE))
        return;
    resolving = 1;
    real_malloc = dlsym(RTLD_NEXT, "malloc");
    real_calloc = dlsym(RTLD_NEXT, "calloc");
    real_realloc = dlsym(RTLD_NEXT, "realloc");
    real_posix_memalign = dlsym(RTLD_NEXT, "posix_memalign");
    real_aligned_alloc = dlsym(RTLD_NEXT, "aligned_alloc");
    real_memalign = dlsym(RTLD_NEXT, "memalign");
    real_valloc = dlsym(RTLD_NEXT, "valloc");
    real_pvalloc = dlsym(RTLD_NEXT, "pvalloc");
    void (*found_free)(void *) = dlsym(RTLD_NEXT, "free");
    resolving = 0;
    if (!found_free || !real_malloc || !real_calloc || !real_realloc || !real_posix_memalign ||
        !real_aligned_alloc || !real_memalign || !real_valloc || !real_pvalloc) {
        static const char msg[] = "malloc_count: cannot find the real allocator (dlsym RTLD_NEXT)\n";
        (void)!write(2, msg, sizeof msg - 1);
        abort();
    }
    __atomic_store_n(&real_free, found_free, __ATOMIC_RELEASE);
}

void *malloc(size_t size)
{
    if (resolving)
        return arena_alloc(size);
    resolve();
    count(MALLOC);
    return real_malloc(size);
}

void *calloc(size_t n, size_t size)
{
    if (resolving) {
        if (size && n > SIZE_MAX / size)
            return NULL;
        return arena_alloc(n * size);
    }
    resolve();
    count(CALLOC);
    return real_calloc(n, size);
}

/* Moves arena block `p` into a block from `alloc`. */
static void *move_out_of_arena(void *p, size_t size, void *(*alloc)(size_t))
{
    const struct arena_header *h = (const struct arena_header *)p - 1;
    void *moved = alloc(size);
    if (moved)
        memcpy(moved, p, h->size < size ? h->size : size);
    return moved;
}

void *realloc(void *p, size_t size)
{
    if (resolving)
        return p ? move_out_of_arena(p, size, arena_alloc) : arena_alloc(size);
    resolve();
    count(REALLOC);
    if (in_arena(p))
        return move_out_of_arena(p, size, real_malloc);
    return real_realloc(p, size);
}

/* glibc's reallocarray calls realloc inside libc, past this library:
 * checked here and counted as the realloc it is. */
void *reallocarray(void *p, size_t n, size_t size)
{
    if (size && n > SIZE_MAX / size) {
        errno = ENOMEM;
        return NULL;
    }
    return realloc(p, n * size);
}

void free(void *p)
{
    if (!p || in_arena(p))
        return;
    resolve();
    real_free(p);
}

int posix_memalign(void **out, size_t align, size_t size)
{
    resolve();
    count(POSIX_MEMALIGN);
    return real_posix_memalign(out, align, size);
}

void *aligned_alloc(size_t align, size_t size)
{
    resolve();
    count(ALIGNED_ALLOC);
    return real_aligned_alloc(align, size);
}

void *memalign(size_t align, size_t size)
{
    resolve();
    count(MEMALIGN);
    return real_memalign(align, size);
}

void *valloc(size_t size)
{
    resolve();
    count(VALLOC);
    return real_valloc(size);
}

void *pvalloc(size_t size)
{
    resolve();
    count(PVALLOC);
    return real_pvalloc(size);
}

/* Maps the counter file; runs before main, while the process has one thread. */
__attribute__((constructor)) static void share_counts(void)
{
    resolve();
    const char *path = getenv("PINPOLL_MALLOC_COUNT_FILE");
    if (!path)
        return;
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0)
        return;
    void *page = MAP_FAILED;
    if (ftruncate(fd, FILE_BYTES) == 0)
        page = mmap(NULL, FILE_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (page == MAP_FAILED)
        return;
    struct counts *shared = page;
    memcpy(shared->calls, early.calls, sizeof early.calls);
    __atomic_store_n(&counts, shared, __ATOMIC_RELEASE);
    __atomic_store_n(&shared->magic, MAGIC, __ATOMIC_RELEASE);
}
