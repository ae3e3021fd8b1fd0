// In-process communicator: ranks are threads; each collective publishes the ranks' buffer
// pointers, then every rank works on its own chunk of the result between barriers.
#include <algorithm>
#include <chrono>
#include <cstring>

#include "core/error.h"
#include "parallel/communicator.h"

namespace kestrel {

ThreadBarrier::ThreadBarrier(int count) : count_(count) {
  KESTREL_CHECK(count >= 1, "ThreadBarrier: thread count must be >= 1, got ", count);
}

void ThreadBarrier::arrive_and_wait(const std::function<void()>& on_last) {
  std::unique_lock<std::mutex> lock(mu_);
  const uint64_t gen = generation_;
  if (++waiting_ == count_) {
    if (on_last) on_last();
    waiting_ = 0;
    ++generation_;
    cv_.notify_all();
    return;
  }
  cv_.wait(lock, [&] { return generation_ != gen; });
}

TimedCommunicator::TimedCommunicator(std::shared_ptr<Communicator> inner)
    : inner_(std::move(inner)) {
  KESTREL_CHECK(inner_ != nullptr, "TimedCommunicator: no communicator");
}

template <typename F>
void TimedCommunicator::timed(F&& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ++calls_;
}

void TimedCommunicator::all_reduce_sum(void* buf, size_t count, DType dtype) {
  timed([&] { inner_->all_reduce_sum(buf, count, dtype); });
}
void TimedCommunicator::all_gather(const void* send, void* recv, size_t count, DType dtype) {
  timed([&] { inner_->all_gather(send, recv, count, dtype); });
}
void TimedCommunicator::broadcast(void* buf, size_t count, DType dtype, int root) {
  timed([&] { inner_->broadcast(buf, count, dtype, root); });
}
void TimedCommunicator::barrier() {
  timed([&] { inner_->barrier(); });
}

namespace {

struct SharedState {
  explicit SharedState(int n) : barrier(n), ptrs(n, nullptr) {}
  ThreadBarrier barrier;
  std::vector<const void*> ptrs;  // [size] each rank's published buffer
  std::vector<float> scratch;     // all-reduce result
};

template <typename T>
void sum_chunk(const std::vector<const void*>& ptrs, T* out, size_t begin, size_t end) {
  for (size_t i = begin; i < end; ++i) {
    T acc = static_cast<const T*>(ptrs[0])[i];
    for (size_t r = 1; r < ptrs.size(); ++r) acc += static_cast<const T*>(ptrs[r])[i];
    out[i] = acc;
  }
}

class InProcessCommunicator final : public Communicator {
 public:
  InProcessCommunicator(std::shared_ptr<SharedState> state, int rank, int size)
      : state_(std::move(state)), rank_(rank), size_(size) {}

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void all_reduce_sum(void* buf, size_t count, DType dtype) override {
    KESTREL_CHECK(dtype == DType::kF32 || dtype == DType::kI32, "in-process all_reduce_sum: dtype ",
                  dtype_name(dtype), " not supported (F32, I32)");
    if (size_ == 1) return;
    SharedState& s = *state_;
    s.ptrs[rank_] = buf;
    const size_t words = count;  // F32 and I32 are both 4 bytes
    s.barrier.arrive_and_wait([&] { s.scratch.resize(std::max(s.scratch.size(), words)); });
    // Rank r sums chunk r of every rank's buffer into the shared result.
    const size_t chunk = (count + size_ - 1) / size_;
    const size_t begin = std::min(count, chunk * rank_), end = std::min(count, begin + chunk);
    if (dtype == DType::kF32) {
      sum_chunk<float>(s.ptrs, s.scratch.data(), begin, end);
    } else {
      sum_chunk<int32_t>(s.ptrs, reinterpret_cast<int32_t*>(s.scratch.data()), begin, end);
    }
    s.barrier.arrive_and_wait();
    std::memcpy(buf, s.scratch.data(), count * 4);
    s.barrier.arrive_and_wait();  // nobody reuses scratch before every rank copied it
  }

  void all_gather(const void* send, void* recv, size_t count, DType dtype) override {
    const size_t bytes = count * dtype_size(dtype);
    if (size_ == 1) {
      if (recv != send) std::memmove(recv, send, bytes);
      return;
    }
    SharedState& s = *state_;
    s.ptrs[rank_] = send;
    s.barrier.arrive_and_wait();
    for (int r = 0; r < size_; ++r) {
      std::memcpy(static_cast<std::byte*>(recv) + r * bytes, s.ptrs[r], bytes);
    }
    s.barrier.arrive_and_wait();
  }

  void broadcast(void* buf, size_t count, DType dtype, int root) override {
    KESTREL_CHECK(root >= 0 && root < size_, "broadcast: root ", root, " outside [0, ", size_, ")");
    if (size_ == 1) return;
    SharedState& s = *state_;
    s.ptrs[rank_] = buf;
    s.barrier.arrive_and_wait();
    if (rank_ != root) std::memcpy(buf, s.ptrs[root], count * dtype_size(dtype));
    s.barrier.arrive_and_wait();
  }

  void barrier() override { state_->barrier.arrive_and_wait(); }

 private:
  std::shared_ptr<SharedState> state_;
  int rank_, size_;
};

}  // namespace

std::vector<std::shared_ptr<Communicator>> make_in_process_group(int size) {
  KESTREL_CHECK(size >= 1, "in-process communicator: size must be >= 1, got ", size);
  auto state = std::make_shared<SharedState>(size);
  std::vector<std::shared_ptr<Communicator>> comms;
  for (int r = 0; r < size; ++r)
    comms.push_back(std::make_shared<InProcessCommunicator>(state, r, size));
  return comms;
}

}  // namespace kestrel
