/* Progress reporting; see progress.h. */
#include "gen/progress.h"

#include <unistd.h>

#include "common/eg_common.h"

void gen_progress_init(gen_progress *p, FILE *json_log) {
    p->json = json_log;
    p->tty = isatty(2);
    p->start = p->last = eg_now();
    p->interval = p->tty ? 0.5 : 10.0;
    p->drawn = 0;
}

static void fmt_eta(char *out, size_t n, double s) {
    if (s < 0 || s > 1e8) { snprintf(out, n, "?"); return; }
    long t = (long)s;
    if (t >= 3600) snprintf(out, n, "%ldh%02ldm", t / 3600, t / 60 % 60);
    else snprintf(out, n, "%ldm%02lds", t / 60, t % 60);
}

void gen_progress_update(gen_progress *p, const gen_progress_state *s, int force) {
    double now = eg_now();
    if (!force && now - p->last < p->interval) return;
    p->last = now;
    double el = now - p->start;
    double sps = el > 0 ? s->samples / el : 0;
    double tps = s->engine_seconds > 0 ? (s->prefill_tokens + s->decode_tokens) / s->engine_seconds : 0;
    double dps = s->engine_seconds > 0 ? s->decode_tokens / s->engine_seconds : 0;
    char total[32] = "?", eta[32] = "?";
    if (s->records_total >= 0) {
        snprintf(total, sizeof total, "%lld", (long long)s->records_total);
        double rate = el > 0 ? s->records_done / el : 0;
        if (rate > 0) fmt_eta(eta, sizeof eta, (s->records_total - s->records_done) / rate);
    }
    fprintf(stderr, "%srecords %lld/%s  samples %lld (%.2f/s)  tokens/s %.0f (decode %.0f)  shards %lld  ratio %.2fx  ETA %s%s",
            p->tty ? "\r\033[K" : "", (long long)s->records_done, total, (long long)s->samples, sps, tps, dps,
            (long long)s->shards, s->compression, eta, p->tty ? "" : "\n");
    fflush(stderr);
    p->drawn = p->tty;
    if (p->json) {
        fprintf(p->json,
                "{\"elapsed_s\":%.3f,\"records_done\":%lld,\"records_total\":%lld,\"samples\":%lld,\"samples_per_s\":%.4f,"
                "\"prefill_tokens\":%lld,\"decode_tokens\":%lld,\"tokens_per_s\":%.2f,\"decode_tokens_per_s\":%.2f,"
                "\"shards\":%lld,\"compression\":%.4f}\n",
                el, (long long)s->records_done, (long long)s->records_total, (long long)s->samples, sps,
                (long long)s->prefill_tokens, (long long)s->decode_tokens, tps, dps, (long long)s->shards,
                s->compression);
        fflush(p->json);
    }
}

void gen_progress_finish(gen_progress *p) {
    if (p->drawn) fputc('\n', stderr);
    p->drawn = 0;
}
