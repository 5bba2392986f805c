/* Progress reporting; see progress.h. */
#include "gen/progress.h"

#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

#include "common/eg_common.h"

void gen_progress_init(gen_progress *p, FILE *json_log, int worker, int n_workers) {
    p->json = json_log;
    p->tty = isatty(2);
    p->start = p->last = eg_now();
    p->interval = p->tty ? 0.5 : 10.0;
    p->drawn = 0;
    p->worker = worker;
    p->n_workers = n_workers;
}

int gen_progress_columns(int fd) {
    struct winsize ws;
    if (!ioctl(fd, TIOCGWINSZ, &ws) && ws.ws_col > 0) return ws.ws_col;
    const char *c = getenv("COLUMNS");
    int n = c ? atoi(c) : 0;
    return n > 0 ? n : 80;
}

static void fmt_eta(char *out, size_t n, double s) {
    if (s < 0 || s > 1e8) { snprintf(out, n, "?"); return; }
    long t = (long)s;
    if (t >= 86400) snprintf(out, n, "%ldd%02ldh", t / 86400, t / 3600 % 24);
    else if (t >= 3600) snprintf(out, n, "%ldh%02ldm", t / 3600, t / 60 % 60);
    else snprintf(out, n, "%ldm%02lds", t / 60, t % 60);
}

static void fmt_count(char *out, size_t n, double v) {
    if (v >= 1e9) snprintf(out, n, "%.1fG", v / 1e9);
    else if (v >= 1e6) snprintf(out, n, "%.1fM", v / 1e6);
    else if (v >= 1e4) snprintf(out, n, "%.1fK", v / 1e3);
    else snprintf(out, n, "%.0f", v);
}

/* Fraction of the work done: records when their count is known, else input bytes;
 * -1 = unknown. */
static double done_fraction(const gen_progress_state *s) {
    if (s->records_total > 0) return (double)s->records_done / (double)s->records_total;
    if (s->records_total < 0 && s->input_bytes_total > 0)
        return (double)s->input_bytes_done / (double)s->input_bytes_total;
    return -1;
}

/* ETA from this run's own rate; "?" when unknown. */
static void eta_of(const gen_progress_state *s, double elapsed, char *eta, size_t n) {
    snprintf(eta, n, "?");
    double own = (double)(s->records_done - s->records_skipped);
    if (elapsed <= 0 || own <= 0) return;
    if (s->records_total >= 0) {
        fmt_eta(eta, n, (double)(s->records_total - s->records_done) / (own / elapsed));
        return;
    }
    if (s->input_bytes_total <= 0 || s->records_done <= 0) return;
    /* bytes of this run's own records: the consumed bytes times its share of the records */
    double own_bytes = (double)s->input_bytes_done * own / (double)s->records_done;
    if (own_bytes <= 0) return;
    fmt_eta(eta, n, (double)(s->input_bytes_total - s->input_bytes_done) / (own_bytes / elapsed));
}

size_t gen_progress_format(char *out, size_t cap, const gen_progress_state *s, double elapsed, int cols, int bar) {
    if (cap == 0) return 0;
    size_t width = cols > 1 ? (size_t)cols - 1 : 0;
    if (width >= cap) width = cap - 1;
    char done[32], total[32] = "?", eta[48], tps[32], samples[32];
    fmt_count(done, sizeof done, (double)s->records_done);
    if (s->records_total >= 0) fmt_count(total, sizeof total, (double)s->records_total);
    double frac = done_fraction(s);
    fmt_count(samples, sizeof samples, (double)s->samples);
    double tok = s->engine_seconds > 0 ? (double)(s->prefill_tokens + s->decode_tokens) / s->engine_seconds : 0;
    fmt_count(tps, sizeof tps, tok);
    eta_of(s, elapsed, eta, sizeof eta);
    double sps = elapsed > 0 ? (double)s->samples / elapsed : 0;
    /* pieces, most important first; each is kept only if it fits */
    char piece[6][128];
    int np = 0;
    if (s->records_total < 0 && frac >= 0) /* count unknown: how far into the input */
        snprintf(piece[np++], 128, "%s rec (%.0f%% of input)", done, frac > 1 ? 100.0 : frac * 100);
    else snprintf(piece[np++], 128, "%s/%s rec", done, total);
    snprintf(piece[np++], 128, "ETA %s", eta);
    snprintf(piece[np++], 128, "%s samples %.2f/s", samples, sps);
    snprintf(piece[np++], 128, "%s tok/s", tps);
    snprintf(piece[np++], 128, "rej %lld", (long long)s->rejected);
    snprintf(piece[np++], 128, "shards %lld %.2fx", (long long)s->shards, s->compression);
    int keep[6] = {0};
    size_t used = 0;
    for (int i = 0; i < np; i++) {
        size_t l = strlen(piece[i]) + (used ? 2 : 0);
        if (used + l <= width) { keep[i] = 1; used += l; }
    }
    char text[512] = "";
    size_t tl = 0;
    for (int i = 0; i < np; i++)
        if (keep[i]) tl += (size_t)snprintf(text + tl, sizeof text - tl, "%s%s", tl ? "  " : "", piece[i]);
    size_t o = 0;
    /* the bar takes what is left, at least 10 cells + brackets, percent and spaces */
    if (bar && frac >= 0 && width >= used + 18) {
        size_t cells = width - used - 8;
        if (cells > 40) cells = 40;
        double f = frac;
        if (f > 1) f = 1;
        if (f < 0) f = 0;
        size_t full = (size_t)(f * (double)cells + 0.5);
        out[o++] = '[';
        for (size_t i = 0; i < cells; i++) out[o++] = i < full ? '#' : '.';
        o += (size_t)snprintf(out + o, cap - o, "] %3.0f%% ", f * 100);
    }
    size_t room = width > o ? width - o : 0;
    if (tl > room) tl = room;
    memcpy(out + o, text, tl);
    o += tl;
    out[o] = 0;
    return o;
}

static void json_line(gen_progress *p, const gen_progress_state *s, const char *phase, double el) {
    if (!p->json) return;
    char ts[32];
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    strftime(ts, sizeof ts, "%Y-%m-%dT%H:%M:%SZ", &tm);
    double sps = el > 0 ? s->samples / el : 0;
    double tps = s->engine_seconds > 0 ? (s->prefill_tokens + s->decode_tokens) / s->engine_seconds : 0;
    double dps = s->engine_seconds > 0 ? s->decode_tokens / s->engine_seconds : 0;
    fprintf(p->json,
            "{\"time\":\"%s\",\"worker\":\"%d/%d\",\"phase\":\"%s\",\"elapsed_s\":%.3f,\"records_done\":%lld,"
            "\"records_skipped\":%lld,\"records_total\":%lld,\"samples\":%lld,\"rejected\":%lld,"
            "\"samples_per_s\":%.4f,\"prefill_tokens\":%lld,\"decode_tokens\":%lld,\"tokens_per_s\":%.2f,"
            "\"decode_tokens_per_s\":%.2f,\"shards\":%lld,\"compression\":%.4f,\"input_bytes_done\":%lld,"
            "\"input_bytes_total\":%lld}\n",
            ts, p->worker, p->n_workers, phase, el, (long long)s->records_done, (long long)s->records_skipped,
            (long long)s->records_total, (long long)s->samples, (long long)s->rejected, sps,
            (long long)s->prefill_tokens, (long long)s->decode_tokens, tps, dps, (long long)s->shards, s->compression,
            (long long)s->input_bytes_done, (long long)(s->input_bytes_total > 0 ? s->input_bytes_total : -1));
    fflush(p->json);
}

void gen_progress_update(gen_progress *p, const gen_progress_state *s, int force) {
    double now = eg_now();
    if (!force && now - p->last < p->interval) return;
    p->last = now;
    double el = now - p->start;
    char line[1024];
    /* a plain (non-terminal) line is not redrawn: no bar, and it may be long */
    gen_progress_format(line, sizeof line, s, el, p->tty ? gen_progress_columns(2) : 200, p->tty);
    fprintf(stderr, "%s%s%s", p->tty ? "\r\033[K" : "", line, p->tty ? "" : "\n");
    fflush(stderr);
    p->drawn = p->tty;
    json_line(p, s, "running", el);
}

void gen_progress_finish(gen_progress *p, const gen_progress_state *s, const char *phase) {
    if (p->drawn) fputc('\n', stderr);
    p->drawn = 0;
    if (s) json_line(p, s, phase, eg_now() - p->start);
}
