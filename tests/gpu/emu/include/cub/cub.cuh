// Emulation stand-in for the two CUB pieces kernels/sample.cu uses: BlockScan
// (inclusive sum over the emulated block) and a stable descending segmented sort.
#ifndef EMU_CUB_CUH
#define EMU_CUB_CUH
#include <algorithm>
#include <numeric>
#include <vector>

#include "cuda_runtime.h"

namespace cub {
template <class T, int N> struct BlockScan {
    struct TempStorage {
        T v[N];
    };
    TempStorage &s;
    explicit BlockScan(TempStorage &t) : s(t) {}
    void InclusiveSum(T in, T &out) {
        s.v[threadIdx.x] = in;
        __syncthreads();
        if (threadIdx.x == 0)
            for (int i = 1; i < N; i++) s.v[i] += s.v[i - 1];
        __syncthreads();
        out = s.v[threadIdx.x];
        __syncthreads();
    }
};
struct DeviceSegmentedRadixSort {
    template <class K, class V, class N, class O>
    static cudaError_t SortPairsDescending(void *temp, size_t &bytes, const K *kin, K *kout, const V *vin, V *vout,
                                           N num_items, int nseg, O begin, O end, int, int, cudaStream_t stream) {
        if (!temp) {
            bytes = 16;
            return cudaSuccess;
        }
        (void)num_items;
        /* device work: runs when the stream gets to it (segment offsets are device data) */
        emu_stream_exec(stream, [=] {
            for (int sgm = 0; sgm < nseg; sgm++) {
                int b = begin[sgm], e = end[sgm];
                std::vector<int> idx(e - b);
                std::iota(idx.begin(), idx.end(), b);
                std::stable_sort(idx.begin(), idx.end(), [&](int x, int y) { return kin[x] > kin[y]; });
                for (int i = 0; i < e - b; i++) {
                    kout[b + i] = kin[idx[i]];
                    vout[b + i] = vin[idx[i]];
                }
            }
        });
        return cudaSuccess;
    }
};
} // namespace cub
#endif
