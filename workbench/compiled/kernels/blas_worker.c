/* A persistent worker thread that runs queued single-precision GEMMs (OpenBLAS' cblas_sgemm,
 * called through the function pointer each job carries) without the Python interpreter: a
 * training step hands the weight-gradient products to it and goes on with its backward.
 * See blas_worker.py for the contract. Progress never depends on the worker: whoever waits
 * for a job runs the queued jobs not yet claimed itself. */
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

typedef void (*sgemm64_t)(int, int, int, int64_t, int64_t, int64_t, float, const float *,
                          int64_t, const float *, int64_t, float, float *, int64_t);
typedef void (*sgemm32_t)(int, int, int, int32_t, int32_t, int32_t, float, const float *,
                          int32_t, const float *, int32_t, float, float *, int32_t);

#define CAP 256          /* queued jobs at most (a submit first waits for the oldest) */
#define NJ 13            /* fn, ilp64, transA, transB, M, N, K, A, lda, B, ldb, C, ldc */
#define SPIN 64          /* pause loops (~1-2 us) the idle worker polls before it sleeps */
#define POLL_NS 30000    /* inside a backward: polls up to 30 us after its last job */

static int64_t jobs[CAP][NJ];
static int64_t finished[CAP];       /* index + 1 of the last job finished in each slot */
static int64_t head;                /* jobs submitted */
static int64_t claim;               /* next job to claim */
static int64_t ran_worker, ran_helper;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static int started, sleeping, atfork_set;
static int active;                  /* inside a backward: the idle worker polls, never sleeps */

static inline void cpu_pause(void) { __asm__ __volatile__("pause"); }

static inline int64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

static void run(int64_t i) {
    const int64_t *j = jobs[i % CAP];
    if (j[1]) {
        ((sgemm64_t)(intptr_t)j[0])(101, (int)j[2], (int)j[3], j[4], j[5], j[6], 1.0f,
                                    (const float *)(intptr_t)j[7], j[8],
                                    (const float *)(intptr_t)j[9], j[10], 0.0f,
                                    (float *)(intptr_t)j[11], j[12]);
    } else {
        ((sgemm32_t)(intptr_t)j[0])(101, (int)j[2], (int)j[3], (int32_t)j[4], (int32_t)j[5],
                                    (int32_t)j[6], 1.0f, (const float *)(intptr_t)j[7],
                                    (int32_t)j[8], (const float *)(intptr_t)j[9],
                                    (int32_t)j[10], 0.0f, (float *)(intptr_t)j[11],
                                    (int32_t)j[12]);
    }
    __atomic_store_n(&finished[i % CAP], i + 1, __ATOMIC_RELEASE);
}

/* claim and run the oldest unclaimed job below `limit`; 1 when one ran */
static int run_one(int64_t limit) {
    int64_t c = __atomic_load_n(&claim, __ATOMIC_ACQUIRE);
    while (c < limit) {
        if (__atomic_compare_exchange_n(&claim, &c, c + 1, 0, __ATOMIC_ACQ_REL,
                                        __ATOMIC_ACQUIRE)) {
            run(c);
            return 1;
        }
    }
    return 0;
}

static void *worker(void *arg) {
    (void)arg;
    for (;;) {
        if (run_one(__atomic_load_n(&head, __ATOMIC_ACQUIRE))) {
            __atomic_add_fetch(&ran_worker, 1, __ATOMIC_RELAXED);
            continue;
        }
        /* idle: poll POLL_NS (inside a backward) or SPIN pauses, then sleep */
        int s = 0, found = 0;
        int64_t t0 = now_ns();
        while (!(found = __atomic_load_n(&claim, __ATOMIC_ACQUIRE) <
                         __atomic_load_n(&head, __ATOMIC_ACQUIRE))) {
            cpu_pause();
            if (++s >= SPIN) {
                if (!__atomic_load_n(&active, __ATOMIC_RELAXED) || now_ns() - t0 > POLL_NS)
                    break;
                s = 0;
            }
        }
        if (found) continue;
        pthread_mutex_lock(&mu);
        sleeping = 1;
        while (__atomic_load_n(&claim, __ATOMIC_ACQUIRE) >=
               __atomic_load_n(&head, __ATOMIC_ACQUIRE))
            pthread_cond_wait(&cv, &mu);
        sleeping = 0;
        pthread_mutex_unlock(&mu);
    }
    return 0;
}

/* after fork() only the forking thread exists: queue emptied, worker restarted on demand */
static void child_reset(void) {
    pthread_mutex_init(&mu, 0);
    pthread_cond_init(&cv, 0);
    started = sleeping = 0;
    head = claim = 0;
    memset(finished, 0, sizeof finished);
}

/* wait until every job with index < ticket has finished, running unclaimed ones meanwhile */
static void wait_upto(int64_t ticket) {
    int64_t lo = ticket - CAP < 0 ? 0 : ticket - CAP;
    for (int64_t i = lo; i < ticket; i++) {
        int n = 0;
        while (__atomic_load_n(&finished[i % CAP], __ATOMIC_ACQUIRE) < i + 1) {
            if (run_one(ticket)) {
                __atomic_add_fetch(&ran_helper, 1, __ATOMIC_RELAXED);
                continue;
            }
            if (++n < 2000) cpu_pause(); else sched_yield();
        }
    }
}

/* job: the NJ values above; job[NJ] receives the ticket to wait for (index + 1) */
void wb_blas_worker_submit(int64_t *job) {
    pthread_mutex_lock(&mu);
    if (!atfork_set) {
        pthread_atfork(0, 0, child_reset);
        atfork_set = 1;
    }
    int64_t i = head;
    if (i >= CAP) wait_upto(i - CAP + 1);     /* the slot's previous job must be done */
    memcpy(jobs[i % CAP], job, sizeof(int64_t) * NJ);
    __atomic_store_n(&head, i + 1, __ATOMIC_RELEASE);
    job[NJ] = i + 1;
    if (!started) {
        pthread_t t;
        pthread_attr_t at;
        pthread_attr_init(&at);
        pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
        started = pthread_create(&t, &at, worker, 0) == 0 ? 1 : -1;  /* -1: waiters run all */
        pthread_attr_destroy(&at);
    }
    if (sleeping) pthread_cond_signal(&cv);
    pthread_mutex_unlock(&mu);
}

/* on != 0: a backward begins (after a job the worker polls up to POLL_NS for the next one
 * before it sleeps: the next submit then needs no wake-up); 0: it has ended */
void wb_blas_worker_poll(int64_t on) { __atomic_store_n(&active, on ? 1 : 0, __ATOMIC_RELAXED); }

void wb_blas_worker_wait_for(int64_t ticket) { wait_upto(ticket); }

/* out: jobs run by the worker, jobs run by waiters, jobs submitted, worker state */
void wb_blas_worker_stats(int64_t *out) {
    out[0] = __atomic_load_n(&ran_worker, __ATOMIC_RELAXED);
    out[1] = __atomic_load_n(&ran_helper, __ATOMIC_RELAXED);
    out[2] = __atomic_load_n(&head, __ATOMIC_RELAXED);
    out[3] = started;
}

/* ------------------------------------------------------------------------------------------
 * The block pool (entry `par`): inference's compiled kernels that take one int64 call block
 * (dwconv_avx2.chain / dw3x3 / fewc / maxpool / interleave2, gemm_avx2.gemm_block, ...) run a
 * layer's blocks over up to PW pool threads and the caller, with one ctypes call and no
 * Python on the pool threads (Python's ThreadPoolExecutor hand-off costs 50-70 us a layer).
 * Blocks are claimed one at a time from a shared counter: each block is computed whole by one
 * thread, so the result does not depend on which thread ran which block (nor on how many).
 * The caller claims blocks too and waits only for blocks a pool thread has claimed: nothing
 * waits on a pool thread the OS has not scheduled.
 *
 * The task word packs the task's generation (32 bits), its block count (16) and the next
 * block to claim (16); a claim is a compare-and-swap that also checks the generation, so a
 * pool thread late for a finished task can never claim a block of the next one. The fields a
 * claimer then reads (kernel, block addresses) stay valid until every claimed block is done,
 * which is what the caller waits for before it returns. */
typedef void (*blockfn_t)(int64_t *);

#define PW 7                 /* pool threads at most (the engine runs at most 8 threads) */
#define PSPIN_NS 200000      /* an idle pool thread polls this long before it sleeps */

static uint64_t p_word;                     /* gen << 32 | n << 16 | next (unsigned: a
                                               generation past 2^31 stays positive) */
static blockfn_t p_fn;
static const int64_t *p_addrs;
static int64_t p_done;                      /* blocks finished in this task */
static int64_t p_helpers;                   /* pool threads that take part in this task */
static int64_t p_ran[PW + 1];               /* blocks run by each pool thread, by callers */
static int p_started, p_sleepers, p_atfork;
static pthread_mutex_t p_call = PTHREAD_MUTEX_INITIALIZER;    /* one task at a time */
static pthread_mutex_t p_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t p_cv = PTHREAD_COND_INITIALIZER;

#define W_GEN(w) ((int64_t)((w) >> 32))
#define W_N(w) (((w) >> 16) & 0xffff)
#define W_NEXT(w) ((w) & 0xffff)

/* claim and run blocks of task generation `gen` until none is left; blocks run */
static int64_t p_work(int64_t gen) {
    int64_t ran = 0;
    uint64_t w = __atomic_load_n(&p_word, __ATOMIC_ACQUIRE);
    while (W_GEN(w) == gen && W_NEXT(w) < W_N(w)) {
        if (!__atomic_compare_exchange_n(&p_word, &w, w + 1, 0, __ATOMIC_ACQ_REL,
                                          __ATOMIC_ACQUIRE))
            continue;                       /* w now holds the current word */
        int64_t i = (int64_t)W_NEXT(w);
        p_fn((int64_t *)(intptr_t)p_addrs[i]);
        __atomic_add_fetch(&p_done, 1, __ATOMIC_RELEASE);
        ran++;
        w = __atomic_load_n(&p_word, __ATOMIC_ACQUIRE);
    }
    return ran;
}

static void *p_thread(void *arg) {
    int64_t me = (int64_t)(intptr_t)arg;
    int64_t seen = W_GEN(__atomic_load_n(&p_word, __ATOMIC_SEQ_CST));
    for (;;) {
        int64_t gen = W_GEN(__atomic_load_n(&p_word, __ATOMIC_SEQ_CST));
        if (gen != seen) {
            seen = gen;
            if (me < __atomic_load_n(&p_helpers, __ATOMIC_ACQUIRE))
                __atomic_add_fetch(&p_ran[me], p_work(gen), __ATOMIC_RELAXED);
            continue;
        }
        /* idle: poll PSPIN_NS for the next task, then sleep until one is published */
        int s = 0;
        int64_t t0 = now_ns();
        while (W_GEN(__atomic_load_n(&p_word, __ATOMIC_SEQ_CST)) == seen) {
            cpu_pause();
            if (++s >= SPIN) {          /* ~1-2 us: give the core up if anyone waits for it */
                if (now_ns() - t0 > PSPIN_NS) break;
                sched_yield();
                s = 0;
            }
        }
        if (W_GEN(__atomic_load_n(&p_word, __ATOMIC_SEQ_CST)) != seen) continue;
        pthread_mutex_lock(&p_mu);
        __atomic_add_fetch(&p_sleepers, 1, __ATOMIC_SEQ_CST);
        while (W_GEN(__atomic_load_n(&p_word, __ATOMIC_SEQ_CST)) == seen)
            pthread_cond_wait(&p_cv, &p_mu);
        __atomic_sub_fetch(&p_sleepers, 1, __ATOMIC_SEQ_CST);
        pthread_mutex_unlock(&p_mu);
    }
    return 0;
}

static void p_child_reset(void) {
    pthread_mutex_init(&p_call, 0);
    pthread_mutex_init(&p_mu, 0);
    pthread_cond_init(&p_cv, 0);
    p_started = p_sleepers = 0;
    p_word = (uint64_t)W_GEN(p_word) << 32; /* no task */
}

/* d: kernel address, n blocks, threads (the caller included), then the n blocks' addresses.
 * threads <= 1, a single block, more than 65535 blocks, or another task running (a second
 * Python thread): the blocks run here one after another. */
void wb_blas_worker_par(int64_t *d) {
    blockfn_t fn = (blockfn_t)(intptr_t)d[0];
    int64_t n = d[1], threads = d[2];
    const int64_t *addrs = d + 3;
    int64_t helpers = threads - 1 > PW ? PW : threads - 1;
    if (helpers < 1 || n < 2 || n > 0xffff || pthread_mutex_trylock(&p_call) != 0) {
        for (int64_t i = 0; i < n; i++) fn((int64_t *)(intptr_t)addrs[i]);
        return;
    }
    if (!p_atfork) {
        pthread_atfork(0, 0, p_child_reset);
        p_atfork = 1;
    }
    while (p_started < helpers) {
        pthread_t t;
        pthread_attr_t at;
        pthread_attr_init(&at);
        pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
        int ok = pthread_create(&t, &at, p_thread, (void *)(intptr_t)p_started) == 0;
        pthread_attr_destroy(&at);
        if (!ok) break;                     /* fewer helpers: the caller runs the rest */
        p_started++;
    }
    p_fn = fn;
    p_addrs = addrs;
    __atomic_store_n(&p_done, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&p_helpers, helpers, __ATOMIC_RELEASE);
    int64_t gen = (W_GEN(__atomic_load_n(&p_word, __ATOMIC_RELAXED)) + 1) & 0xffffffff;
    __atomic_store_n(&p_word, ((uint64_t)gen << 32) | ((uint64_t)n << 16), __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&p_sleepers, __ATOMIC_SEQ_CST)) {
        pthread_mutex_lock(&p_mu);
        pthread_cond_broadcast(&p_cv);
        pthread_mutex_unlock(&p_mu);
    }
    __atomic_add_fetch(&p_ran[PW], p_work(gen), __ATOMIC_RELAXED);
    int k = 0;
    while (__atomic_load_n(&p_done, __ATOMIC_ACQUIRE) < n) {
        if (++k < 4000) cpu_pause(); else sched_yield();
    }
    pthread_mutex_unlock(&p_call);
}

/* out (PW + 2 values): blocks run by each pool thread, by callers, pool threads started */
void wb_blas_worker_par_stats(int64_t *out) {
    for (int i = 0; i <= PW; i++) out[i] = __atomic_load_n(&p_ran[i], __ATOMIC_RELAXED);
    out[PW + 1] = p_started;
}
