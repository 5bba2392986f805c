// Emulated NCCL point-to-point (tests/gpu/emu/include/nccl.h): one FIFO per ordered
// pair of ranks; a send enqueues a copy, a recv waits for the head and checks its size.
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "nccl.h"

namespace {
struct world {
    int n = 0;
    std::vector<int> dev;
    std::mutex mu;
    std::condition_variable cv;
    std::map<std::pair<int, int>, std::deque<std::vector<float>>> q; // (from, to) -> messages
    int alive = 0;
};
std::mutex g_mu;
long long g_messages;
}

struct emu_nccl_comm {
    std::shared_ptr<world> w;
    int rank;
};

static ncclResult_t on_device(ncclComm_t c, const char *what) {
    int d = -1;
    cudaGetDevice(&d);
    if (d != c->w->dev[c->rank]) {
        fprintf(stderr, "emulated NCCL: %s by rank %d from a thread on device %d (rank's device %d)\n", what, c->rank, d,
                c->w->dev[c->rank]);
        return ncclInvalidUsage;
    }
    return ncclSuccess;
}

extern "C" {
ncclResult_t ncclCommInitAll(ncclComm_t *comms, int n, const int *devlist) {
    if (n < 1 || !comms) return ncclInvalidArgument;
    auto w = std::make_shared<world>();
    w->n = n;
    for (int i = 0; i < n; i++) {
        for (int j = 0; j < i; j++)
            if (devlist[j] == devlist[i]) return ncclInvalidUsage; // real NCCL: duplicate GPU
        w->dev.push_back(devlist ? devlist[i] : i);
    }
    w->alive = n;
    for (int i = 0; i < n; i++) comms[i] = new emu_nccl_comm{w, i};
    return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t c) {
    delete c;
    return ncclSuccess;
}

/* nothing runs asynchronously here: aborting is destroying */
ncclResult_t ncclCommAbort(ncclComm_t c) { return ncclCommDestroy(c); }

ncclResult_t ncclSend(const void *buf, size_t count, ncclDataType_t, int peer, ncclComm_t c, cudaStream_t) {
    if (!c || peer < 0 || peer >= c->w->n || peer == c->rank) return ncclInvalidArgument;
    if (ncclResult_t r = on_device(c, "ncclSend")) return r;
    std::vector<float> m(count);
    memcpy(m.data(), buf, count * sizeof(float));
    {
        std::lock_guard<std::mutex> l(c->w->mu);
        c->w->q[{c->rank, peer}].push_back(std::move(m));
    }
    c->w->cv.notify_all();
    std::lock_guard<std::mutex> g(g_mu);
    g_messages++;
    return ncclSuccess;
}

ncclResult_t ncclRecv(void *buf, size_t count, ncclDataType_t, int peer, ncclComm_t c, cudaStream_t) {
    if (!c || peer < 0 || peer >= c->w->n || peer == c->rank) return ncclInvalidArgument;
    if (ncclResult_t r = on_device(c, "ncclRecv")) return r;
    std::unique_lock<std::mutex> l(c->w->mu);
    auto &fifo = c->w->q[{peer, c->rank}];
    c->w->cv.wait(l, [&] { return !fifo.empty(); });
    std::vector<float> m = std::move(fifo.front());
    fifo.pop_front();
    if (m.size() != count) {
        fprintf(stderr, "emulated NCCL: rank %d receives %zu floats from rank %d, which sent %zu (mispaired)\n",
                c->rank, count, peer, m.size());
        return ncclInvalidUsage;
    }
    memcpy(buf, m.data(), count * sizeof(float));
    return ncclSuccess;
}

const char *ncclGetErrorString(ncclResult_t r) {
    switch (r) {
    case ncclSuccess: return "no error";
    case ncclInvalidArgument: return "invalid argument (emulated)";
    case ncclInvalidUsage: return "invalid usage (emulated)";
    default: return "emulated NCCL error";
    }
}

long long emu_nccl_messages(void) {
    std::lock_guard<std::mutex> g(g_mu);
    return g_messages;
}
}
