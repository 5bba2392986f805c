/* eg_cuda.h — the one extern "C" surface of the CUDA kernels (the .cu files in kernels/).
 *
 * Plain C types only: device pointers, ints, floats, and a cudaStream_t passed as
 * void *. The kernels know tensor shapes and formats, never layers, configs or model
 * semantics: engine/backend_cuda.c maps the ops of backend.h onto these calls.
 * Every launcher returns a cudaError_t as int (0 = success): the result of
 * cudaGetLastError() after its launches, so a bad launch configuration is reported at
 * the call; faults inside kernels surface at the next synchronisation.
 * Nothing here allocates device memory or synchronises the host: scratch is passed in.
 * Activations are FP32 row-major; BF16 values are uint16_t bit patterns (RNE rounding).
 * Thread safety: launchers are reentrant; ordering is the caller's stream. */
#ifndef EG_CUDA_H
#define EG_CUDA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Weight formats; the numeric values equal engine/weights.h's eg_wfmt (checked there). */
enum { EGK_F32 = 1, EGK_BF16 = 2, EGK_F16 = 3, EGK_INT4 = 4, EGK_FP8 = 5 };

/* A 2-D weight [rows][cols] in device memory.
 * INT4: data int32 [rows][cols/8] (column 8j+i in bits 4i..4i+3, value nibble-8),
 *       scale bf16 [rows][ceil(cols/group)].
 * FP8:  data e4m3 [rows][cols], scale f32 [ceil(rows/128)][ceil(cols/128)] (multiplies). */
typedef struct egk_weight {
    int fmt;
    int group;
    int64_t rows, cols;
    const void *data;
    const void *scale;
} egk_weight;

const char *egk_error_name(int code);
const char *egk_error_string(int code);

/* ---- elementwise (kernels/elementwise.cu) ----------------------------------------- */
/* x[t][:] = E[tokens[t]][:] (E F32/BF16/F16); an id outside [0, E.rows) gives a zero row. */
int egk_embed(const int32_t *tokens, int T, egk_weight E, float *x, void *stream);
/* y = x / sqrt(mean(x^2) + eps) * w, per row of D (sum of squares in FP64, like the CPU). */
int egk_rmsnorm(const float *x, egk_weight w, int T, int D, float eps, float *y, void *stream);
/* x += dx; y = rmsnorm(x). */
int egk_add_rmsnorm(float *x, const float *dx, egk_weight w, int T, int D, float eps, float *y, void *stream);
/* x += dx over n elements. */
int egk_add(float *x, const float *dx, int64_t n, void *stream);
/* y = bf16(x) (RNE), n elements; when lo is not NULL also lo = bf16(x - y), so that
 * y + lo carries ~16 mantissa bits (two BF16 GEMMs then give near-FP32 products). */
int egk_f32_to_bf16(const float *x, uint16_t *y, uint16_t *lo, int64_t n, void *stream);
/* h = silu(g) * u; written as FP32 to hf and/or BF16 to hb (+ its residual to hb_lo);
 * any of the three may be NULL. */
int egk_swiglu(const float *g, const float *u, float *hf, uint16_t *hb, uint16_t *hb_lo, int64_t n, void *stream);
/* y[i] = (accumulate ? y[i] : 0) + a[i] + b[i], added in that order, n elements. */
int egk_add_pair(float *y, const float *a, const float *b, int64_t n, int accumulate, void *stream);
/* out[i][:] = x[idx[i]][:], rows of D floats. n_src > 0: x has n_src rows, and a row whose
 * index is outside [0, n_src) is written as zeros (indices that arrived over a link: an
 * aborted receive leaves its buffer as it was); n_src <= 0: the indices are trusted. */
int egk_gather_rows(const float *x, const int32_t *idx, int n, int D, int64_t n_src, float *out, void *stream);
/* out[r - row0][:] = bf16(dequant(w row r)) for r in [row0, row0+nrows). */
int egk_dequant_bf16(egk_weight w, int64_t row0, int64_t nrows, uint16_t *out, void *stream);
/* Fill n elements of dst with engine/weight_rand.c's counter-based draw (the same values
 * bit for bit): BF16/F32 mean + std*U; INT4 words of 8 nibbles in 1..15; BF16 group
 * scales std*(0.8+0.4u). Benchmarks draw a preset's weights with it, no upload. */
enum { EGK_RAND_BF16 = 0, EGK_RAND_F32 = 1, EGK_RAND_INT4_WORDS = 2, EGK_RAND_SCALE_BF16 = 3 };
int egk_fill_random(void *dst, int64_t n, int kind, uint64_t seed, float mean, float std, void *stream);

/* ---- dequantising GEMM (kernels/gemm.cu) -------------------------------------------- */
/* y[t][r] (+)= sum_c x[t][c] * W[r][c] for t < T, r < W.rows; x row stride W.cols,
 * y row stride W.rows. Any format, weights dequantised on the fly, FP32 arithmetic.
 * The BF16 fast path is cuBLAS (called by the backend); this serves INT4, FP8, F16, F32
 * and anything cuBLAS does not take. */
int egk_gemm(const float *x, int T, egk_weight W, float *y, int accumulate, void *stream);

/* ---- MoE (kernels/gemm.cu) -------------------------------------------------------- */
/* One local expert's tensors (formats/shapes shared by all experts of a call). */
typedef struct egk_expert_ptrs {
    const void *gate, *gate_s; /* [F][H] */
    const void *up, *up_s;     /* [F][H] */
    const void *down, *down_s; /* [H][F] */
} egk_expert_ptrs;

/* Workspace of one MoE call over at most max_rows = T*K routed rows. */
typedef struct egk_moe_ws {
    int32_t *row_tk;     /* [max_rows] (t*K+k) of each permuted row */
    int32_t *rowmap;     /* [max_rows] permuted row of (t*K+k), -1 when outside [e0,e1) */
    int32_t *offsets;    /* [n_local+1] first row of each local expert */
    int32_t *tiles;      /* [max_tiles][2] (local expert, first row) */
    int32_t *ntiles;     /* [1] */
    float *h;            /* [max_rows][F] silu(gate)*up */
    float *o;            /* [max_rows][H] weighted expert outputs */
    float *part;         /* [EGK_MOE_KSPLIT][part_rows][max(2F, H)] split-K partial sums */
    int max_rows, max_tiles;
    int part_rows;       /* calls with T*K <= part_rows may split K (decode); 0 = never */
} egk_moe_ws;

/* Rows per grouped-GEMM tile. max_tiles must be >= the grid bound egk_moe uses,
 * (max_rows + min(n_local, max_rows) * (EGK_MOE_BM - 1)) / EGK_MOE_BM, which
 * max_rows / EGK_MOE_BM + n_local + 1 always covers. */
#define EGK_MOE_BM 32
/* At most this many K splits on the tensor-core path for small calls (few rows per
 * expert: one k-loop per block would leave most of the GPU idle); the partial sums are
 * added in split order by a second kernel, so results do not depend on scheduling. */
#define EGK_MOE_KSPLIT 4
#define EGK_MOE_SPLIT_ROWS 64

/* y[t] += sum_k weights[t][k] * expert_{ids[t][k]}(x[t]) for experts in [e0, e1).
 * tab: device array [e1-e0] of egk_expert_ptrs (local index e - e0). fmt/group: the
 * experts' format. Deterministic: each token's sum goes in ascending expert id (the
 * reference's order; engine/backend.h eg_moe_order) and rows never race. */
/* path: EGK_MOE_AUTO takes the tensor-core path (mma.sync, W4A16/W16A16 with the
 * activations as BF16 hi + lo pairs, so products stay near FP32) for INT4 experts with
 * group 32 and BF16 experts, when H and F are multiples of 64; EGK_MOE_SIMT forces the
 * FP32 CUDA-core tiles (every format). */
/* EGK_MOE_REG: the tensor-core path with INT4 weights prefetched one k-step ahead in
 * registers and expanded to a BF16 tile in shared memory (AUTO streams INT4 weights
 * through a 4-stage cp.async pipeline instead; before/after measurements). */
enum { EGK_MOE_AUTO = 0, EGK_MOE_SIMT = 1, EGK_MOE_REG = 2 };
int egk_moe(const float *x, int T, int H, int F, const int32_t *ids, const float *weights, int K, int e0, int e1,
            const egk_expert_ptrs *tab, int fmt, int group, const egk_moe_ws *ws, int path, float *y, void *stream);

/* ---- MLA attention (kernels/mla.cu) ---------------------------------------------- */
typedef struct egk_mla {
    int T, NH, C, DN, DR, DV;  /* tokens, all heads, latent, nope/rope/value dims */
    int h0, h1;                /* heads computed */
    const int32_t *pos, *slot; /* [T] */
    const int32_t *block_table;/* [S][MB] */
    int max_blocks, block_size;
    int max_pos;               /* max pos + 1 over the call */
    const float *q;            /* [T][NH][DN+DR] */
    const float *kv;           /* [T][C+DR] raw latent, unrotated k_pe */
    egk_weight kv_norm;        /* [C] */
    uint16_t *cache;           /* [blocks][BS][C+DR] bf16 */
    const float *inv_freq;     /* [DR/2] */
    float attn_factor, scale, eps;
    /* scratch */
    uint16_t *q_bf16;          /* [T][NH][DN+DR]: nope part written (for the W_UK GEMM) */
    uint16_t *q_bf16_lo;       /* same layout: bf16(q - q_bf16), or NULL (single BF16) */
    float *q_pe;               /* [T][NH][DR] rotated */
    const float *q_lat;        /* [T][NH][C] absorbed queries (the W_UK GEMM's output) */
    float *part_o;             /* [part_rows][C] */
    float *part_ml;            /* [part_rows][2] (max, sum) */
    int64_t part_rows;         /* capacity in (token, head, split) rows */
    uint16_t *o_lat;           /* [T][NH][C] bf16 attention output in latent space */
    uint16_t *o_lat_lo;        /* same layout: bf16(o - o_lat), or NULL */
    int simt;                  /* 1: the CUDA-core attention kernel even where the tensor-core
                                  one applies (before/after measurements) */
    int tile_rows;             /* tensor-core kernel's cache rows per tile: 0 = by the device's
                                  shared memory (32 on sm_90, 16 on sm_120), 16 or 32 forced */
} egk_mla;

/* Step 1: write every token's normalised latent and rotated k_pe to the cache (BF16
 * RNE), rotate q_pe into q_pe and convert q_nope to q_bf16 for heads [h0, h1). */
int egk_mla_prep(const egk_mla *a, void *stream);
/* Step 3 (after the caller's q_lat = q_nope W_UK GEMM): flash-style attention over
 * positions 0..pos[t] of each token's slot, split along the sequence, LSE combine,
 * o_lat written as BF16 for the caller's W_UV GEMM. Where C % 32 == 0, C <= 512 and
 * C + DR is even (Kimi: 512, 64) a block serves 16 heads on tensor cores, reading
 * each cache row once for all of them; otherwise one block per head on CUDA cores. */
int egk_mla_attend(const egk_mla *a, void *stream);
/* The number of sequence splits egk_mla_attend will use (for tests and tuning). */
int egk_mla_splits(const egk_mla *a);

/* ---- plain MHA/GQA attention (kernels/attn.cu) ---------------------------------- */
typedef struct egk_gqa {
    int T, NH, NKV, HD;        /* rows, heads, kv heads (divides NH), head dim (even) */
    int BS, MB;                /* positions per cache block, blocks per slot */
    const int32_t *pos, *slot; /* [T] */
    const int32_t *table;      /* [S][MB] physical block of each logical block (mapped) */
    const float *q;            /* [T][NH][HD] unrotated */
    const float *k, *v;        /* [T][NKV][HD], k unrotated */
    uint16_t *k_cache, *v_cache; /* [n_blocks][BS][NKV][HD] bf16 */
    const float *inv_freq;     /* [HD/2] */
    float scale;               /* softmax scale */
    int window;                /* > 0: attend to positions (pos - window, pos] only */
    float *out;                /* [T][NH][HD] */
} egk_gqa;
/* Rotate-half RoPE on k (angle pos * inv_freq[i] in FP64, pairs i, i + HD/2), k and v
 * written to the caches as BF16 (RNE) at (slot[t], pos[t]), that is row
 * table[slot][pos / BS] * BS + pos % BS; then, per (row, kv head), the rotated q of the
 * NH / NKV heads it serves attends over positions [0, pos[t]] of its slot, or its last
 * `window` of them (pos[t] - window, pos[t]] with a sliding window: online softmax over
 * tiles of up to 64 positions, FP32, each tile's cache rows read once for all those
 * heads. Two launches in stream order: all rows are written before any attends. No
 * scratch. The caches must be 4-byte aligned (read as BF16 pairs). */
int egk_gqa_attention(const egk_gqa *a, void *stream);
/* The attend launch's dynamic shared memory for these heads (0 for shapes it refuses);
 * above 48 KB the launch opts in, which the device must allow. */
size_t egk_gqa_smem_bytes(int NH, int NKV, int HD);
/* dst[r][0..width) = src[r][0..width), row strides in floats, r < rows. */
int egk_copy_rows(float *dst, int64_t dst_stride, const float *src, int64_t src_stride, int rows, int64_t width,
                  void *stream);

/* ---- router (kernels/router.cu) -------------------------------------------------- */
/* From FP32 logits [T][E]: s = sigmoid, biased = s + bias (bias F32/BF16 [E] or
 * fmt 0 = none), keep topk_group of n_group groups by their top-2 biased sum, then topk
 * experts by biased score (ties: lower id); weights = s (/ sum when norm_topk) * scale.
 * ids/weights [T][topk] in descending biased order. */
int egk_router_select(const float *logits, int T, int E, egk_weight bias, int n_group, int topk_group, int topk,
                      int norm_topk, float routed_scale, int32_t *ids, float *weights, void *stream);

/* ---- sampling (kernels/sample.cu) ------------------------------------------------ */
/* Per-row parameters; u is the row's uniform draw in [0,1) (drawn by the host from the
 * row's RNG state so states advance exactly as eg_rng_uniform does). */
typedef struct egk_sample_row {
    float temperature, top_p;
    int top_k;
    int pad;
    double u;
} egk_sample_row;

/* The same answers without sorting the vocabulary: per row, the first M candidates in
 * that order (radix select on the logits' bits, then a sort of M in shared memory; M <=
 * EGK_SAMPLE_TOPM_MAX). Exact when top_k (or V) <= M; otherwise exact whenever the top_p
 * cut and the draw fall within the first M (the total mass is summed over the whole
 * row), and out[i] = -1 where they do not: the caller sorts those rows (egk_sample_rows). */
#define EGK_SAMPLE_TOPM_MAX 2048
int egk_sample_topm(const float *logits, int N, int V, const egk_sample_row *rows, int M, int32_t *out, void *stream);
/* out[i] = the probability row i's distribution (eg_sample_row's: temperature, top_k,
 * top_p) gives token tok[i], from the same top-M selection (rows with tok[i] < 0
 * untouched; u unused). Exact where the first M settle the kept set (top_k <= M, the
 * top_p cut inside them, or no cut at all); NaN where they do not and for greedy rows:
 * the caller computes those. The sums are parallel: the host's sequential ones can
 * differ in the last bits. */
int egk_token_probs(const float *logits, int N, int V, const egk_sample_row *rows, const int32_t *tok, int M,
                    double *out, void *stream);
/* The kept set of logits row which[i] (device [N]; rows[i] its parameters, u unused), from
 * the same selection: n_out[i] = its size n and ids / probs [i][0..n) (rows of stride M)
 * its candidates in eg_sample_row's order with egk_token_probs' p, where the first M
 * settle it and it is cut to at most M ids; n_out[i] = -1 otherwise (a top_k above M, a
 * top_p cut beyond them, nothing cut over more than M ids) and for greedy rows. */
int egk_kept_probs(const float *logits, int N, int V, const int32_t *which, const egk_sample_row *rows, int M,
                   int32_t *n_out, int32_t *ids, double *probs, void *stream);
/* The sorting path for the n rows listed in which (device [n], distinct): their logits
 * sorted in place of the [N][V] layout (keys, ids_out), sampled, out[which[j]] written;
 * other rows of out untouched. seg: [2n] scratch. Greedy rows are not expected here. */
int egk_sample_rows(const float *logits, int N, int V, const egk_sample_row *rows, const int32_t *which, int n,
                    float *keys, int32_t *ids_in, int32_t *ids_out, int32_t *seg, void *temp, size_t temp_bytes,
                    int32_t *out, void *stream);
/* Bytes of the sort workspace for N rows of V logits. */
size_t egk_sample_temp_bytes(int N, int V);
/* out[i] = token for row i of logits [N][V]. Greedy rows (temperature <= 0): the lowest
 * id among equal maxima. Others: candidates sorted by (logit desc, id asc), top_k, then
 * softmax at temperature in FP64, top_p cut, pick the first whose cumulative mass
 * exceeds u * kept mass: eg_sample_row's algorithm. any_random = 0 skips the sort.
 * Scratch: keys [N][V] f32, ids_in/ids_out [N][V] i32, offsets [N+1] i32, temp. */
int egk_sample(const float *logits, int N, int V, const egk_sample_row *rows, int any_random, float *keys,
               int32_t *ids_in, int32_t *ids_out, int32_t *offsets, void *temp, size_t temp_bytes, int32_t *out,
               void *stream);

/* ---- expert-parallel exchange (kernels/ep.cu) ------------------------------------- */
/* Group a rank's T*K (token, k) pairs by destination rank d, the owner of the pair's
 * expert in the call's range [lo, lo + ne) split evenly over R ranks (rank d from
 * lo + floor(d ne / R)); a pair outside the range goes nowhere (tk2pair -1).
 * counts [2][R][4]: counts[d] = {rows, pairs, layer, left} of what goes to d (row = a
 * token with at least one expert on d, sent once); counts[R + rank] = counts[rank].
 * Segments in destination order: sendtok [rows] token of each row; meta [3*pairs]:
 * destination d's segment at 3*(pairs before d) holds row-in-segment [n], expert id [n]
 * and weight (FP32 bits) [n] of its n pairs, in (t, k) order; tk2pair [T*K] the pair's
 * position over all segments. T = 0 writes the counts only. */
int egk_ep_pack(const int32_t *ids, const float *weights, int T, int K, int R, int lo, int ne, int rank, int layer,
                int left, int32_t *counts, int32_t *sendtok, int32_t *meta, int32_t *tk2pair, void *stream);
/* y[t] += back[tk2pair[t*K+k]] (rows of H) over the token's k in ascending expert id
 * (ids [T][K], the router's), pairs with tk2pair -1 skipped: the unsplit moe's sum, or
 * its continuation over a range. */
int egk_ep_combine(const float *back, const int32_t *tk2pair, const int32_t *ids, int T, int K, int H, float *y,
                   void *stream);

#ifdef __cplusplus
}
#endif

#endif
