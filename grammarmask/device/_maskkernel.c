/* The CPU mask kernel: forbidden logits to -inf, touching only what must change.
 *
 * Written in C because the work is per 32-bit mask word: an all-ones word (allowed) is
 * skipped without touching its logits, an all-zero word is a plain store of 32 -inf, and
 * a mixed word sets -inf where its bits are 0 (see below). Tensor ops cannot branch per
 * word, so they pass over whole rows several times; this passes once, over what changes.
 * Rows are handed out one at a time to the calling thread and up to threads - 1 helpers,
 * with the GIL released.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>

/* Fewer rows than this per thread are not worth starting a thread for (~20 us each). */
#define MIN_ROWS_PER_THREAD 4

/* A mixed word is applied LANES logits at a time with 16-byte vectors (SSE2 on x86-64,
 * NEON on arm64: no target flags needed): LANES bits of the word, broadcast and tested
 * against the lanes' own bits, select between the logit and -inf. Measured on real mixed
 * rows, fp32: 5.9 ms against 17.7 ms for the scalar select loop, which GCC vectorizes
 * badly without AVX2, and 12 ms for a store per zero bit. A word with at most 3 zero bits
 * (inside a string) stores at those only: 2x faster on such rows than the select, which
 * must read its logits first. */
typedef uint32_t lanes_32 __attribute__((vector_size(16)));
typedef uint16_t lanes_16 __attribute__((vector_size(16)));
static const lanes_32 lane_bits_32 = {1, 2, 4, 8};
static const lanes_16 lane_bits_16 = {1, 2, 4, 8, 16, 32, 64, 128};

#define DEFINE_MASK_ROW(NAME, TYPE, VECTOR, LANE_BITS)                                 \
    static void NAME(TYPE *out, const uint32_t *mask, Py_ssize_t vocab, TYPE minus_inf) \
    {                                                                                  \
        enum { LANES = sizeof(VECTOR) / sizeof(TYPE) };                                \
        const VECTOR fill = minus_inf - (VECTOR){0};                                   \
        Py_ssize_t whole_words = vocab / 32;                                           \
        for (Py_ssize_t w = 0; w < whole_words; w++) {                                 \
            uint32_t allowed = mask[w];                                                \
            TYPE *chunk = out + 32 * w;                                                \
            if (allowed == UINT32_MAX)                                                 \
                continue;                                                              \
            if (allowed == 0) {                                                        \
                for (int k = 0; k < 32; k++)                                           \
                    chunk[k] = minus_inf;                                              \
                continue;                                                              \
            }                                                                          \
            uint32_t forbidden = ~allowed, rest = forbidden & (forbidden - 1);         \
            rest &= rest - 1;                                                          \
            if ((rest & (rest - 1)) == 0) { /* at most 3 forbidden: store those */     \
                for (; forbidden; forbidden &= forbidden - 1)                          \
                    chunk[__builtin_ctz(forbidden)] = minus_inf;                       \
                continue;                                                              \
            }                                                                          \
            for (int group = 0; group < 32 / LANES; group++) {                         \
                TYPE bits = (TYPE)((allowed >> (group * LANES)) & ((1u << LANES) - 1));  \
                VECTOR keep = (VECTOR)(((bits - (VECTOR){0}) & LANE_BITS) != 0);       \
                VECTOR logits;                                                         \
                memcpy(&logits, chunk + group * LANES, sizeof logits);                 \
                logits = (logits & keep) | (fill & ~keep);                             \
                memcpy(chunk + group * LANES, &logits, sizeof logits);                 \
            }                                                                          \
        }                                                                              \
        int tail = (int)(vocab - 32 * whole_words);                                    \
        if (tail) {                                                                    \
            uint32_t forbidden = ~mask[whole_words] & ((UINT32_C(1) << tail) - 1);     \
            TYPE *chunk = out + 32 * whole_words;                                      \
            for (; forbidden; forbidden &= forbidden - 1)                              \
                chunk[__builtin_ctz(forbidden)] = minus_inf;                           \
        }                                                                              \
    }

DEFINE_MASK_ROW(mask_row_32, uint32_t, lanes_32, lane_bits_32)
DEFINE_MASK_ROW(mask_row_16, uint16_t, lanes_16, lane_bits_16)

typedef struct {
    char *logits;
    Py_ssize_t itemsize;
    Py_ssize_t vocab;
    const uint32_t *bitmask;
    Py_ssize_t words;
    const int64_t *rows;
    Py_ssize_t count;
    uint32_t minus_inf;
    Py_ssize_t next; /* the next index into rows to hand out, taken atomically */
} Job;

static void *work(void *arg)
{
    Job *job = (Job *)arg;
    for (;;) {
        Py_ssize_t i = __atomic_fetch_add(&job->next, 1, __ATOMIC_RELAXED);
        if (i >= job->count)
            return NULL;
        int64_t row = job->rows[i];
        const uint32_t *mask = job->bitmask + row * job->words;
        char *out = job->logits + row * job->vocab * job->itemsize;
        if (job->itemsize == 4)
            mask_row_32((uint32_t *)out, mask, job->vocab, job->minus_inf);
        else
            mask_row_16((uint16_t *)out, mask, job->vocab, (uint16_t)job->minus_inf);
    }
}

static int check_buffer(Py_buffer *view, const char *name, int ndim, Py_ssize_t itemsize_a,
                        Py_ssize_t itemsize_b)
{
    if (view->ndim != ndim) {
        PyErr_Format(PyExc_ValueError, "%s must be %d-D, got %d-D", name, ndim, view->ndim);
        return -1;
    }
    if (view->itemsize != itemsize_a && view->itemsize != itemsize_b) {
        PyErr_Format(PyExc_ValueError, "%s has %zd-byte items", name, view->itemsize);
        return -1;
    }
    return 0;
}

static PyObject *apply_rows(PyObject *self, PyObject *args)
{
    PyObject *logits_obj, *bitmask_obj, *rows_obj;
    unsigned long minus_inf; /* "k": any int, its low bits kept (so -inf's signed bits do) */
    int threads;
    (void)self;
    if (!PyArg_ParseTuple(args, "OOOki", &logits_obj, &bitmask_obj, &rows_obj, &minus_inf,
                          &threads))
        return NULL;
    /* Without PyBUF_STRIDES an exporter hands out C-contiguous memory or refuses. */
    Py_buffer logits = {0}, bitmask = {0}, rows = {0};
    PyObject *result = NULL;
    if (PyObject_GetBuffer(logits_obj, &logits, PyBUF_ND | PyBUF_WRITABLE) ||
        PyObject_GetBuffer(bitmask_obj, &bitmask, PyBUF_ND) ||
        PyObject_GetBuffer(rows_obj, &rows, PyBUF_ND))
        goto done;
    if (check_buffer(&logits, "logits", 2, 4, 2) || check_buffer(&bitmask, "bitmask", 2, 4, 4) ||
        check_buffer(&rows, "rows", 1, 8, 8))
        goto done;
    Job job = {
        .logits = logits.buf,
        .itemsize = logits.itemsize,
        .vocab = logits.shape[1],
        .bitmask = bitmask.buf,
        .words = bitmask.shape[1],
        .rows = rows.buf,
        .count = rows.shape[0],
        .minus_inf = (uint32_t)minus_inf,
        .next = 0,
    };
    if (job.words != (job.vocab + 31) / 32 || bitmask.shape[0] != logits.shape[0]) {
        PyErr_Format(PyExc_ValueError, "bitmask [%zd, %zd] does not fit logits [%zd, %zd]",
                     bitmask.shape[0], job.words, logits.shape[0], job.vocab);
        goto done;
    }
    for (Py_ssize_t i = 0; i < job.count; i++) {
        if (job.rows[i] < 0 || job.rows[i] >= logits.shape[0]) {
            PyErr_Format(PyExc_IndexError, "row %lld is outside the %zd logits rows",
                         (long long)job.rows[i], logits.shape[0]);
            goto done;
        }
    }
    Py_ssize_t worth = job.count / MIN_ROWS_PER_THREAD; /* threads, the caller's included */
    if (worth > threads)
        worth = threads;
    pthread_t ids[64];
    Py_ssize_t helpers = worth > 1 ? worth - 1 : 0;
    if (helpers > 64)
        helpers = 64;
    Py_BEGIN_ALLOW_THREADS
    Py_ssize_t started = 0;
    while (started < helpers && pthread_create(&ids[started], NULL, work, &job) == 0)
        started++;
    work(&job);
    for (Py_ssize_t i = 0; i < started; i++)
        pthread_join(ids[i], NULL);
    Py_END_ALLOW_THREADS
    result = Py_NewRef(Py_None);
done:
    PyBuffer_Release(&logits); /* a no-op for a buffer never taken */
    PyBuffer_Release(&bitmask);
    PyBuffer_Release(&rows);
    return result;
}

static PyMethodDef methods[] = {
    {"apply_rows", apply_rows, METH_VARARGS,
     "apply_rows(logits, bitmask, rows, minus_inf, threads): in each listed row, set the "
     "logits whose mask bit is 0 to the bits minus_inf (logits viewed as 32- or 16-bit "
     "integers [rows, vocab], bitmask int32 [rows, ceil(vocab/32)], rows int64)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    .m_base = PyModuleDef_HEAD_INIT,
    .m_name = "_maskkernel",
    .m_doc = "The CPU mask kernel (see grammarmask.kernels).",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC PyInit__maskkernel(void) { return PyModule_Create(&module); }
