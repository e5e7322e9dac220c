// porter's emulated HIP target: the runtime. Written for porter (no vendor code).
//
// A kernel launch runs every block of the grid, one after the other, on the calling CPU thread. Inside a block
// every GPU thread is a fiber (ucontext) with a stack of its own; a fiber runs until it reaches an operation
// that needs other threads (__syncthreads, a shuffle, a ballot, a wave or tile barrier) or returns. When every
// fiber of the block has stopped, the scheduler completes what can be completed:
//   - a wavefront (W consecutive linear thread ids, W = PORTER_EMU_WAVE) whose every existing lane waits at the
//     same wave operation (same kind, same call site) gets its results, computed as AMD's ds_bpermute does;
//   - a cooperative-groups tile of N lanes (N <= W) likewise, per tile;
//   - when every thread that has not returned waits at __syncthreads, all go on.
// Anything else is not modelled and is an error naming the kernel, the file and line and the lanes: a wave
// operation reached by only part of a wavefront (divergence), lanes of one wavefront at different operations,
// a shuffle that reads a lane no thread occupies, a deadlock. Results are never made up.
//
// Shared memory: `__shared__` variables are thread-locals (block-scope ones are static): blocks run one at a time on
// one CPU thread, so one copy serves each block in turn, not reset between blocks, as on a GPU. Each `extern
// __shared__` array (dynamic shared memory) is defined when the module is linked (porter.emulate.shared) with
// kDynamicShared bytes; a launch that asks for more is an error.
#pragma once

#ifndef PORTER_EMU_WAVE
#error "porter emulated HIP target: PORTER_EMU_WAVE (32 or 64) must be defined (porter's emulate-wave32/64 profiles do)"
#endif
#if PORTER_EMU_WAVE != 32 && PORTER_EMU_WAVE != 64
#error "porter emulated HIP target: PORTER_EMU_WAVE must be 32 or 64"
#endif

#include <ucontext.h>
#include <sys/mman.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

struct dim3 {
  uint32_t x, y, z;
  constexpr dim3(uint32_t x_ = 1, uint32_t y_ = 1, uint32_t z_ = 1) : x(x_), y(y_), z(z_) {}
};
struct uint3 {
  uint32_t x, y, z;
};

namespace porter_emu {

constexpr int kWave = PORTER_EMU_WAVE;
constexpr std::size_t kStack = 256 * 1024;
constexpr std::size_t kMaxBytes = 64;  // the largest value one shuffle moves
constexpr std::size_t kDynamicShared = 160 * 1024;  // porter.emulate.shared.CAPACITY: an MI355X's LDS

// What the emulator does not model, or a kernel that breaks its rules: the launch throws this (a RuntimeError
// in Python), naming the kernel and where.
struct Unmodelled : std::runtime_error {
  using std::runtime_error::runtime_error;
};

enum class State : uint8_t { Ready, Barrier, WaveOp, Done };
enum class Op : uint8_t { Shfl, ShflUp, ShflDown, ShflXor, Ballot, Any, All, WaveBarrier, Coalesce };

inline const char* op_name(Op op) {
  switch (op) {
    case Op::Shfl: return "__shfl";
    case Op::ShflUp: return "__shfl_up";
    case Op::ShflDown: return "__shfl_down";
    case Op::ShflXor: return "__shfl_xor";
    case Op::Ballot: return "__ballot";
    case Op::Any: return "__any";
    case Op::All: return "__all";
    case Op::WaveBarrier: return "a wave barrier (__syncwarp)";
    case Op::Coalesce: return "cooperative_groups::coalesced_threads";
  }
  return "?";
}

struct Site {
  const char* file = "";
  int line = 0;
  const void* code = nullptr;  // the return address inside the caller: one per call site, also when inlined
  bool operator==(const Site& o) const { return code == o.code && line == o.line && std::strcmp(file, o.file) == 0; }
};

struct Lane {
  ucontext_t ctx;
  uint3 tid{0, 0, 0};
  State state = State::Ready;
  Op op = Op::Shfl;
  Site site;
  int group = kWave;  // lanes that take part in this wave op together: the wavefront, or a tile
  uint64_t members = 0;  // a coalesced group's lanes (bits of the wavefront); 0: the fixed group above
  int arg = 0;        // source lane, delta or xor mask
  int width = kWave;
  std::size_t size = 0;
  alignas(16) unsigned char in[kMaxBytes];
  alignas(16) unsigned char out[kMaxBytes];
};

struct Block {
  dim3 grid, block;
  uint3 bid{0, 0, 0};
  int threads = 0;
  std::vector<Lane> lanes;
  ucontext_t scheduler;
  void (*body)(void*) = nullptr;
  void* body_arg = nullptr;
  std::exception_ptr error;
  const char* kernel = "";
  const char* launch_file = "";
  int launch_line = 0;
};

inline thread_local Block* g_block = nullptr;
inline thread_local Lane* g_lane = nullptr;

[[noreturn]] inline void fail(const std::string& what) {
  Block* b = g_block;
  std::string where = b ? std::string("porter emulated HIP target (wave ") + std::to_string(kWave) + "): kernel " +
                              b->kernel + " launched at " + b->launch_file + ":" + std::to_string(b->launch_line) +
                              ", block (" + std::to_string(b->bid.x) + "," + std::to_string(b->bid.y) + "," +
                              std::to_string(b->bid.z) + "): "
                        : std::string("porter emulated HIP target: ");
  throw Unmodelled(where + what);
}

inline Lane& self() {
  if (g_lane == nullptr) throw Unmodelled("porter emulated HIP target: a device function ran outside a kernel launch");
  return *g_lane;
}
inline int linear_id(const Lane& l) {
  const Block& b = *g_block;
  return static_cast<int>(l.tid.x + l.tid.y * b.block.x + l.tid.z * b.block.x * b.block.y);
}
inline int lane_id() { return linear_id(self()) % kWave; }

// back to the scheduler; returns when the scheduler resumes this fiber
inline void yield() {
  Lane& l = self();
  swapcontext(&l.ctx, &g_block->scheduler);
}

inline void syncthreads() {
  self().state = State::Barrier;
  yield();
}

// one wave operation of the calling lane: its operand in, its result out (after the whole group arrived)
template <typename T>
inline T wave_op(Op op, T value, int arg, int width, int group, const char* file, int line, const void* code,
                 uint64_t members = 0) {
  static_assert(std::is_trivially_copyable<T>::value, "porter emulated HIP target: a shuffled type must be trivially copyable");
  static_assert(sizeof(T) <= kMaxBytes, "porter emulated HIP target: a shuffled value of more than 64 bytes");
  Lane& l = self();
  l.state = State::WaveOp;
  l.op = op;
  l.site = Site{file, line, code};
  l.arg = arg;
  l.width = width;
  l.group = group;
  l.members = members;
  l.size = sizeof(T);
  std::memcpy(l.in, &value, sizeof(T));
  yield();
  T out;
  std::memcpy(&out, l.out, sizeof(T));
  return out;
}

inline std::string lanes_text(const std::vector<int>& ids) {
  std::string s;
  int ranges = 0;
  for (std::size_t i = 0; i < ids.size();) {
    if (++ranges > 6) {
      s += ",... (" + std::to_string(ids.size()) + " lanes)";
      break;
    }
    std::size_t j = i;
    while (j + 1 < ids.size() && ids[j + 1] == ids[j] + 1) ++j;
    if (!s.empty()) s += ",";
    s += std::to_string(ids[i]);
    if (j > i) s += "-" + std::to_string(ids[j]);
    i = j + 1;
  }
  return s;
}

inline std::string where_text(const Lane& l) {
  switch (l.state) {
    case State::Done: return "returned";
    case State::Barrier: return "at __syncthreads";
    case State::Ready: return "running";
    case State::WaveOp:
      return std::string("at ") + op_name(l.op) + " (" + l.site.file + ":" + std::to_string(l.site.line) + ")";
  }
  return "?";
}

// The source lane ds_bpermute reads for lane `me` (HIP's formulas for __shfl*, which CUDA's match for
// power-of-two widths); the index wraps at the wavefront as the hardware's byte address does.
inline int source_lane(const Lane& l, int me) {
  const int w = l.width;
  int index = me;
  switch (l.op) {
    case Op::Shfl: index = (l.arg & (w - 1)) + (me & ~(w - 1)); break;
    case Op::ShflUp: index = me - l.arg; if (index < (me & ~(w - 1))) index = me; break;
    case Op::ShflDown: index = me + l.arg; if ((me & (w - 1)) + l.arg >= w) index = me; break;
    case Op::ShflXor: index = me ^ l.arg; if (index >= ((me + w) & ~(w - 1))) index = me; break;
    default: break;
  }
  return index & (kWave - 1);
}

// The lanes (block thread ids, in lane order) that take part with lane i in its wave operation: the lanes at the
// same coalesce point (cg::coalesced_threads: whoever arrived there together), a coalesced group's members, or the
// fixed group (the wavefront, or a tile) that lane i is in.
inline std::vector<int> group_of(const Block& b, int i, int base, int end) {
  const Lane& l = b.lanes[i];
  std::vector<int> out;
  if (l.op == Op::Coalesce) {
    for (int j = base; j < end; ++j) {
      const Lane& o = b.lanes[j];
      if (o.state == State::WaveOp && o.op == Op::Coalesce && o.site == l.site) out.push_back(j);
    }
  } else if (l.members != 0) {
    for (int k = 0; k < kWave; ++k)
      if ((l.members >> k) & 1) out.push_back(base + k);
  } else {
    const int gbase = base + ((i - base) / l.group) * l.group;
    for (int j = gbase; j < gbase + l.group && j < end; ++j) out.push_back(j);
  }
  return out;
}

inline std::string site_text(const Lane& l) {
  return std::string(op_name(l.op)) + " at " + l.site.file + ":" + std::to_string(l.site.line);
}

// The rank of the lane one of a coalesced group's shuffles reads (HIP's coalesced_group: ranks are the members in
// lane order; out of range reads the lane's own value).
inline int source_rank(const Lane& l, int rank, int size) {
  int r = rank;
  switch (l.op) {
    case Op::Shfl: r = ((l.arg % size) + size) % size; break;
    case Op::ShflUp: r = rank - l.arg >= 0 ? rank - l.arg : rank; break;
    case Op::ShflDown: r = rank + l.arg < size ? rank + l.arg : rank; break;
    case Op::ShflXor: r = (rank ^ l.arg) < size ? (rank ^ l.arg) : rank; break;
    default: break;
  }
  return r;
}

// Complete the wave operations whose groups have all arrived; error on any group that cannot complete.
inline bool resolve_wave_ops(Block& b) {
  bool any = false;
  const int n = b.threads;
  for (int base = 0; base < n; base += kWave) {
    const int end = base + kWave < n ? base + kWave : n;
    for (int i = base; i < end; ++i) {
      Lane& first = b.lanes[i];
      if (first.state != State::WaveOp) continue;
      const std::vector<int> group = group_of(b, i, base, end);
      // every member must be here, at the same operation and call site
      std::vector<int> here, away;
      for (int j : group) {
        const Lane& o = b.lanes[j];
        const bool same = o.state == State::WaveOp && o.op == first.op && o.site == first.site &&
                          o.group == first.group && o.members == first.members;
        (same ? here : away).push_back(j - base);
      }
      if (!away.empty()) {
        const Lane& other = b.lanes[base + away.front()];
        const std::string what = first.members ? " (a coalesced group)" :
                                 first.group < kWave ? " (tile of " + std::to_string(first.group) + ")" : "";
        fail(site_text(first) + " reached by lanes " + lanes_text(here) + " of wavefront " +
             std::to_string(base / kWave) + what + " but not by lanes " + lanes_text(away) + " (lane " +
             std::to_string(away.front()) + " is " + where_text(other) +
             "): a divergent wave operation is not modelled");
      }
      const int size = static_cast<int>(group.size());
      uint64_t bits = 0;  // votes: by position in the group (tile or coalesced rank; the lane in a wavefront)
      for (int r = 0; r < size; ++r) {
        int pred;
        std::memcpy(&pred, b.lanes[group[r]].in, sizeof(int));
        if (pred) bits |= uint64_t(1) << r;
      }
      uint64_t mask = 0;
      for (int j : group) mask |= uint64_t(1) << (j - base);
      const uint64_t all = size >= 64 ? ~uint64_t(0) : ((uint64_t(1) << size) - 1);
      // results: every operand is read before any result is written (each lane has its own out buffer)
      for (int r = 0; r < size; ++r) {
        Lane& me = b.lanes[group[r]];
        const int lane = group[r] - base;
        int flag = 0;
        switch (me.op) {
          case Op::Coalesce: std::memcpy(me.out, &mask, sizeof(uint64_t)); break;
          case Op::Ballot: std::memcpy(me.out, &bits, sizeof(uint64_t)); break;
          case Op::Any: flag = bits != 0; std::memcpy(me.out, &flag, sizeof(int)); break;
          case Op::All: flag = bits == all; std::memcpy(me.out, &flag, sizeof(int)); break;
          case Op::WaveBarrier: break;
          default: {
            int src;
            if (me.members != 0) {
              src = group[source_rank(me, r, size)] - base;
            } else {
              src = source_lane(me, lane);
              if (base + src >= end) {
                fail(site_text(me) + ": lane " + std::to_string(lane) + " of wavefront " +
                     std::to_string(base / kWave) + " reads lane " + std::to_string(src) +
                     ", which no thread of the block (" + std::to_string(n) + " threads) occupies: not modelled");
              }
              if (me.group < kWave && (src / me.group) != (lane / me.group)) {
                fail(std::string("a tile shuffle at ") + me.site.file + ":" + std::to_string(me.site.line) +
                     " reads outside its tile: not modelled");
              }
            }
            std::memcpy(me.out, b.lanes[base + src].in, me.size);
          }
        }
      }
      for (int j : group) b.lanes[j].state = State::Ready;
      any = true;
    }
  }
  return any;
}

struct Stacks {
  unsigned char* base = nullptr;
  std::size_t count = 0;
  ~Stacks() {
    if (base) munmap(base, count * kStack);
  }
  unsigned char* get(std::size_t n) {
    if (n > count) {
      if (base) munmap(base, count * kStack);
      void* p = mmap(nullptr, n * kStack, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
      if (p == MAP_FAILED) throw Unmodelled("porter emulated HIP target: no memory for the threads' stacks");
      base = static_cast<unsigned char*>(p);
      count = n;
    }
    return base;
  }
};

inline void fiber_main() {
  Block* b = g_block;
  try {
    b->body(b->body_arg);
  } catch (...) {
    if (!b->error) b->error = std::current_exception();
  }
  g_lane->state = State::Done;
  // returning resumes uc_link: the scheduler
}

inline void run_block(Block& b) {
  static thread_local Stacks stacks;
  const int n = b.threads;
  unsigned char* mem = stacks.get(static_cast<std::size_t>(n));
  b.lanes.assign(static_cast<std::size_t>(n), Lane{});
  for (int t = 0; t < n; ++t) {
    Lane& l = b.lanes[t];
    l.tid = uint3{t % b.block.x, (t / b.block.x) % b.block.y, t / (b.block.x * b.block.y)};
    getcontext(&l.ctx);
    l.ctx.uc_stack.ss_sp = mem + static_cast<std::size_t>(t) * kStack;
    l.ctx.uc_stack.ss_size = kStack;
    l.ctx.uc_link = &b.scheduler;
    makecontext(&l.ctx, fiber_main, 0);
  }
  for (;;) {
    for (int t = 0; t < n; ++t) {
      Lane& l = b.lanes[t];
      if (l.state != State::Ready) continue;
      g_lane = &l;
      swapcontext(&b.scheduler, &l.ctx);
      g_lane = nullptr;
      if (b.error) std::rethrow_exception(b.error);
    }
    if (resolve_wave_ops(b)) continue;
    int done = 0, waiting = 0;
    for (const Lane& l : b.lanes) {
      done += l.state == State::Done;
      waiting += l.state == State::Barrier;
    }
    if (done == n) return;
    if (done + waiting == n) {
      for (Lane& l : b.lanes)
        if (l.state == State::Barrier) l.state = State::Ready;
      continue;
    }
    fail("the block cannot go on (threads wait at operations that can never complete): not modelled");
  }
}

template <typename F>
inline void call_body(void* p) {
  (*static_cast<F*>(p))();
}

// Run `kernel_call` (a callable that calls the kernel with its arguments) for every thread of the grid.
template <typename F>
inline void launch(const char* kernel, const char* file, int line, dim3 grid, dim3 block, std::size_t shared,
                   F&& kernel_call) {
  const uint64_t threads = uint64_t(block.x) * block.y * block.z;
  if (threads == 0 || grid.x == 0 || grid.y == 0 || grid.z == 0) return;
  if (threads > 1024) {
    throw Unmodelled(std::string("porter emulated HIP target: kernel ") + kernel + " launched at " + file + ":" +
                     std::to_string(line) + " with " + std::to_string(threads) +
                     " threads per block; a HIP device allows at most 1024");
  }
  if (g_block != nullptr) throw Unmodelled("porter emulated HIP target: a kernel launched from device code");
  using Fn = std::decay_t<F>;
  Fn call(std::forward<F>(kernel_call));
  Block b;
  b.grid = grid;
  b.block = block;
  b.threads = static_cast<int>(threads);
  b.kernel = kernel;
  b.launch_file = file;
  b.launch_line = line;
  b.body = &call_body<Fn>;
  b.body_arg = &call;
  if (shared > kDynamicShared) {
    throw Unmodelled(std::string("porter emulated HIP target: kernel ") + kernel + " launched at " + file + ":" +
                     std::to_string(line) + " asks for " + std::to_string(shared) +
                     " bytes of dynamic shared memory; the emulated device has " + std::to_string(kDynamicShared));
  }
  g_block = &b;
  try {
    for (uint32_t z = 0; z < grid.z; ++z)
      for (uint32_t y = 0; y < grid.y; ++y)
        for (uint32_t x = 0; x < grid.x; ++x) {
          b.bid = uint3{x, y, z};
          b.error = nullptr;
          run_block(b);
        }
  } catch (...) {
    g_block = nullptr;
    g_lane = nullptr;
    throw;
  }
  g_block = nullptr;
}

}  // namespace porter_emu
