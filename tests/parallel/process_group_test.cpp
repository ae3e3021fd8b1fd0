// ProcessGroup + TcpCommunicator with the ranks as threads on localhost (each has its own
// sockets, as separate processes would): the collectives give the in-process communicator's bits,
// and mismatched calls, bad options and a vanished peer are errors naming them.
#include <gtest/gtest.h>

#include <utility>

#include <boost/asio.hpp>
#include <functional>
#include <random>
#include <thread>

#include "core/error.h"
#include "parallel/communicator.h"
#include "parallel/process_group.h"

namespace kestrel {
namespace {

int free_port() {
  boost::asio::io_context ctx;
  boost::asio::ip::tcp::acceptor acc(
      ctx, boost::asio::ip::tcp::endpoint(boost::asio::ip::make_address("127.0.0.1"), 0));
  return acc.local_endpoint().port();
}

// Runs fn(rank, communicator) on n threads, each joining the group itself; returns the errors.
std::vector<std::string> run_ranks(int n, const std::function<void(int, Communicator&)>& fn,
                                   int port = 0) {
  if (port == 0) port = free_port();
  std::vector<std::string> errors(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        ProcessGroupOptions o;
        o.nnodes = n;
        o.node_rank = r;
        o.master_port = port;
        o.timeout = std::chrono::seconds(20);
        auto comm = make_tcp_communicator(std::make_shared<ProcessGroup>(o));
        fn(r, *comm);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

std::vector<float> rank_values(int r, size_t n) {
  std::mt19937 rng(100 + r);
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

TEST(ProcessGroup, AllReduceMatchesInProcessBits) {
  for (int n : {2, 3}) {
    const size_t count = 1000;
    std::vector<std::vector<float>> in_proc(n);
    {
      auto comms = make_in_process_group(n);
      std::vector<std::thread> ts;
      for (int r = 0; r < n; ++r) {
        ts.emplace_back([&, r] {
          in_proc[r] = rank_values(r, count);
          comms[r]->all_reduce_sum(in_proc[r].data(), count, DType::kF32);
        });
      }
      for (auto& t : ts) t.join();
    }
    std::vector<std::vector<float>> tcp(n);
    auto errors = run_ranks(n, [&](int r, Communicator& c) {
      tcp[r] = rank_values(r, count);
      c.all_reduce_sum(tcp[r].data(), count, DType::kF32);
    });
    for (int r = 0; r < n; ++r) {
      EXPECT_EQ(errors[r], "");
      EXPECT_EQ(tcp[r], in_proc[0]) << "rank " << r << " of " << n;
    }
  }
}

TEST(ProcessGroup, AllGatherBroadcastBarrier) {
  const int n = 3;
  std::vector<std::vector<int32_t>> gathered(n), bcast(n);
  auto errors = run_ranks(n, [&](int r, Communicator& c) {
    std::vector<int32_t> mine = {r * 10, r * 10 + 1};
    gathered[r].resize(2 * n);
    c.all_gather(mine.data(), gathered[r].data(), 2, DType::kI32);
    c.barrier();
    bcast[r] = {r, r, r};
    c.broadcast(bcast[r].data(), 3, DType::kI32, 2);
  });
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(errors[r], "");
    EXPECT_EQ(gathered[r], (std::vector<int32_t>{0, 1, 10, 11, 20, 21}));
    EXPECT_EQ(bcast[r], (std::vector<int32_t>{2, 2, 2}));
  }
}

TEST(ProcessGroup, MismatchedCollectivesAreAnError) {
  auto errors = run_ranks(2, [&](int r, Communicator& c) {
    std::vector<float> v(r == 0 ? 4 : 5, 1.0f);
    c.all_reduce_sum(v.data(), v.size(), DType::kF32);
  });
  EXPECT_NE(
      errors[0].find("called all_reduce_sum of 4 elements but rank 1 called all_reduce_sum of 5"),
      std::string::npos)
      << errors[0];
  EXPECT_NE(errors[1], "");  // rank 0 gave up and closed the socket
}

TEST(ProcessGroup, AVanishedPeerFailsTheNextCollective) {
  auto errors = run_ranks(2, [&](int r, Communicator& c) {
    if (r == 1) return;  // exits: its sockets close
    float x = 1.0f;
    c.all_reduce_sum(&x, 1, DType::kF32);
  });
  EXPECT_NE(errors[0].find("rank 1 went away during all_reduce_sum"), std::string::npos)
      << errors[0];
}

TEST(ProcessGroup, BadOptionsAndNoRankZero) {
  ProcessGroupOptions o;
  o.nnodes = 2;
  o.node_rank = 2;
  EXPECT_THROW(check_process_group(o), Error);
  o.node_rank = 0;
  o.master_port = 70000;
  EXPECT_THROW(check_process_group(o), Error);
  o.master_port = free_port();
  o.node_rank = 1;
  o.timeout = std::chrono::seconds(1);
  try {
    ProcessGroup g(o);
    FAIL() << "joined without a rank 0";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("could not reach rank 0"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace kestrel
