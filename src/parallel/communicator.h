// Communicator: the collectives tensor parallelism needs (all-reduce sum, all-gather, broadcast,
// barrier) over N ranks, one object per rank. Buffers are raw pointers on the rank's device:
// host memory for the in-process communicator (CPU ranks as threads of one process), device
// memory for NCCL (CUDA build).
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "core/dtype.h"

namespace kestrel {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // buf [count] of dtype, in place: every rank ends with the same sum (ranks summed in order
  // 0..N-1).
  virtual void all_reduce_sum(void* buf, size_t count, DType dtype) = 0;
  // send [count] of every rank into recv [size() * count], rank r's at r * count.
  virtual void all_gather(const void* send, void* recv, size_t count, DType dtype) = 0;
  // buf [count]: root's values on every rank.
  virtual void broadcast(void* buf, size_t count, DType dtype, int root) = 0;
  virtual void barrier() = 0;
};

// A communicator that times another: wall seconds spent inside its collectives (they return when
// done: the in-process ones at their last barrier, NCCL's after a stream sync), for benchmarks.
class TimedCommunicator final : public Communicator {
 public:
  explicit TimedCommunicator(std::shared_ptr<Communicator> inner);
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  void all_reduce_sum(void* buf, size_t count, DType dtype) override;
  void all_gather(const void* send, void* recv, size_t count, DType dtype) override;
  void broadcast(void* buf, size_t count, DType dtype, int root) override;
  void barrier() override;
  double seconds() const { return seconds_; }
  int64_t calls() const { return calls_; }

 private:
  template <typename F>
  void timed(F&& f);
  std::shared_ptr<Communicator> inner_;
  double seconds_ = 0;
  int64_t calls_ = 0;
};

// A reusable barrier for `count` threads. The last thread to arrive runs `on_last` (if given)
// before any thread is released, so it can prepare what every thread reads next.
class ThreadBarrier {
 public:
  explicit ThreadBarrier(int count);
  void arrive_and_wait(const std::function<void()>& on_last = nullptr);

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  const int count_;
  int waiting_ = 0;
  uint64_t generation_ = 0;
};

// N ranks as threads of one process: make_in_process_group(N) returns one communicator per
// rank sharing one state; rank r's object must only be used from one thread at a time, and every
// rank must call the same collectives in the same order (as with NCCL).
std::vector<std::shared_ptr<Communicator>> make_in_process_group(int size);

}  // namespace kestrel
