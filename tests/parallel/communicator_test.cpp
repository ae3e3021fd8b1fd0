// The in-process communicator with 1..4 rank threads: every collective against the values
// computed directly, repeated (the barrier is reused), with uneven sizes.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "core/error.h"
#include "parallel/communicator.h"

namespace kestrel {
namespace {

void run_ranks(int n, const std::function<void(Communicator&)>& body) {
  auto comms = make_in_process_group(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) threads.emplace_back([&, r] { body(*comms[r]); });
  for (auto& t : threads) t.join();
}

class CommTest : public ::testing::TestWithParam<int> {};

TEST_P(CommTest, AllReduceSumMatchesDirectSum) {
  const int n = GetParam();
  for (size_t count : {size_t{1}, size_t{7}, size_t{1000}, size_t{4099}}) {
    std::vector<std::vector<float>> results(n);
    run_ranks(n, [&](Communicator& c) {
      for (int rep = 0; rep < 3; ++rep) {
        std::vector<float> buf(count);
        for (size_t i = 0; i < count; ++i) buf[i] = 0.25f * (c.rank() + 1) * (i % 13) + rep;
        c.all_reduce_sum(buf.data(), count, DType::kF32);
        if (rep == 2) results[c.rank()] = buf;
      }
    });
    for (int r = 0; r < n; ++r) {
      ASSERT_EQ(results[r].size(), count);
      for (size_t i = 0; i < count; ++i) {
        float want = 0;
        for (int q = 0; q < n; ++q) want += 0.25f * (q + 1) * (i % 13) + 2;
        ASSERT_FLOAT_EQ(results[r][i], want) << "rank " << r << " element " << i;
      }
    }
  }
}

TEST_P(CommTest, AllReduceIntAndAllGatherAndBroadcast) {
  const int n = GetParam();
  std::atomic<int> failures{0};
  run_ranks(n, [&](Communicator& c) {
    EXPECT_EQ(c.size(), n);
    int32_t v[3] = {c.rank(), 1, -c.rank()};
    c.all_reduce_sum(v, 3, DType::kI32);
    if (v[0] != n * (n - 1) / 2 || v[1] != n || v[2] != -n * (n - 1) / 2) ++failures;

    std::vector<float> send(5, static_cast<float>(c.rank()) + 0.5f);
    std::vector<float> recv(5 * n, -1.0f);
    c.all_gather(send.data(), recv.data(), 5, DType::kF32);
    for (int r = 0; r < n; ++r)
      for (int i = 0; i < 5; ++i)
        if (recv[r * 5 + i] != r + 0.5f) ++failures;

    for (int root = 0; root < n; ++root) {
      std::vector<int64_t> b(4, c.rank() == root ? 100 + root : -7);
      c.broadcast(b.data(), 4, DType::kI64, root);
      for (int64_t x : b)
        if (x != 100 + root) ++failures;
    }
    c.barrier();
  });
  EXPECT_EQ(failures.load(), 0);
}

INSTANTIATE_TEST_SUITE_P(Ranks, CommTest, ::testing::Values(1, 2, 3, 4));

TEST(ThreadBarrier, OnLastRunsOncePerRoundBeforeRelease) {
  const int n = 4, rounds = 50;
  ThreadBarrier barrier(n);
  int counter = 0;  // written only by the last arriver
  std::atomic<int> bad{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < n; ++t) {
    threads.emplace_back([&] {
      for (int round = 0; round < rounds; ++round) {
        barrier.arrive_and_wait([&] { ++counter; });
        if (counter != round + 1) ++bad;
        barrier.arrive_and_wait();  // nobody starts the next round before all checked
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(counter, rounds);
  EXPECT_EQ(bad.load(), 0);
}

TEST(InProcessCommunicator, RejectsBadArguments) {
  EXPECT_THROW(make_in_process_group(0), Error);
  auto comms = make_in_process_group(1);
  float x = 1;
  EXPECT_THROW(comms[0]->all_reduce_sum(&x, 1, DType::kBF16), Error);
  EXPECT_THROW(comms[0]->broadcast(&x, 1, DType::kF32, 1), Error);
}

}  // namespace
}  // namespace kestrel
