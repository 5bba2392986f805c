// Emulated NCCL point-to-point (tests/gpu/emu/include/nccl.h), blocking where NCCL blocks:
//  - connection: NCCL connects a (sender, receiver) pair lazily, on the calling threads,
//    in the first ncclSend/ncclRecv between them (ncclGroupEnd runs the transport setup,
//    which exchanges connection data with the peer through the bootstrap and waits for
//    its answer). Here the first send from a to b returns only once b's first recv from
//    a was called too, and the other way round; a group connects all its pairs at
//    ncclGroupEnd, so one thread can connect every pair in one group.
//  - transfer: work on the calling stream (the stream's worker runs it later). A send of
//    at most EMU_NCCL_BUFFER bytes (default 4 MiB, NCCL_BUFFSIZE's default) completes
//    into the pair's buffer while that has room; a larger one waits until the matching
//    recv is running on the receiver's stream. A recv waits for its message and checks
//    its size.
//  - EMU_NCCL_DEAD_AFTER=N: a failing link. Once a communicator's ranks moved N messages,
//    its transfers never complete (until ncclCommAbort) and ncclCommGetAsyncError reports
//    ncclRemoteError, as NCCL does when a peer or link fails after the work was enqueued.
//    EMU_NCCL_ASYNC_ERROR=1 only reports the error (transfers still complete).
//  - every wait gives up after EMU_NCCL_TIMEOUT seconds (default 60) with a message
//    naming the call, the ranks and the bytes, and aborts the process: an unmatched
//    call hangs a real GPU run forever.
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "nccl.h"

namespace {
struct message {
    std::vector<float> data;
    bool buffered; /* went through the pair's buffer (else handed to a waiting recv) */
};
struct channel { /* messages from one rank to another, in order */
    std::deque<message> q;
    size_t buffered = 0; /* bytes of q held in the buffer */
    int recv_waiting = 0; /* recvs running on the receiver's stream, waiting for data */
    bool send_called = false, recv_called = false; /* connection: both sides arrived */
};
struct world {
    int n = 0;
    std::vector<int> dev;
    std::mutex mu;
    std::condition_variable cv;
    std::map<std::pair<int, int>, channel> ch; /* (from, to) */
    bool aborted = false;
    long long sent = 0; /* messages sent (EMU_NCCL_DEAD_AFTER) */
    bool dead = false;
};
std::mutex g_mu;
long long g_messages;

size_t buffer_bytes() {
    static const size_t b = [] {
        const char *e = std::getenv("EMU_NCCL_BUFFER");
        return e && *e ? (size_t)std::strtoull(e, nullptr, 10) : (size_t)4 << 20;
    }();
    return b;
}
long long dead_after() {
    static const long long n = [] {
        const char *e = std::getenv("EMU_NCCL_DEAD_AFTER");
        return e && *e ? std::atoll(e) : 0LL;
    }();
    return n;
}
double timeout_s() {
    static const double t = [] {
        const char *e = std::getenv("EMU_NCCL_TIMEOUT");
        return e && *e ? std::atof(e) : 60.0;
    }();
    return t;
}
/* Wait on w->cv until ready() (true) or the timeout (false); l holds w->mu. */
template <class F> bool wait_for(world *w, std::unique_lock<std::mutex> &l, F ready) {
    return w->cv.wait_for(l, std::chrono::duration<double>(timeout_s()), [&] { return w->aborted || ready(); });
}
[[noreturn]] void hang(const char *what) {
    std::fprintf(stderr, "emulated NCCL: %s; after %.0f s (EMU_NCCL_TIMEOUT) this is a hang: a real GPU run would "
                 "wait forever\n", what, timeout_s());
    std::fflush(stderr);
    std::abort();
}

struct op {
    bool send;
    void *buf;
    size_t count;
    int peer, rank; /* rank: the caller's (the comm may be gone when an aborted transfer wakes) */
    ncclComm_t comm;
    cudaStream_t stream;
};
thread_local int group_depth;
thread_local std::vector<op> group_ops;
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

/* The connection handshake of the ops of one call or group: mark every side arrived,
 * then wait for every peer's side. */
static void connect_all(const std::vector<op> &ops) {
    for (const op &o : ops) {
        world *w = o.comm->w.get();
        std::lock_guard<std::mutex> g(w->mu);
        channel &c = o.send ? w->ch[{o.comm->rank, o.peer}] : w->ch[{o.peer, o.comm->rank}];
        (o.send ? c.send_called : c.recv_called) = true;
        w->cv.notify_all();
    }
    for (const op &o : ops) {
        world *w = o.comm->w.get();
        std::unique_lock<std::mutex> l(w->mu);
        channel &c = o.send ? w->ch[{o.comm->rank, o.peer}] : w->ch[{o.peer, o.comm->rank}];
        if (!wait_for(w, l, [&] { return o.send ? c.recv_called : c.send_called; })) {
            char m[256];
            snprintf(m, sizeof m, "rank %d's first %s %s rank %d waits for rank %d's first %s (NCCL connects the pair "
                     "in that call), which never came", o.comm->rank, o.send ? "ncclSend" : "ncclRecv",
                     o.send ? "to" : "from", o.peer, o.peer, o.send ? "ncclRecv from it" : "ncclSend to it");
            hang(m);
        }
    }
}

/* The stream part of one op (runs on the stream's worker). */
static void transfer(const op &o, const std::shared_ptr<world> &wp) {
    world *w = wp.get();
    size_t bytes = o.count * sizeof(float);
    char m[256];
    std::unique_lock<std::mutex> l(w->mu);
    if (dead_after() > 0 && w->sent >= dead_after()) w->dead = true;
    if (w->dead) { /* the failed link: nothing moves until the communicator is aborted */
        if (!wait_for(w, l, [] { return false; })) {
            snprintf(m, sizeof m, "rank %d's %s of %zu bytes %s rank %d is on a failed link (EMU_NCCL_DEAD_AFTER) and "
                     "nobody polled ncclCommGetAsyncError", o.rank, o.send ? "ncclSend" : "ncclRecv", bytes,
                     o.send ? "to" : "from", o.peer);
            hang(m);
        }
        return;
    }
    if (o.send) {
        int from = o.rank, to = o.peer;
        channel &c = w->ch[{from, to}];
        bool fits = bytes <= buffer_bytes();
        if (!wait_for(w, l, [&] { return fits ? c.buffered + bytes <= buffer_bytes() : c.recv_waiting > 0 && c.q.empty(); })) {
            snprintf(m, sizeof m, "rank %d's ncclSend of %zu bytes to rank %d %s", from, bytes, to,
                     fits ? "waits for room in the pair's buffer (earlier messages never received)"
                          : "(more than the pair's buffer) waits for the matching ncclRecv to run, which never came");
            hang(m);
        }
        if (w->aborted) return;
        message msg{std::vector<float>((const float *)o.buf, (const float *)o.buf + o.count), fits};
        if (fits) c.buffered += bytes;
        c.q.push_back(std::move(msg));
        w->sent++;
        w->cv.notify_all();
        std::lock_guard<std::mutex> g(g_mu);
        g_messages++;
        return;
    }
    int from = o.peer, to = o.rank;
    channel &c = w->ch[{from, to}];
    c.recv_waiting++;
    w->cv.notify_all();
    bool got = wait_for(w, l, [&] { return !c.q.empty(); });
    c.recv_waiting--;
    if (!got) {
        snprintf(m, sizeof m, "rank %d's ncclRecv of %zu bytes from rank %d waits for a ncclSend that never came", to,
                 bytes, from);
        hang(m);
    }
    if (w->aborted) return;
    message msg = std::move(c.q.front());
    c.q.pop_front();
    if (msg.buffered) c.buffered -= msg.data.size() * sizeof(float);
    w->cv.notify_all();
    if (msg.data.size() != o.count) {
        fprintf(stderr, "emulated NCCL: rank %d receives %zu floats from rank %d, which sent %zu (mispaired)\n", to,
                o.count, from, msg.data.size());
        std::abort();
    }
    memcpy(o.buf, msg.data.data(), bytes);
}

/* Connect, then queue the transfers; ops of one group on one stream progress together
 * (NCCL fuses them into one kernel), so a send and a recv there cannot wait on each other.
 * Ops of a group to the same peer in the same direction keep their order (NCCL matches a
 * pair's sends and receives in the order they were posted): they run one after the
 * other on one thread, the other peers' concurrently. */
static void post(const std::vector<op> &ops) {
    connect_all(ops);
    std::map<cudaStream_t, std::vector<op>> by_stream;
    std::vector<cudaStream_t> order;
    for (const op &o : ops) {
        if (!by_stream.count(o.stream)) order.push_back(o.stream);
        by_stream[o.stream].push_back(o);
    }
    for (cudaStream_t s : order) {
        std::vector<op> mine = by_stream[s];
        std::vector<std::shared_ptr<world>> ws;
        for (const op &o : mine) ws.push_back(o.comm->w); /* the world outlives an abort */
        emu_stream_exec(s, [mine, ws] {
            if (mine.size() == 1) {
                transfer(mine[0], ws[0]);
                return;
            }
            std::map<std::pair<bool, int>, std::vector<size_t>> lanes; /* (send, peer) -> ops in order */
            for (size_t i = 0; i < mine.size(); i++) lanes[{mine[i].send, mine[i].peer}].push_back(i);
            std::vector<std::thread> th;
            for (auto &ln : lanes) {
                const std::vector<size_t> *idx = &ln.second;
                th.emplace_back([&, idx] {
                    for (size_t i : *idx) transfer(mine[i], ws[i]);
                });
            }
            for (auto &t : th) t.join();
        });
    }
}

static ncclResult_t call(bool send, void *buf, size_t count, int peer, ncclComm_t c, cudaStream_t s) {
    if (!c || peer < 0 || peer >= c->w->n || peer == c->rank) return ncclInvalidArgument;
    if (ncclResult_t r = on_device(c, send ? "ncclSend" : "ncclRecv")) return r;
    op o{send, buf, count, peer, c->rank, c, s};
    if (group_depth) group_ops.push_back(o);
    else post({o});
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
    for (int i = 0; i < n; i++) comms[i] = new emu_nccl_comm{w, i};
    return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t c) {
    delete c;
    return ncclSuccess;
}

/* transfers still waiting give up (their stream moves on); then the comm is gone */
ncclResult_t ncclCommAbort(ncclComm_t c) {
    if (!c) return ncclInvalidArgument;
    {
        std::lock_guard<std::mutex> g(c->w->mu);
        c->w->aborted = true;
        c->w->cv.notify_all();
    }
    return ncclCommDestroy(c);
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t c, ncclResult_t *async_error) {
    if (!c || !async_error) return ncclInvalidArgument;
    const char *e = getenv("EMU_NCCL_ASYNC_ERROR");
    bool dead;
    {
        std::lock_guard<std::mutex> g(c->w->mu);
        dead = c->w->dead;
    }
    *async_error = dead || (e && *e && strcmp(e, "0")) ? ncclRemoteError : ncclSuccess;
    return ncclSuccess;
}

ncclResult_t ncclGroupStart(void) {
    group_depth++;
    return ncclSuccess;
}

ncclResult_t ncclGroupEnd(void) {
    if (group_depth <= 0) return ncclInvalidUsage;
    if (--group_depth) return ncclSuccess;
    std::vector<op> ops;
    ops.swap(group_ops);
    if (!ops.empty()) post(ops);
    return ncclSuccess;
}

ncclResult_t ncclSend(const void *buf, size_t count, ncclDataType_t, int peer, ncclComm_t c, cudaStream_t s) {
    return call(true, const_cast<void *>(buf), count, peer, c, s);
}

ncclResult_t ncclRecv(void *buf, size_t count, ncclDataType_t, int peer, ncclComm_t c, cudaStream_t s) {
    return call(false, buf, count, peer, c, s);
}

const char *ncclGetErrorString(ncclResult_t r) {
    switch (r) {
    case ncclSuccess: return "no error";
    case ncclInvalidArgument: return "invalid argument (emulated)";
    case ncclInvalidUsage: return "invalid usage (emulated)";
    case ncclRemoteError: return "remote process exited or there was a network error (emulated)";
    default: return "emulated NCCL error";
    }
}

long long emu_nccl_messages(void) {
    std::lock_guard<std::mutex> g(g_mu);
    return g_messages;
}
}
