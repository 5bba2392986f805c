/* Shard pieces: sample records, index and trailer; see format.h and docs/FORMAT.md. */
#include "dataset/format.h"

#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <zstd.h>
#include <zstd_errors.h>

/* ---------------------------------------------------------------- little endian */
static void put32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static void put64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static int all_zero(const uint8_t *p, size_t n) {
    while (n--)
        if (*p++) return 0;
    return 1;
}

static uint32_t get32(const uint8_t *p) {
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}
static uint64_t get64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

uint32_t eg_ds_crc32(const void *data, size_t n) {
    static uint32_t table[256];
    static int ready; /* benign race: every thread computes the same table */
    if (!__atomic_load_n(&ready, __ATOMIC_ACQUIRE)) {
        for (uint32_t i = 0; i < 256; i++) {
            uint32_t c = i;
            for (int k = 0; k < 8; k++) c = c & 1 ? 0xedb88320u ^ (c >> 1) : c >> 1;
            table[i] = c;
        }
        __atomic_store_n(&ready, 1, __ATOMIC_RELEASE);
    }
    const uint8_t *p = data;
    uint32_t c = 0xffffffffu;
    for (size_t i = 0; i < n; i++) c = table[(c ^ p[i]) & 0xff] ^ (c >> 8);
    return c ^ 0xffffffffu;
}

void eg_ds_bf16_split(const uint16_t *src, size_t n, uint8_t *dst) {
    for (size_t i = 0; i < n; i++) {
        dst[i] = (uint8_t)(src[i] >> 8);
        dst[n + i] = (uint8_t)src[i];
    }
}

void eg_ds_bf16_join(const uint8_t *src, size_t n, uint16_t *dst) {
    for (size_t i = 0; i < n; i++) dst[i] = (uint16_t)((uint16_t)src[i] << 8 | src[n + i]);
}

const char *eg_ds_finish_name(eg_ds_finish f) { return f == EG_DS_FINISH_LENGTH ? "length" : "stop"; }

void eg_ds_sample_clear(eg_ds_sample *s) {
    if (!s) return;
    free(s->id);
    free(s->source_file);
    free(s->input_ids);
    free(s->loss_mask);
    free(s->aux_hidden);
    free(s->final_hidden);
    free(s->final_pre_hidden);
    memset(s, 0, sizeof *s);
}

/* ---------------------------------------------------------------- codec */
struct eg_ds_codec {
    ZSTD_CCtx *cctx;
    ZSTD_DCtx *dctx;
    int level, split;
    uint16_t *bf;  /* conversion scratch */
    uint8_t *pl;   /* plane scratch */
    size_t cap_bf, cap_pl;
};

eg_status eg_ds_codec_new(int level, int bf16_split, eg_ds_codec **out, eg_error *err) {
    *out = NULL;
    eg_ds_codec *c = eg_calloc(1, sizeof *c, err);
    if (!c) return EG_ERR_NOMEM;
    c->cctx = ZSTD_createCCtx();
    if (!c->cctx) { free(c); return eg_fail(err, EG_ERR_NOMEM, "cannot create zstd context"); }
    c->level = level;
    c->split = bf16_split;
    if (ZSTD_isError(ZSTD_CCtx_setParameter(c->cctx, ZSTD_c_compressionLevel, level)) ||
        ZSTD_isError(ZSTD_CCtx_setParameter(c->cctx, ZSTD_c_checksumFlag, 1)) ||
        ZSTD_isError(ZSTD_CCtx_setParameter(c->cctx, ZSTD_c_contentSizeFlag, 1))) {
        eg_ds_codec_free(c);
        return eg_fail(err, EG_ERR_INVALID, "bad zstd level %d", level);
    }
    *out = c;
    return EG_OK;
}

void eg_ds_codec_free(eg_ds_codec *c) {
    if (!c) return;
    ZSTD_freeCCtx(c->cctx);
    free(c->bf);
    free(c->pl);
    free(c);
}

static eg_status grow(void **p, size_t *cap, size_t need, eg_error *err) {
    if (*cap >= need) return EG_OK;
    void *q = realloc(*p, need ? need : 1);
    if (!q) return eg_fail(err, EG_ERR_NOMEM, "out of memory (%zu bytes)", need);
    *p = q;
    *cap = need;
    return EG_OK;
}

/* Append one zstd frame of src to *buf at *len. */
static eg_status frame_append(ZSTD_CCtx *cc, const void *src, size_t n, uint8_t **buf,
                              size_t *cap, size_t *len, uint64_t *stored, eg_error *err) {
    size_t bound = ZSTD_compressBound(n);
    if (*cap < *len + bound) {
        size_t nc = (*len + bound) * 5 / 4 + 256;
        uint8_t *q = realloc(*buf, nc);
        if (!q) return eg_fail(err, EG_ERR_NOMEM, "out of memory (%zu bytes)", nc);
        *buf = q;
        *cap = nc;
    }
    size_t r = ZSTD_compress2(cc, *buf + *len, *cap - *len, src, n);
    if (ZSTD_isError(r)) return eg_fail(err, EG_ERR_INVALID, "zstd: %s", ZSTD_getErrorName(r));
    *len += r;
    *stored = r;
    return EG_OK;
}

/* The ranges FORMAT.md §3.2 gives the metadata's numbers, which the writer and both
 * readers hold to (the Python loader's _check_meta is the same table): NULL when s is in
 * range. The sampling bounds are what a sampler means by them, not generate's flag limits. */
static const char *meta_range_problem(const eg_ds_sample *s) {
    if (s->source_line < 0) return "source_line is negative";
    if (s->prompt_len < 0 || s->gen_len < 0 || s->prompt_len > s->T - s->gen_len)
        return "prompt_len + gen_len is not within 0..T";
    if (!(s->temperature >= 0)) return "temperature is negative";
    if (!(s->top_p > 0 && s->top_p <= 1)) return "top_p is not in (0, 1]";
    if (s->top_k < 0) return "top_k is negative";
    return NULL;
}

/* The metadata section's JSON. Refuses what eg_ds_record_decode would refuse: an id or
 * source file that is not valid UTF-8 (JSON cannot hold it), a temperature or top_p that
 * is not finite (JSON has no NaN or infinity), a number out of its range. */
static eg_status meta_json(const eg_ds_sample *s, char **out, eg_error *err) {
    *out = NULL;
    const char *id = s->id ? s->id : "", *src = s->source_file ? s->source_file : "";
    const char *what = NULL;
    if (eg_utf8_valid_prefix(id, strlen(id)) != strlen(id)) what = "id is not valid UTF-8";
    else if (eg_utf8_valid_prefix(src, strlen(src)) != strlen(src)) what = "source_file is not valid UTF-8";
    else if (!isfinite(s->temperature)) what = "temperature is not a finite number";
    else if (!isfinite(s->top_p)) what = "top_p is not a finite number";
    else what = meta_range_problem(s);
    if (what) {
        char *shown = eg_utf8_escape(id);
        eg_fail(err, EG_ERR_INVALID, "sample \"%.200s\" cannot be stored: its %s", shown ? shown : "?", what);
        free(shown);
        return EG_ERR_INVALID;
    }
    json_t *o = json_object();
    char seed[32];
    snprintf(seed, sizeof seed, "%" PRIu64, s->seed);
    int bad = !o;
    bad = bad || json_object_set_new(o, "id", json_string(id));
    bad = bad || json_object_set_new(o, "source_file", json_string(src));
    bad = bad || json_object_set_new(o, "source_line", json_integer(s->source_line));
    bad = bad || json_object_set_new(o, "prompt_len", json_integer(s->prompt_len));
    bad = bad || json_object_set_new(o, "gen_len", json_integer(s->gen_len));
    bad = bad || json_object_set_new(o, "finish", json_string(eg_ds_finish_name(s->finish)));
    bad = bad || json_object_set_new(o, "temperature", json_real(s->temperature));
    bad = bad || json_object_set_new(o, "top_p", json_real(s->top_p));
    bad = bad || json_object_set_new(o, "top_k", json_integer(s->top_k));
    bad = bad || json_object_set_new(o, "seed", json_string(seed));
    char *txt = bad ? NULL : json_dumps(o, JSON_COMPACT | JSON_SORT_KEYS | JSON_REAL_PRECISION(17));
    json_decref(o);
    if (!txt) return eg_fail(err, EG_ERR_NOMEM, "out of memory (sample metadata)");
    *out = txt;
    return EG_OK;
}

eg_status eg_ds_record_encode(eg_ds_codec *c, const eg_ds_sample *s, uint8_t **out,
                              size_t *out_len, uint64_t *raw_bytes, eg_error *err) {
    *out = NULL;
    *out_len = 0;
    if (s->T < 0 || s->T > UINT32_MAX || s->H < 1 || s->H > UINT32_MAX || s->n_aux < 0)
        return eg_fail(err, EG_ERR_INVALID, "sample %s: bad shape T=%" PRId64 " H=%" PRId64
                       " n_aux=%d", s->id ? s->id : "?", s->T, s->H, s->n_aux);
    char *meta;
    eg_status mst = meta_json(s, &meta, err);
    if (mst) return mst;
    size_t meta_len = strlen(meta);
    size_t T = (size_t)s->T, H = (size_t)s->H, na = (size_t)s->n_aux;
    size_t n_aux_el = T * na * H, n_fin_el = T * H;
    size_t cap = EG_DS_RECORD_HEADER_SIZE + ZSTD_compressBound(meta_len) + 64;
    uint8_t *buf = malloc(cap);
    eg_status st = EG_OK;
    uint64_t stored[EG_DS_NSEC] = {0}, raw[EG_DS_NSEC] = {0};
    size_t len = EG_DS_RECORD_HEADER_SIZE;
    if (!buf) { free(meta); return eg_fail(err, EG_ERR_NOMEM, "out of memory"); }
    raw[EG_DS_SEC_META] = meta_len;
    st = frame_append(c->cctx, meta, meta_len, &buf, &cap, &len, &stored[0], err);
    free(meta);
    if (st) goto fail;
    /* input ids as little-endian int32 (the host is little-endian; checked in docs) */
    raw[EG_DS_SEC_IDS] = T * 4;
    st = frame_append(c->cctx, s->input_ids, T * 4, &buf, &cap, &len, &stored[1], err);
    if (st) goto fail;
    raw[EG_DS_SEC_MASK] = T;
    st = frame_append(c->cctx, s->loss_mask, T, &buf, &cap, &len, &stored[2], err);
    if (st) goto fail;
    int both = s->final_pre_hidden != NULL;
    for (int k = 0; k < 2; k++) {
        size_t n = k == 0 ? n_aux_el : n_fin_el * (both ? 2 : 1);
        const void *src = k == 0 ? s->aux_hidden : s->final_hidden;
        const uint16_t *bf;
        if ((st = grow((void **)&c->bf, &c->cap_bf, n * 2, err))) goto fail;
        if (k == 1 && both) {
            /* [2][T][H]: post-norm, then pre-norm */
            for (int q = 0; q < 2; q++) {
                const void *fs = q ? s->final_pre_hidden : s->final_hidden;
                uint16_t *d = c->bf + (size_t)q * n_fin_el;
                if (s->hidden_dtype == EG_DS_F32)
                    for (size_t i = 0; i < n_fin_el; i++) d[i] = eg_f32_to_bf16(((const float *)fs)[i]);
                else
                    memcpy(d, fs, n_fin_el * 2);
            }
            bf = c->bf;
        } else if (k == 0 && s->aux_layer_major && na > 1) {
            /* [n_aux][T][H] -> [T][n_aux][H] */
            for (size_t l = 0; l < na; l++)
                for (size_t t = 0; t < T; t++) {
                    size_t so = (l * T + t) * H, d = (t * na + l) * H;
                    if (s->hidden_dtype == EG_DS_F32)
                        for (size_t h = 0; h < H; h++) c->bf[d + h] = eg_f32_to_bf16(((const float *)src)[so + h]);
                    else
                        memcpy(c->bf + d, (const uint16_t *)src + so, H * 2);
                }
            bf = c->bf;
        } else if (s->hidden_dtype == EG_DS_F32) {
            const float *f = src;
            for (size_t i = 0; i < n; i++) c->bf[i] = eg_f32_to_bf16(f[i]);
            bf = c->bf;
        } else {
            bf = src;
        }
        const void *payload = bf;
        if (c->split) {
            if ((st = grow((void **)&c->pl, &c->cap_pl, n * 2, err))) goto fail;
            eg_ds_bf16_split(bf, n, c->pl);
            payload = c->pl;
        }
        int sec = k == 0 ? EG_DS_SEC_AUX : EG_DS_SEC_FINAL;
        raw[sec] = n * 2;
        st = frame_append(c->cctx, payload, n * 2, &buf, &cap, &len, &stored[sec], err);
        if (st) goto fail;
    }
    uint8_t *h = buf;
    memset(h, 0, EG_DS_RECORD_HEADER_SIZE);
    memcpy(h, EG_DS_RECORD_MAGIC, 4);
    put32(h + 4, EG_DS_FORMAT_VERSION);
    put32(h + 8, (c->split ? EG_DS_FLAG_BF16_SPLIT : 0) | (both ? EG_DS_FLAG_FINAL_BOTH : 0));
    put32(h + 12, (uint32_t)na);
    put32(h + 16, (uint32_t)T);
    put32(h + 20, (uint32_t)H);
    put32(h + 24, EG_DS_NSEC);
    for (int i = 0; i < EG_DS_NSEC; i++) {
        put64(h + 32 + 16 * i, stored[i]);
        put64(h + 40 + 16 * i, raw[i]);
    }
    put32(h + 124, eg_ds_crc32(h, 124));
    *out = buf;
    *out_len = len;
    if (raw_bytes) *raw_bytes = raw[1] + raw[2] + raw[3] + raw[4];
    return EG_OK;
fail:
    free(buf);
    return eg_wrap(err, "sample %s", s->id ? s->id : "?");
}

/* Decompress exactly one frame of `stored` bytes into dst[raw]; demands a checksum. */
static eg_status frame_decode(ZSTD_DCtx *dc, const uint8_t *src, size_t stored, void *dst,
                              size_t raw, const char *what, eg_error *err) {
    /* zstd frame: magic 28 b5 2f fd, then the frame header descriptor whose bit 2 is
     * Content_Checksum_flag (RFC 8878 3.1.1.1.1). */
    if (stored < 6 || get32(src) != 0xFD2FB528u)
        return eg_fail(err, EG_ERR_FORMAT, "%s: not a zstd frame", what);
    if (!(src[4] & 4)) return eg_fail(err, EG_ERR_FORMAT, "%s: zstd frame without checksum", what);
    unsigned long long fcs = ZSTD_getFrameContentSize(src, stored);
    if (fcs != (unsigned long long)raw)
        return eg_fail(err, EG_ERR_FORMAT, "%s: frame holds %lld bytes, header says %zu", what,
                       (long long)fcs, raw);
    size_t r;
    size_t fsz = ZSTD_findFrameCompressedSize(src, stored);
    if (ZSTD_isError(fsz) || fsz != stored)
        return eg_fail(err, EG_ERR_FORMAT, "%s: frame size mismatch (truncated or corrupt)", what);
    r = ZSTD_decompressDCtx(dc, dst, raw ? raw : 1, src, stored);
    if (ZSTD_isError(r)) {
        ZSTD_ErrorCode ec = ZSTD_getErrorCode(r);
        return eg_fail(err, ec == ZSTD_error_checksum_wrong ? EG_ERR_CHECKSUM : EG_ERR_FORMAT,
                       "%s: zstd: %s", what, ZSTD_getErrorName(r));
    }
    if (r != raw) return eg_fail(err, EG_ERR_FORMAT, "%s: decompressed %zu of %zu bytes", what, r, raw);
    return EG_OK;
}

/* Check a section's zstd frame against the header's sizes without decompressing, so
 * nothing is allocated from header values the frame does not back up. */
static eg_status frame_check(const uint8_t *src, size_t stored, uint64_t raw, const char *what,
                             eg_error *err) {
    if (stored < 6 || get32(src) != 0xFD2FB528u)
        return eg_fail(err, EG_ERR_FORMAT, "%s: not a zstd frame", what);
    unsigned long long fcs = ZSTD_getFrameContentSize(src, stored);
    if (fcs == ZSTD_CONTENTSIZE_UNKNOWN || fcs == ZSTD_CONTENTSIZE_ERROR || fcs != (unsigned long long)raw)
        return eg_fail(err, EG_ERR_FORMAT, "%s: frame holds %lld bytes, header says %" PRIu64, what,
                       (long long)fcs, raw);
    size_t fsz = ZSTD_findFrameCompressedSize(src, stored);
    if (ZSTD_isError(fsz) || fsz != stored)
        return eg_fail(err, EG_ERR_FORMAT, "%s: frame size mismatch (truncated or corrupt)", what);
    return EG_OK;
}

static eg_status parse_meta(const char *txt, size_t n, eg_ds_sample *s, eg_error *err) {
    json_error_t je;
    json_t *o = json_loadb(txt, n, JSON_REJECT_DUPLICATES, &je);
    if (!o || !json_is_object(o)) {
        json_decref(o);
        return eg_fail(err, EG_ERR_FORMAT, "metadata: bad JSON: %s", je.text);
    }
    const char *id = json_string_value(json_object_get(o, "id"));
    const char *src = json_string_value(json_object_get(o, "source_file"));
    const char *fin = json_string_value(json_object_get(o, "finish"));
    const char *seed = json_string_value(json_object_get(o, "seed"));
    json_t *sl = json_object_get(o, "source_line"), *pl = json_object_get(o, "prompt_len"),
           *gl = json_object_get(o, "gen_len"), *te = json_object_get(o, "temperature"),
           *tp = json_object_get(o, "top_p"), *tk = json_object_get(o, "top_k");
    if (!id || !src || !fin || !seed || !json_is_integer(sl) || !json_is_integer(pl) ||
        !json_is_integer(gl) || !json_is_number(te) || !json_is_number(tp) || !json_is_integer(tk) ||
        (strcmp(fin, "stop") && strcmp(fin, "length"))) {
        json_decref(o);
        return eg_fail(err, EG_ERR_FORMAT, "metadata: missing or mistyped field");
    }
    char *end;
    errno = 0;
    s->seed = strtoull(seed, &end, 10);
    /* decimal digits only, as written (strtoull also takes a sign and leading blanks,
       which the Python loader refuses) */
    if (*end || errno || !*seed || seed[0] < '0' || seed[0] > '9') {
        eg_fail(err, EG_ERR_FORMAT, "metadata: bad seed '%s'", seed); /* seed points into o */
        json_decref(o);
        return EG_ERR_FORMAT;
    }
    s->id = strdup(id);
    s->source_file = strdup(src);
    s->source_line = json_integer_value(sl);
    s->prompt_len = json_integer_value(pl);
    s->gen_len = json_integer_value(gl);
    s->finish = strcmp(fin, "length") ? EG_DS_FINISH_STOP : EG_DS_FINISH_LENGTH;
    s->temperature = json_number_value(te);
    s->top_p = json_number_value(tp);
    s->top_k = json_integer_value(tk);
    json_decref(o);
    if (!s->id || !s->source_file) return eg_fail(err, EG_ERR_NOMEM, "out of memory");
    const char *bad = meta_range_problem(s);
    if (bad)
        return eg_fail(err, EG_ERR_FORMAT, "metadata: %s (prompt_len %" PRId64 ", gen_len %" PRId64 ", T %" PRId64
                       ", temperature %g, top_p %g, top_k %" PRId64 ")", bad, s->prompt_len, s->gen_len, s->T,
                       s->temperature, s->top_p, s->top_k);
    return EG_OK;
}

eg_status eg_ds_record_decode(const uint8_t *buf, size_t len, int meta_only, eg_ds_sample *s,
                              eg_error *err) {
    memset(s, 0, sizeof *s);
    if (len < EG_DS_RECORD_HEADER_SIZE)
        return eg_fail(err, EG_ERR_FORMAT, "record truncated (%zu bytes)", len);
    if (memcmp(buf, EG_DS_RECORD_MAGIC, 4))
        return eg_fail(err, EG_ERR_FORMAT, "record: bad magic");
    uint32_t ver = get32(buf + 4);
    if (ver < EG_DS_FORMAT_VERSION_MIN || ver > EG_DS_FORMAT_VERSION)
        return eg_fail(err, EG_ERR_FORMAT, "record: format version %u, this build reads %d..%d", ver,
                       EG_DS_FORMAT_VERSION_MIN, EG_DS_FORMAT_VERSION);
    if (get32(buf + 124) != eg_ds_crc32(buf, 124))
        return eg_fail(err, EG_ERR_CHECKSUM, "record header: CRC mismatch");
    if (!all_zero(buf + 28, 4) || !all_zero(buf + 112, 12))
        return eg_fail(err, EG_ERR_FORMAT, "record: reserved header bytes are not zero");
    uint32_t flags = get32(buf + 8);
    uint32_t known = EG_DS_FLAG_BF16_SPLIT | (ver >= 2 ? EG_DS_FLAG_FINAL_BOTH : 0);
    if (flags & ~known) return eg_fail(err, EG_ERR_FORMAT, "record: unknown flags 0x%x (version %u)", flags, ver);
    const uint64_t n_final = flags & EG_DS_FLAG_FINAL_BOTH ? 2 : 1;
    if (get32(buf + 24) != EG_DS_NSEC) return eg_fail(err, EG_ERR_FORMAT, "record: %u sections", get32(buf + 24));
    uint64_t na = get32(buf + 12), T = get32(buf + 16), H = get32(buf + 20);
    uint64_t stored[EG_DS_NSEC], raw[EG_DS_NSEC], total = EG_DS_RECORD_HEADER_SIZE;
    for (int i = 0; i < EG_DS_NSEC; i++) {
        stored[i] = get64(buf + 32 + 16 * i);
        raw[i] = get64(buf + 40 + 16 * i);
        if (stored[i] > len) return eg_fail(err, EG_ERR_FORMAT, "record: section %d larger than record", i);
        total += stored[i];
    }
    if (H == 0 || H > EG_DS_MAX_HIDDEN || na > EG_DS_MAX_AUX)
        return eg_fail(err, EG_ERR_FORMAT, "record: bad shape n_aux=%" PRIu64 " H=%" PRIu64
                       " (n_aux <= %d, 1 <= H <= %d)", na, H, EG_DS_MAX_AUX, EG_DS_MAX_HIDDEN);
    if (raw[1] != T * 4 || raw[2] != T || raw[3] != T * na * H * 2 || raw[4] != n_final * T * H * 2 ||
        raw[0] > (64u << 20))
        return eg_fail(err, EG_ERR_FORMAT, "record: section sizes do not match T=%" PRIu64
                       " n_aux=%" PRIu64 " H=%" PRIu64, T, na, H);
    if (total != len)
        return eg_fail(err, EG_ERR_FORMAT, "record: sections hold %" PRIu64 " bytes, member has %zu",
                       total, len);
    {
        static const char *const names[EG_DS_NSEC] = {"metadata", "input_ids", "loss_mask", "aux_hidden", "final_hidden"};
        const uint8_t *q = buf + EG_DS_RECORD_HEADER_SIZE;
        for (int i = 0; i < EG_DS_NSEC; i++) {
            /* no zstd frame expands more than 32768-fold (an RLE block: 4 bytes for
               128 KiB): sizes past that are corrupt, not a reason to allocate them */
            if (raw[i] / 32768 > stored[i])
                return eg_fail(err, EG_ERR_FORMAT, "record: %s claims %" PRIu64 " bytes from a %" PRIu64
                               "-byte frame (corrupt)", names[i], raw[i], stored[i]);
            eg_status cs = frame_check(q, stored[i], raw[i], names[i], err);
            if (cs) return cs;
            if (meta_only) break;
            q += stored[i];
        }
    }
    s->T = (int64_t)T;
    s->n_aux = (int)na;
    s->H = (int64_t)H;
    s->hidden_dtype = EG_DS_BF16;
    eg_status st = EG_OK;
    ZSTD_DCtx *dc = ZSTD_createDCtx();
    char *meta = malloc(raw[0] + 1);
    const uint8_t *p = buf + EG_DS_RECORD_HEADER_SIZE;
    uint8_t *planes = NULL;
    if (!dc || !meta) { st = eg_fail(err, EG_ERR_NOMEM, "out of memory"); goto done; }
    if ((st = frame_decode(dc, p, stored[0], meta, raw[0], "metadata", err))) goto done;
    if ((st = parse_meta(meta, raw[0], s, err))) goto done;
    if (meta_only) goto done;
    p += stored[0];
    s->input_ids = malloc(raw[1] ? raw[1] : 1);
    s->loss_mask = malloc(raw[2] ? raw[2] : 1);
    s->aux_hidden = malloc(raw[3] ? raw[3] : 1);
    s->final_hidden = malloc(raw[4] / n_final ? raw[4] / n_final : 1);
    if (n_final == 2) s->final_pre_hidden = malloc(raw[4] / 2 ? raw[4] / 2 : 1);
    if (!s->input_ids || !s->loss_mask || !s->aux_hidden || !s->final_hidden || (n_final == 2 && !s->final_pre_hidden)) {
        st = eg_fail(err, EG_ERR_NOMEM, "out of memory decoding %" PRIu64 " tokens", T);
        goto done;
    }
    if ((st = frame_decode(dc, p, stored[1], s->input_ids, raw[1], "input_ids", err))) goto done;
    p += stored[1];
    if ((st = frame_decode(dc, p, stored[2], s->loss_mask, raw[2], "loss_mask", err))) goto done;
    p += stored[2];
    for (uint64_t t = 0; t < T; t++)
        if (s->loss_mask[t] > 1) { st = eg_fail(err, EG_ERR_FORMAT, "loss_mask[%" PRIu64 "] = %u", t, s->loss_mask[t]); goto done; }
    for (int k = 0; k < 2; k++) {
        int sec = k ? EG_DS_SEC_FINAL : EG_DS_SEC_AUX;
        uint16_t *dst = k ? s->final_hidden : s->aux_hidden;
        if (k && n_final == 2) { /* [2][T][H] into two buffers */
            uint16_t *both = malloc(raw[sec] ? raw[sec] : 1);
            if (flags & EG_DS_FLAG_BF16_SPLIT) {
                free(planes);
                planes = malloc(raw[sec] ? raw[sec] : 1);
            }
            if (!both || ((flags & EG_DS_FLAG_BF16_SPLIT) && !planes)) {
                free(both);
                st = eg_fail(err, EG_ERR_NOMEM, "out of memory");
                goto done;
            }
            if (flags & EG_DS_FLAG_BF16_SPLIT) {
                st = frame_decode(dc, p, stored[sec], planes, raw[sec], "final_hidden", err);
                if (!st) eg_ds_bf16_join(planes, raw[sec] / 2, both);
            } else {
                st = frame_decode(dc, p, stored[sec], both, raw[sec], "final_hidden", err);
            }
            if (!st) {
                memcpy(s->final_hidden, both, raw[sec] / 2);
                memcpy(s->final_pre_hidden, both + raw[sec] / 4, raw[sec] / 2);
            }
            free(both);
            if (st) goto done;
            p += stored[sec];
            continue;
        }
        if (flags & EG_DS_FLAG_BF16_SPLIT) {
            free(planes);
            planes = malloc(raw[sec] ? raw[sec] : 1);
            if (!planes) { st = eg_fail(err, EG_ERR_NOMEM, "out of memory"); goto done; }
            if ((st = frame_decode(dc, p, stored[sec], planes, raw[sec], k ? "final_hidden" : "aux_hidden", err))) goto done;
            eg_ds_bf16_join(planes, raw[sec] / 2, dst);
        } else if ((st = frame_decode(dc, p, stored[sec], dst, raw[sec], k ? "final_hidden" : "aux_hidden", err))) {
            goto done;
        }
        p += stored[sec];
    }
done:
    free(planes);
    free(meta);
    ZSTD_freeDCtx(dc);
    if (st) eg_ds_sample_clear(s);
    return st;
}

/* ---------------------------------------------------------------- index */
void eg_ds_index_clear(eg_ds_index *ix) {
    if (!ix) return;
    for (uint64_t i = 0; i < ix->n; i++) free(ix->e[i].id);
    free(ix->e);
    memset(ix, 0, sizeof *ix);
}

eg_status eg_ds_zstd(const void *src, size_t n, int level, uint8_t **out, size_t *out_len,
                     eg_error *err) {
    *out = NULL;
    ZSTD_CCtx *cc = ZSTD_createCCtx();
    if (!cc) return eg_fail(err, EG_ERR_NOMEM, "cannot create zstd context");
    ZSTD_CCtx_setParameter(cc, ZSTD_c_compressionLevel, level);
    ZSTD_CCtx_setParameter(cc, ZSTD_c_checksumFlag, 1);
    size_t cap = 0, len = 0;
    uint64_t stored;
    eg_status st = frame_append(cc, src, n, out, &cap, &len, &stored, err);
    ZSTD_freeCCtx(cc);
    if (st) { free(*out); *out = NULL; return st; }
    *out_len = len;
    return EG_OK;
}

eg_status eg_ds_index_encode(const eg_ds_index *ix, int level, uint8_t **out, size_t *out_len,
                             uint64_t *raw_len, eg_error *err) {
    size_t n = EG_DS_INDEX_HEADER_SIZE;
    for (uint64_t i = 0; i < ix->n; i++) n += EG_DS_INDEX_ENTRY_SIZE + strlen(ix->e[i].id);
    uint8_t *b = calloc(1, n);
    if (!b) return eg_fail(err, EG_ERR_NOMEM, "out of memory (index, %zu bytes)", n);
    memcpy(b, EG_DS_INDEX_MAGIC, 4);
    put32(b + 4, EG_DS_FORMAT_VERSION);
    put32(b + 8, ix->n_aux);
    put32(b + 12, ix->flags);
    put64(b + 16, ix->H);
    put64(b + 24, ix->n);
    uint8_t *p = b + EG_DS_INDEX_HEADER_SIZE;
    for (uint64_t i = 0; i < ix->n; i++) {
        size_t il = strlen(ix->e[i].id);
        put64(p, ix->e[i].offset);
        put64(p + 8, ix->e[i].size);
        put32(p + 16, ix->e[i].T);
        put32(p + 20, ix->e[i].n_loss);
        put32(p + 24, (uint32_t)il);
        p[28] = (uint8_t)ix->e[i].finish;
        memcpy(p + EG_DS_INDEX_ENTRY_SIZE, ix->e[i].id, il);
        p += EG_DS_INDEX_ENTRY_SIZE + il;
    }
    eg_status st = eg_ds_zstd(b, n, level, out, out_len, err);
    free(b);
    *raw_len = n;
    return st;
}

eg_status eg_ds_index_decode(const uint8_t *buf, size_t len, uint64_t raw_len, eg_ds_index *ix,
                             eg_error *err) {
    memset(ix, 0, sizeof *ix);
    if (raw_len < EG_DS_INDEX_HEADER_SIZE || raw_len > ((uint64_t)1 << 34))
        return eg_fail(err, EG_ERR_FORMAT, "index: bad size %" PRIu64, raw_len);
    eg_status st = frame_check(buf, len, raw_len, "index", err);
    if (st) return st;
    uint8_t *b = malloc(raw_len);
    ZSTD_DCtx *dc = ZSTD_createDCtx();
    if (!b || !dc) { st = eg_fail(err, EG_ERR_NOMEM, "out of memory"); goto done; }
    if ((st = frame_decode(dc, buf, len, b, raw_len, "index", err))) goto done;
    if (memcmp(b, EG_DS_INDEX_MAGIC, 4)) { st = eg_fail(err, EG_ERR_FORMAT, "index: bad magic"); goto done; }
    if (get32(b + 4) < EG_DS_FORMAT_VERSION_MIN || get32(b + 4) > EG_DS_FORMAT_VERSION) {
        st = eg_fail(err, EG_ERR_FORMAT, "index: format version %u, this build reads %d..%d", get32(b + 4),
                     EG_DS_FORMAT_VERSION_MIN, EG_DS_FORMAT_VERSION);
        goto done;
    }
    ix->n_aux = get32(b + 8);
    ix->flags = get32(b + 12);
    ix->H = get64(b + 16);
    if (ix->n_aux > EG_DS_MAX_AUX || ix->H < 1 || ix->H > EG_DS_MAX_HIDDEN) {
        st = eg_fail(err, EG_ERR_FORMAT, "index: bad shape n_aux=%u H=%" PRIu64 " (n_aux <= %d, 1 <= H <= %d)",
                     ix->n_aux, ix->H, EG_DS_MAX_AUX, EG_DS_MAX_HIDDEN);
        goto done;
    }
    uint64_t n = get64(b + 24);
    if (n > raw_len / EG_DS_INDEX_ENTRY_SIZE) { st = eg_fail(err, EG_ERR_FORMAT, "index: %" PRIu64 " entries do not fit", n); goto done; }
    ix->e = calloc(n ? n : 1, sizeof *ix->e);
    if (!ix->e) { st = eg_fail(err, EG_ERR_NOMEM, "out of memory"); goto done; }
    const uint8_t *p = b + EG_DS_INDEX_HEADER_SIZE, *end = b + raw_len;
    for (uint64_t i = 0; i < n; i++) {
        if (end - p < EG_DS_INDEX_ENTRY_SIZE) { st = eg_fail(err, EG_ERR_FORMAT, "index: entry %" PRIu64 " truncated", i); goto done; }
        eg_ds_index_entry *e = &ix->e[i];
        e->offset = get64(p);
        e->size = get64(p + 8);
        e->T = get32(p + 16);
        e->n_loss = get32(p + 20);
        uint32_t il = get32(p + 24);
        e->finish = p[28] ? EG_DS_FINISH_LENGTH : EG_DS_FINISH_STOP;
        if (p[28] > 1 || !all_zero(p + 29, 3) || (uint64_t)(end - p - EG_DS_INDEX_ENTRY_SIZE) < il) {
            st = eg_fail(err, EG_ERR_FORMAT, "index: entry %" PRIu64 " malformed", i);
            goto done;
        }
        if (memchr(p + EG_DS_INDEX_ENTRY_SIZE, 0, il)) {
            st = eg_fail(err, EG_ERR_FORMAT, "index: entry %" PRIu64 ": id contains a NUL byte", i);
            goto done;
        }
        e->id = malloc(il + 1);
        if (!e->id) { st = eg_fail(err, EG_ERR_NOMEM, "out of memory"); goto done; }
        memcpy(e->id, p + EG_DS_INDEX_ENTRY_SIZE, il);
        e->id[il] = 0;
        ix->n = i + 1;
        p += EG_DS_INDEX_ENTRY_SIZE + il;
    }
    if (p != end) st = eg_fail(err, EG_ERR_FORMAT, "index: %td trailing bytes", end - p);
done:
    free(b);
    ZSTD_freeDCtx(dc);
    if (st) eg_ds_index_clear(ix);
    return st;
}

/* ---------------------------------------------------------------- trailer */
void eg_ds_trailer_encode(const eg_ds_trailer *t, uint8_t out[EG_DS_TRAILER_SIZE]) {
    memset(out, 0, EG_DS_TRAILER_SIZE);
    memcpy(out, EG_DS_TRAILER_MAGIC, 8);
    put32(out + 8, t->version);
    put32(out + 12, t->flags);
    put64(out + 16, t->index_offset);
    put64(out + 24, t->index_size);
    put64(out + 32, t->index_raw_size);
    put64(out + 40, t->n_samples);
    put64(out + 48, t->n_tokens);
    put32(out + 60, eg_ds_crc32(out, 60));
}

eg_status eg_ds_trailer_decode(const uint8_t in[EG_DS_TRAILER_SIZE], eg_ds_trailer *t,
                               eg_error *err) {
    if (memcmp(in, EG_DS_TRAILER_MAGIC, 8))
        return eg_fail(err, EG_ERR_FORMAT, "no shard trailer (not an eaglegen shard, or truncated)");
    if (get32(in + 60) != eg_ds_crc32(in, 60)) return eg_fail(err, EG_ERR_CHECKSUM, "trailer: CRC mismatch");
    t->version = get32(in + 8);
    if (t->version < EG_DS_FORMAT_VERSION_MIN || t->version > EG_DS_FORMAT_VERSION)
        return eg_fail(err, EG_ERR_FORMAT, "shard format version %u, this build reads %d..%d", t->version,
                       EG_DS_FORMAT_VERSION_MIN, EG_DS_FORMAT_VERSION);
    if (!all_zero(in + 56, 4)) return eg_fail(err, EG_ERR_FORMAT, "trailer: reserved bytes are not zero");
    t->flags = get32(in + 12);
    t->index_offset = get64(in + 16);
    t->index_size = get64(in + 24);
    t->index_raw_size = get64(in + 32);
    t->n_samples = get64(in + 40);
    t->n_tokens = get64(in + 48);
    return EG_OK;
}
