// Tensor parallelism across processes (`--nnodes N --node-rank R --master-addr A --master-port P`):
// one rank per process, joined over TCP. Rank 0 listens on A:P, the others connect (retrying
// until the timeout) and say their rank; the star of sockets then carries
//  - the NCCL unique id from rank 0 to every rank (CUDA: ncclCommInitRank over the processes),
//  - on the CPU, the collectives themselves (TcpCommunicator): every rank sends its buffer to
//    rank 0, which sums in rank order 0..N-1 (as the in-process communicator does, so both give
//    the same bits) and sends the result back.
// Every message carries (op, count, dtype), so ranks calling different collectives fail with an
// error naming both instead of reading garbage; a peer that exits fails the others' next call.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "parallel/communicator.h"

namespace kestrel {

struct ProcessGroupOptions {
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  std::chrono::seconds timeout{120};  // for the others to connect / to reach rank 0
};

// Throws kestrel::Error naming the field unless 1 <= nnodes, 0 <= node_rank < nnodes and the port
// is in [1, 65535].
void check_process_group(const ProcessGroupOptions& opts);

// The socket star of one process (rank node_rank of nnodes). Blocks until every rank has joined.
class ProcessGroup {
 public:
  explicit ProcessGroup(const ProcessGroupOptions& opts);
  ~ProcessGroup();
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  int rank() const;
  int size() const;
  // Rank 0's `bytes` on every rank (others pass any buffer of the same size to be filled).
  void broadcast_bytes(std::vector<uint8_t>& bytes);

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
  friend class TcpCommunicator;
};

// CPU collectives over the group's sockets (F32, I32, I64 sums; any dtype gathered).
std::shared_ptr<Communicator> make_tcp_communicator(std::shared_ptr<ProcessGroup> group);

}  // namespace kestrel
