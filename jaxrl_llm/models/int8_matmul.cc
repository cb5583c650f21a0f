// y[R, N] = (x[R, K] W_q) * s[N] for an int8 weight W_q with one float32 scale per output
// column and few rows R (decoding): an XLA FFI handler for the CPU, built and registered by
// `jaxrl_llm/models/int8_cpu.py`, which documents when it is used.
//
// XLA:CPU has no product that reads an int8 weight as int8 when the other operand is float:
// it converts the whole weight to float first (a [K, N] float temporary per product and
// step), so weight-only int8 decoding ran slower than float32. Here each 8 weights are
// converted in registers and used at once, so a product reads K * N bytes once.
//
// Two layouts of W_q: [K, N] (a projection, or an untied LM head [D, V]; `transposed` false)
// is streamed row by row into R accumulator rows of N floats (all of W_q's rows k..k+3 meet
// every accumulator while it is in L1); [N, K] (a tied embedding [V, D] used as the LM head;
// `transposed` true) gives each output a dot product over one contiguous row of W_q.
// Work is split over the CPU client's thread pool: [K, N] by blocks of W_q's rows (each part
// its own accumulators, summed at the end), [N, K] by blocks of outputs.
// With AVX-512 (`-march=native` on such a host) the loops take 16 columns, or 16 of a row's
// weights, at a time: every output is the same sum in the same order as in the AVX2 loops,
// so the two paths agree bit for bit (tests/models/test_int8_cpu.py builds both).
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

#include "xla/ffi/api/ffi.h"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define JAXRL_AVX2 1
#endif
#if defined(JAXRL_AVX2) && defined(__AVX512F__)
#define JAXRL_AVX512 1  // the same sums in 16 lanes: fewer instructions, the same bits
#endif

namespace ffi = xla::ffi;

namespace {

#ifdef JAXRL_AVX2
inline __m256 load8(const int8_t* p) {  // 8 int8 -> 8 float32
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)p)));
}

// The [K, N] loops' vector of `width` float32 columns: 8 with AVX2, 16 with AVX-512.
struct Lanes8 {
  using T = __m256;
  static constexpr int64_t width = 8;
  static T weights(const int8_t* p) { return load8(p); }
  static T set1(float v) { return _mm256_set1_ps(v); }
  static T load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, T v) { _mm256_storeu_ps(p, v); }
  static T fma(T a, T b, T c) { return _mm256_fmadd_ps(a, b, c); }
};
#endif

#ifdef JAXRL_AVX512
inline __m512 load16(const int8_t* p) {  // 16 int8 -> 16 float32
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)p)));
}

inline __m256 high8(__m512 a) {  // lanes 8-15 (AVX-512F alone has no float extract of 8)
  return _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1));
}

struct Lanes16 {
  using T = __m512;
  static constexpr int64_t width = 16;
  static T weights(const int8_t* p) { return load16(p); }
  static T set1(float v) { return _mm512_set1_ps(v); }
  static T load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, T v) { _mm512_storeu_ps(p, v); }
  static T fma(T a, T b, T c) { return _mm512_fmadd_ps(a, b, c); }
};
#endif

#ifdef JAXRL_AVX2
// Prefetches the 4 rows of W_q starting at p (row stride N), one cache line of each: the
// hardware prefetcher follows one stream well, four short interleaved ones late.
inline void prefetch4(const int8_t* p, int64_t N) {
  _mm_prefetch(reinterpret_cast<const char*>(p), _MM_HINT_T0);
  _mm_prefetch(reinterpret_cast<const char*>(p + N), _MM_HINT_T0);
  _mm_prefetch(reinterpret_cast<const char*>(p + 2 * N), _MM_HINT_T0);
  _mm_prefetch(reinterpret_cast<const char*>(p + 3 * N), _MM_HINT_T0);
}

// acc[N] += x[k:k+4] W_q[k:k+4, :] for one row of x (the decode case), V::width columns at a
// time from column j; returns the first column left (fewer than V::width remain).
template <class V>
inline int64_t kn_one_row(const float* xk, const int8_t* w0, int64_t N, float* acc, int64_t j) {
  const auto x0 = V::set1(xk[0]), x1 = V::set1(xk[1]), x2 = V::set1(xk[2]), x3 = V::set1(xk[3]);
  for (; j + V::width <= N; j += V::width) {
    if ((j & 63) == 0) prefetch4(w0 + 4 * N + j, N);  // the next block's same columns
    auto v = V::load(acc + j);
    v = V::fma(V::weights(w0 + j), x0, v);
    v = V::fma(V::weights(w0 + N + j), x1, v);
    v = V::fma(V::weights(w0 + 2 * N + j), x2, v);
    v = V::fma(V::weights(w0 + 3 * N + j), x3, v);
    V::store(acc + j, v);
  }
  return j;
}

// The same for R rows of x: each V::width x 4 weights are converted once and used by every row.
template <class V>
inline int64_t kn_rows_block(const float* x, int64_t K, int64_t k, const int8_t* w0, int64_t N,
                             int64_t R, float* acc, int64_t j) {
  for (; j + V::width <= N; j += V::width) {
    if ((j & 63) == 0) prefetch4(w0 + 4 * N + j, N);
    const auto f0 = V::weights(w0 + j), f1 = V::weights(w0 + N + j);
    const auto f2 = V::weights(w0 + 2 * N + j), f3 = V::weights(w0 + 3 * N + j);
    for (int64_t r = 0; r < R; ++r) {
      const float* xr = x + r * K + k;
      float* a = acc + r * N + j;
      auto v = V::load(a);
      v = V::fma(f0, V::set1(xr[0]), v);
      v = V::fma(f1, V::set1(xr[1]), v);
      v = V::fma(f2, V::set1(xr[2]), v);
      v = V::fma(f3, V::set1(xr[3]), v);
      V::store(a, v);
    }
  }
  return j;
}

// Rows k..k+3 of W_q into acc[R, :N / 8 * 8]: 16 columns at a time where AVX-512 is, then 8.
inline void kn_block(const float* x, int64_t K, int64_t k, const int8_t* w0, int64_t N,
                     int64_t R, float* acc) {
  int64_t j = 0;
  if (R == 1) {
#ifdef JAXRL_AVX512
    j = kn_one_row<Lanes16>(x + k, w0, N, acc, j);
#endif
    kn_one_row<Lanes8>(x + k, w0, N, acc, j);
    return;
  }
#ifdef JAXRL_AVX512
  j = kn_rows_block<Lanes16>(x, K, k, w0, N, R, acc, j);
#endif
  kn_rows_block<Lanes8>(x, K, k, w0, N, R, acc, j);
}
#endif

// acc[R, N] += x[R, k0:k1] W_q[k0:k1, :] for W_q [K, N].
void kn_rows(const float* x, int64_t K, const int8_t* w, int64_t N, int64_t R, int64_t k0,
             int64_t k1, float* acc) {
  int64_t k = k0;
#ifdef JAXRL_AVX2
  const int64_t n8 = N / 8 * 8;  // columns the vector loops cover; the rest below
  for (; k + 4 <= k1; k += 4) {
    const int8_t* w0 = w + k * N;
    kn_block(x, K, k, w0, N, R, acc);
    for (int64_t j = n8; j < N; ++j)
      for (int64_t r = 0; r < R; ++r) {
        const float* xr = x + r * K + k;
        acc[r * N + j] += w0[j] * xr[0] + w0[N + j] * xr[1] + w0[2 * N + j] * xr[2] +
                          w0[3 * N + j] * xr[3];
      }
  }
#endif
  for (; k < k1; ++k) {
    const int8_t* wk = w + k * N;
    for (int64_t r = 0; r < R; ++r) {
      const float xv = x[r * K + k];
      float* a = acc + r * N;
      for (int64_t j = 0; j < N; ++j) a[j] += xv * wk[j];
    }
  }
}

#ifdef JAXRL_AVX2
inline float hsum(__m256 a) {
  __m128 h = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  h = _mm_add_ps(h, _mm_movehl_ps(h, h));
  return _mm_cvtss_f32(_mm_add_ss(h, _mm_movehdup_ps(h)));
}
#endif

// out[r] = x[r, :] . W_q[n, :] for up to 2 rows of x: four accumulators a row, so four
// independent FMA chains hide the FMA's latency.
inline void nk_dot2(const float* xr, int64_t K, const int8_t* wn, int64_t rr, float* out) {
  int64_t d = 0;
#ifdef JAXRL_AVX2
  __m256 a[2][4];
  for (auto& row : a)
    for (auto& v : row) v = _mm256_setzero_ps();
#ifdef JAXRL_AVX512
  // a[r][0] | a[r][1] and a[r][2] | a[r][3] in two registers: each lane sums what it does
  // in the 8-lane loop below, in the same order.
  __m512 b[2][2];
  for (auto& row : b)
    for (auto& v : row) v = _mm512_setzero_ps();
  for (; d + 32 <= K; d += 32) {
    const __m512 f01 = load16(wn + d), f23 = load16(wn + d + 16);
    for (int64_t r = 0; r < rr; ++r) {
      b[r][0] = _mm512_fmadd_ps(f01, _mm512_loadu_ps(xr + r * K + d), b[r][0]);
      b[r][1] = _mm512_fmadd_ps(f23, _mm512_loadu_ps(xr + r * K + d + 16), b[r][1]);
    }
  }
  for (int64_t r = 0; r < rr; ++r) {
    a[r][0] = _mm512_castps512_ps256(b[r][0]);
    a[r][1] = high8(b[r][0]);
    a[r][2] = _mm512_castps512_ps256(b[r][1]);
    a[r][3] = high8(b[r][1]);
  }
#endif
  for (; d + 32 <= K; d += 32)
    for (int u = 0; u < 4; ++u) {
      const __m256 f = load8(wn + d + 8 * u);
      for (int64_t r = 0; r < rr; ++r)
        a[r][u] = _mm256_fmadd_ps(f, _mm256_loadu_ps(xr + r * K + d + 8 * u), a[r][u]);
    }
  for (; d + 8 <= K; d += 8) {
    const __m256 f = load8(wn + d);
    for (int64_t r = 0; r < rr; ++r)
      a[r][0] = _mm256_fmadd_ps(f, _mm256_loadu_ps(xr + r * K + d), a[r][0]);
  }
  for (int64_t r = 0; r < rr; ++r)
    out[r] = hsum(_mm256_add_ps(_mm256_add_ps(a[r][0], a[r][1]),
                                _mm256_add_ps(a[r][2], a[r][3])));
#else
  for (int64_t r = 0; r < rr; ++r) out[r] = 0.0f;
#endif
  for (; d < K; ++d)
    for (int64_t r = 0; r < rr; ++r) out[r] += xr[r * K + d] * wn[d];
}

// y[R, n0:n1] = (x[R, K] W_q[n0:n1, :]^T) * s[n0:n1] for W_q [N, K].
void nk_rows(const float* x, int64_t K, const int8_t* w, const float* s, int64_t N, int64_t R,
             int64_t n0, int64_t n1, float* y) {
  for (int64_t n = n0; n < n1; ++n)
    for (int64_t r0 = 0; r0 < R; r0 += 2) {
      float out[2];
      const int64_t rr = std::min<int64_t>(2, R - r0);
      nk_dot2(x + r0 * K, K, w + n * K, rr, out);
      for (int64_t r = 0; r < rr; ++r) y[(r0 + r) * N + n] = out[r] * s[n];
    }
}

// Runs work(i) for every i in [0, n) on this thread and up to `threads` - 1 pool tasks. This
// thread waits only for items another thread has claimed (so is running), never for a task
// still queued behind other work: a busy pool cannot deadlock it. A task that starts after
// the last item was claimed touches only the shared counters, which it co-owns.
template <typename F>
void parallel_for(ffi::ThreadPool& pool, int64_t threads, int64_t n, const F& work) {
  struct Counters {
    std::atomic<int64_t> next{0};
    std::atomic<int64_t> done{0};
  };
  auto c = std::make_shared<Counters>();
  const F* body = &work;
  auto drain = [c, n, body]() {
    for (int64_t i; (i = c->next.fetch_add(1, std::memory_order_relaxed)) < n;) {
      (*body)(i);
      c->done.fetch_add(1, std::memory_order_release);
    }
  };
  for (int64_t t = 1; t < std::min(threads, n); ++t) {
    auto task = drain;  // the pool takes its own copy
    pool.Schedule(std::move(task));
  }
  drain();
  while (c->done.load(std::memory_order_acquire) < n) {
#ifdef JAXRL_AVX2
    _mm_pause();
#else
    std::this_thread::yield();
#endif
  }
}

constexpr int64_t kRowBlock = 256;          // [N, K]: outputs per work item
constexpr int64_t kBytesPerPart = 1 << 18;  // [K, N]: no split below 256 KB of weight

ffi::Error Int8Matmul(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::S8> w,
                      ffi::Buffer<ffi::F32> s, ffi::ResultBuffer<ffi::F32> y,
                      bool transposed) {
  const auto xd = x.dimensions();
  const auto wd = w.dimensions();
  if (xd.size() != 2 || wd.size() != 2 || s.dimensions().size() != 1)
    return ffi::Error::InvalidArgument("int8_matmul: x [R, K], w 2-D and s [N] expected");
  const int64_t R = xd[0], K = xd[1];
  const int64_t N = transposed ? wd[0] : wd[1];
  if ((transposed ? wd[1] : wd[0]) != K || s.dimensions()[0] != N)
    return ffi::Error::InvalidArgument("int8_matmul: operand shapes do not match");
  const float* xp = x.typed_data();
  const int8_t* wp = w.typed_data();
  const float* sp = s.typed_data();
  float* yp = y->typed_data();
  const int64_t threads = std::max<int64_t>(1, pool.num_threads());
  if (transposed) {
    const int64_t blocks = (N + kRowBlock - 1) / kRowBlock;
    parallel_for(pool, threads, blocks, [&](int64_t b) {
      nk_rows(xp, K, wp, sp, N, R, b * kRowBlock, std::min(N, (b + 1) * kRowBlock), yp);
    });
    return ffi::Error::Success();
  }
  const int64_t parts = std::clamp<int64_t>(K * N / kBytesPerPart, 1, std::min(threads, K));
  std::vector<float> acc(parts * R * N, 0.0f);
  parallel_for(pool, threads, parts, [&](int64_t p) {
    kn_rows(xp, K, wp, N, R, K * p / parts, K * (p + 1) / parts, acc.data() + p * R * N);
  });
  for (int64_t i = 0; i < R * N; ++i) {
    float sum = acc[i];
    for (int64_t p = 1; p < parts; ++p) sum += acc[p * R * N + i];
    yp[i] = sum * sp[i % N];
  }
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxrlInt8Matmul, Int8Matmul,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::S8>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<bool>("transposed"));
