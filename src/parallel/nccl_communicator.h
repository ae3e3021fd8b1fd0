// NCCL communicator (CUDA build only): one process drives all local GPUs, one thread per rank,
// the communicators made together by ncclCommInitAll. Buffers are device pointers; each call
// waits for kestrel's CUDA stream first and returns when the collective is done, so the model
// needs no stream juggling (the multi-GPU issue will overlap them).
#pragma once

#include <memory>
#include <vector>

#include "parallel/communicator.h"

namespace kestrel {

// Communicators for GPUs 0..size-1 (throws naming the NCCL error, or when fewer are visible).
std::vector<std::shared_ptr<Communicator>> make_nccl_group(int size);

class ProcessGroup;
// This process's rank of a group of processes, one GPU each (the process's current CUDA device,
// 0 unless CUDA_VISIBLE_DEVICES says otherwise): rank 0 makes the NCCL unique id and sends it to
// the others over the process group's sockets, then every rank joins with ncclCommInitRank.
std::shared_ptr<Communicator> make_nccl_process_rank(const std::shared_ptr<ProcessGroup>& group);

}  // namespace kestrel
