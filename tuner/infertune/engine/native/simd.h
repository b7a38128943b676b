/* Vector helpers shared by the engine's kernels (AVX2 + FMA; every file is built with both). */
#ifndef INFERTUNE_SIMD_H
#define INFERTUNE_SIMD_H
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

typedef uint16_t bf16_t;

/* exp(x) for 8 floats, Cephes-style: within 2 ulp of expf over [-87.3, 88.4] (clamped there). */
static inline __m256 exp256(__m256 x)
{
    x = _mm256_max_ps(_mm256_min_ps(x, _mm256_set1_ps(88.3762626647949f)), _mm256_set1_ps(-87.3f));
    __m256 fx = _mm256_floor_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f)));
    x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
    x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), x);
    __m256 y = _mm256_set1_ps(1.9875691500E-4f);
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507E-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073E-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894E-2f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459E-1f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201E-1f));
    y = _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.0f)));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(fx), _mm256_set1_epi32(0x7f)), 23);
    return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}

static inline float hsum(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* bf16 <-> fp32. Rounding is to nearest, ties to even, as torch's .to(torch.bfloat16) (NaN
 * stays NaN; the engine never produces one from finite weights). */
static inline float bf2f(bf16_t v)
{
    uint32_t u = (uint32_t)v << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline bf16_t f2bf(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (bf16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (bf16_t)(u >> 16);
}

/* Eight floats rounded to bf16 precision (kept as floats). */
static inline __m256 round8_bf16(__m256 v)
{
    __m256i u = _mm256_castps_si256(v);
    __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    u = _mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), lsb));
    return _mm256_castsi256_ps(_mm256_and_si256(u, _mm256_set1_epi32((int)0xffff0000u)));
}

static inline __m256 load8_bf16(const bf16_t *p)
{
    __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}

/* Stores eight floats already rounded by round8_bf16 (their low halves are zero). */
static inline void store8_bf16(bf16_t *p, __m256 rounded)
{
    __m256i t = _mm256_srli_epi32(_mm256_castps_si256(rounded), 16);
    _mm_storeu_si128((__m128i *)p, _mm_packus_epi32(_mm256_castsi256_si128(t), _mm256_extracti128_si256(t, 1)));
}

/* Activations are fp32 or bf16 (`bf` set); these load and store eight of either as floats.
 * A bf16 store rounds; callers that want bf16's rounding on an fp32 value use round8_bf16. */
static inline __m256 ld8(const void *p, long i, int bf)
{
    return bf ? load8_bf16((const bf16_t *)p + i) : _mm256_loadu_ps((const float *)p + i);
}

static inline void st8(void *p, long i, __m256 v, int bf)
{
    if (bf) store8_bf16((bf16_t *)p + i, round8_bf16(v));
    else _mm256_storeu_ps((float *)p + i, v);
}

/* Round to the activation precision (identity for fp32). */
static inline __m256 rnd8(__m256 v, int bf) { return bf ? round8_bf16(v) : v; }

#endif
