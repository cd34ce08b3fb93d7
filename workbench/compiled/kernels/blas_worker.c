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
#define MAX_WORKERS 7    /* worker threads at most (wb_blas_worker_pieces: n - 1 of them) */

static int64_t jobs[CAP][NJ];
static int64_t finished[CAP];       /* index + 1 of the last job finished in each slot */
static int64_t head;                /* jobs submitted */
static int64_t claim;               /* next job to claim */
static int64_t ran_worker, ran_helper;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static int started, sleeping, atfork_set;   /* sleeping: workers waiting on cv */
static int64_t nworkers;            /* worker threads started */
static int active;                  /* inside a backward: the idle worker polls, never sleeps */
static int64_t piece_until;         /* CLOCK_MONOTONIC ns until which the idle workers poll,
                                       yielding (set by wb_blas_worker_pieces: split kernels
                                       come close together in an inference run) */

static inline void cpu_pause(void) { __asm__ __volatile__("pause"); }

static inline int64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

typedef void (*block_fn_t)(int64_t *);

static void run(int64_t i) {
    const int64_t *j = jobs[i % CAP];
    if (j[1] == 2) {            /* a piece: fn(block) (wb_blas_worker_pieces) */
        ((block_fn_t)(intptr_t)j[0])((int64_t *)(intptr_t)j[2]);
    } else if (j[1]) {
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
                const int64_t t = now_ns();
                if (t < __atomic_load_n(&piece_until, __ATOMIC_RELAXED)) {
                    /* polling for pieces gives the core to any other runnable thread: on
                     * a machine with more runnable threads than cores a worker that only
                     * spun took a third of the caller's core (BERT-like b8 at 2 threads
                     * with another process running: median 4.2 ms spinning, 1.8 yielding) */
                    sched_yield();
                    s = 0;
                    continue;
                }
                if (!__atomic_load_n(&active, __ATOMIC_RELAXED) || t - t0 > POLL_NS)
                    break;
                s = 0;
            }
        }
        if (found) continue;
        pthread_mutex_lock(&mu);
        sleeping++;
        while (__atomic_load_n(&claim, __ATOMIC_ACQUIRE) >=
               __atomic_load_n(&head, __ATOMIC_ACQUIRE))
            pthread_cond_wait(&cv, &mu);
        sleeping--;
        pthread_mutex_unlock(&mu);
    }
    return 0;
}

/* with mu held: at least `want` worker threads running (as many as could be started; none
 * started: started = -1 and the waiters run every job) */
static void start_workers(int64_t want) {
    while (nworkers < want) {
        pthread_t t;
        pthread_attr_t at;
        pthread_attr_init(&at);
        pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
        const int ok = pthread_create(&t, &at, worker, 0) == 0;
        pthread_attr_destroy(&at);
        if (!ok) {
            if (!nworkers) started = -1;
            return;
        }
        nworkers++;
        started = 1;
    }
}

/* after fork() only the forking thread exists: queue emptied, worker restarted on demand */
static void child_reset(void) {
    pthread_mutex_init(&mu, 0);
    pthread_cond_init(&cv, 0);
    started = sleeping = 0;
    nworkers = 0;
    piece_until = 0;
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
    start_workers(1);
    if (sleeping) pthread_cond_signal(&cv);
    pthread_mutex_unlock(&mu);
}

/* Pieces of one kernel call run by the caller and the workers: s[0] a function taking one
 * int64 block, s[1] the number n of pieces, s[2] the worker threads wanted (at most
 * MAX_WORKERS; started on demand, never stopped), s[3] the nanoseconds the idle workers poll
 * for the next pieces after these (0: their usual SPIN), s[4 + i] the block of piece i.
 * Pieces 1..n-1 are queued (one lock, one wake-up), the caller runs piece 0 and then, while
 * any is unfinished, the queued pieces nobody has claimed: every piece has run when this
 * returns, whether a worker ran any or not. Each piece is the same call on its own block
 * whoever runs it, so a kernel whose pieces compute disjoint outputs in a fixed order gives
 * the same bits at any thread count. */
void wb_blas_worker_pieces(const int64_t *s) {
    const int64_t n = s[1];
    block_fn_t fn = (block_fn_t)(intptr_t)s[0];
    if (n <= 1 || n - 1 > CAP / 2 || s[2] < 1) {   /* nothing to share, or too many: inline */
        for (int64_t p = 0; p < n; p++) fn((int64_t *)(intptr_t)s[4 + p]);
        return;
    }
    if (s[3] > 0) {
        const int64_t until = now_ns() + s[3];
        if (until > __atomic_load_n(&piece_until, __ATOMIC_RELAXED))
            __atomic_store_n(&piece_until, until, __ATOMIC_RELAXED);
    }
    pthread_mutex_lock(&mu);
    if (!atfork_set) {
        pthread_atfork(0, 0, child_reset);
        atfork_set = 1;
    }
    int64_t i = head;
    if (i + n - 1 > CAP) wait_upto(i + n - 1 - CAP);   /* the slots' previous jobs are done */
    for (int64_t p = 1; p < n; p++) {
        int64_t *j = jobs[(i + p - 1) % CAP];
        j[0] = s[0];
        j[1] = 2;
        j[2] = s[4 + p];
    }
    __atomic_store_n(&head, i + n - 1, __ATOMIC_RELEASE);
    int64_t want = s[2] < n - 1 ? s[2] : n - 1;
    start_workers(want < MAX_WORKERS ? want : MAX_WORKERS);
    if (sleeping) {
        if (want > 1) pthread_cond_broadcast(&cv);
        else pthread_cond_signal(&cv);
    }
    pthread_mutex_unlock(&mu);
    fn((int64_t *)(intptr_t)s[4]);
    wait_upto(i + n - 1);
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
