// porter's emulated HIP target: cooperative groups as kernels use them (the thread block; thread-block tiles of
// N <= wavefront lanes; coalesced groups) with their shuffles, votes and barriers. A tile is N consecutive thread
// ranks of its block; its operations need every existing lane of that tile, not of the whole wavefront. A coalesced
// group is the lanes of one wavefront that reached coalesced_threads() together (what the emulator sees as active:
// lanes that stopped at the same call site); its operations need every member.
// Written for porter (no vendor code).
#pragma once

#include <hip/hip_runtime.h>

namespace cooperative_groups {

class thread_block {
 public:
  void sync() const { __syncthreads(); }
  unsigned thread_rank() const { return static_cast<unsigned>(::porter_emu::linear_id(::porter_emu::self())); }
  unsigned size() const { return blockDim.x * blockDim.y * blockDim.z; }
  unsigned num_threads() const { return size(); }
  dim3 group_index() const { return dim3(blockIdx.x, blockIdx.y, blockIdx.z); }
  dim3 thread_index() const { return dim3(threadIdx.x, threadIdx.y, threadIdx.z); }
  dim3 group_dim() const { return blockDim; }
  dim3 dim_threads() const { return blockDim; }
};

inline thread_block this_thread_block() { return thread_block(); }
inline void sync(const thread_block& b) { b.sync(); }

template <unsigned N>
class thread_block_tile {
  static_assert(N >= 1 && (N & (N - 1)) == 0, "a thread-block tile has a power-of-two size");
  static_assert(N <= PORTER_EMU_WAVE, "HIP's thread-block tiles are at most a wavefront wide");

 public:
  unsigned thread_rank() const { return block_rank() % N; }
  static constexpr unsigned size() { return N; }
  static constexpr unsigned num_threads() { return N; }
  unsigned meta_group_rank() const { return block_rank() / N; }
  unsigned meta_group_size() const {
    const unsigned n = blockDim.x * blockDim.y * blockDim.z;
    return (n + N - 1) / N;
  }
  __attribute__((noinline)) void sync(PORTER_SITE) const {
    ::porter_emu::wave_op<int>(::porter_emu::Op::WaveBarrier, 0, 0, N, N, PORTER_HERE);
  }
  template <typename T>
  __attribute__((noinline)) T shfl(T v, int src, PORTER_SITE) const {
    return ::porter_emu::wave_op(::porter_emu::Op::Shfl, v, src, N, N, PORTER_HERE);
  }
  template <typename T>
  __attribute__((noinline)) T shfl_up(T v, unsigned d, PORTER_SITE) const {
    return ::porter_emu::wave_op(::porter_emu::Op::ShflUp, v, static_cast<int>(d), N, N, PORTER_HERE);
  }
  template <typename T>
  __attribute__((noinline)) T shfl_down(T v, unsigned d, PORTER_SITE) const {
    return ::porter_emu::wave_op(::porter_emu::Op::ShflDown, v, static_cast<int>(d), N, N, PORTER_HERE);
  }
  template <typename T>
  __attribute__((noinline)) T shfl_xor(T v, unsigned m, PORTER_SITE) const {
    return ::porter_emu::wave_op(::porter_emu::Op::ShflXor, v, static_cast<int>(m), N, N, PORTER_HERE);
  }
  __attribute__((noinline)) unsigned long long ballot(int p, PORTER_SITE) const {
    return ::porter_emu::wave_op<unsigned long long>(::porter_emu::Op::Ballot, p != 0, 0, N, N, PORTER_HERE);
  }
  __attribute__((noinline)) int any(int p, PORTER_SITE) const {
    return ::porter_emu::wave_op<int>(::porter_emu::Op::Any, p != 0, 0, N, N, PORTER_HERE);
  }
  __attribute__((noinline)) int all(int p, PORTER_SITE) const {
    return ::porter_emu::wave_op<int>(::porter_emu::Op::All, p != 0, 0, N, N, PORTER_HERE);
  }

 private:
  static unsigned block_rank() { return static_cast<unsigned>(::porter_emu::linear_id(::porter_emu::self())); }
};

// The lanes of a wavefront that reached this point together (HIP: the active lanes); its operations are by rank.
class coalesced_group {
 public:
  explicit coalesced_group(uint64_t members) : members_(members) {}
  unsigned size() const { return static_cast<unsigned>(__builtin_popcountll(members_)); }
  unsigned num_threads() const { return size(); }
  unsigned thread_rank() const {
    const unsigned lane = static_cast<unsigned>(::porter_emu::lane_id());
    return static_cast<unsigned>(__builtin_popcountll(members_ & ((uint64_t(1) << lane) - 1)));
  }
  __attribute__((noinline)) void sync(PORTER_SITE) const {
    ::porter_emu::wave_op<int>(::porter_emu::Op::WaveBarrier, 0, 0, PORTER_EMU_WAVE, PORTER_EMU_WAVE, PORTER_HERE,
                               members_);
  }
  template <typename T>
  __attribute__((noinline)) T shfl(T v, int src, PORTER_SITE) const {
    return ::porter_emu::wave_op(::porter_emu::Op::Shfl, v, src, PORTER_EMU_WAVE, PORTER_EMU_WAVE, PORTER_HERE, members_);
  }
  template <typename T>
  __attribute__((noinline)) T shfl_up(T v, unsigned d, PORTER_SITE) const {
    return ::porter_emu::wave_op(::porter_emu::Op::ShflUp, v, static_cast<int>(d), PORTER_EMU_WAVE, PORTER_EMU_WAVE,
                                 PORTER_HERE, members_);
  }
  template <typename T>
  __attribute__((noinline)) T shfl_down(T v, unsigned d, PORTER_SITE) const {
    return ::porter_emu::wave_op(::porter_emu::Op::ShflDown, v, static_cast<int>(d), PORTER_EMU_WAVE,
                                 PORTER_EMU_WAVE, PORTER_HERE, members_);
  }
  __attribute__((noinline)) unsigned long long ballot(int p, PORTER_SITE) const {
    return ::porter_emu::wave_op<unsigned long long>(::porter_emu::Op::Ballot, p != 0, 0, PORTER_EMU_WAVE,
                                                     PORTER_EMU_WAVE, PORTER_HERE, members_);
  }
  __attribute__((noinline)) int any(int p, PORTER_SITE) const {
    return ::porter_emu::wave_op<int>(::porter_emu::Op::Any, p != 0, 0, PORTER_EMU_WAVE, PORTER_EMU_WAVE, PORTER_HERE,
                                      members_);
  }
  __attribute__((noinline)) int all(int p, PORTER_SITE) const {
    return ::porter_emu::wave_op<int>(::porter_emu::Op::All, p != 0, 0, PORTER_EMU_WAVE, PORTER_EMU_WAVE, PORTER_HERE,
                                      members_);
  }

 private:
  uint64_t members_;
};

// which lanes of the wavefront arrived here together: a wave operation whose group is whoever is at this call site
__attribute__((noinline)) inline coalesced_group coalesced_threads(PORTER_SITE) {
  return coalesced_group(::porter_emu::wave_op<unsigned long long>(::porter_emu::Op::Coalesce, 0ull, 0,
                                                                   PORTER_EMU_WAVE, PORTER_EMU_WAVE, PORTER_HERE));
}

template <unsigned N, typename Parent>
inline thread_block_tile<N> tiled_partition(const Parent&) {
  return thread_block_tile<N>();
}

}  // namespace cooperative_groups
