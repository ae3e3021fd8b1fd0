// ProcessGroup and TcpCommunicator (see process_group.h): blocking Boost.Asio sockets in a star
// around rank 0.
#include "parallel/process_group.h"

#include <utility>

#include <boost/asio.hpp>
#include <cstring>
#include <thread>

#include "core/error.h"

namespace kestrel {

namespace asio = boost::asio;
using asio::ip::tcp;

namespace {

constexpr uint32_t kMagic = 0x6b657374;  // "kest"

enum class Op : uint32_t { kHello = 1, kBytes, kAllReduce, kAllGather, kBroadcast };

const char* op_name(uint32_t op) {
  switch (static_cast<Op>(op)) {
    case Op::kHello:
      return "hello";
    case Op::kBytes:
      return "broadcast_bytes";
    case Op::kAllReduce:
      return "all_reduce_sum";
    case Op::kAllGather:
      return "all_gather";
    case Op::kBroadcast:
      return "broadcast";
  }
  return "unknown";
}

struct Header {
  uint32_t magic = kMagic;
  uint32_t op = 0;
  uint64_t count = 0;  // elements (hello: the sender's rank)
  uint32_t dtype = 0;  // hello: nnodes
  uint32_t root = 0;
};

template <typename T>
void add_into(void* acc, const void* x, size_t n) {
  T* a = static_cast<T*>(acc);
  const T* b = static_cast<const T*>(x);
  for (size_t i = 0; i < n; ++i) a[i] += b[i];
}

}  // namespace

void check_process_group(const ProcessGroupOptions& o) {
  KESTREL_CHECK(o.nnodes >= 1, "--nnodes must be >= 1, got ", o.nnodes);
  KESTREL_CHECK(o.node_rank >= 0 && o.node_rank < o.nnodes, "--node-rank ", o.node_rank,
                " outside [0, ", o.nnodes, ")");
  KESTREL_CHECK(o.master_port >= 1 && o.master_port <= 65535, "--master-port ", o.master_port,
                " outside [1, 65535]");
  KESTREL_CHECK(!o.master_addr.empty(), "--master-addr is empty");
}

struct ProcessGroup::Impl {
  ProcessGroupOptions opts;
  asio::io_context ctx;
  std::vector<tcp::socket> peers;  // rank 0: [r] the socket of rank r ([0] unused); else [0]

  tcp::socket& to_root() { return peers[0]; }

  std::string who(int r) const { return "rank " + std::to_string(r); }

  void write(tcp::socket& s, const Header& h, const void* data, size_t bytes, int peer) {
    boost::system::error_code ec;
    asio::write(s, asio::buffer(&h, sizeof h), ec);
    if (!ec && bytes > 0) asio::write(s, asio::buffer(data, bytes), ec);
    KESTREL_CHECK(!ec, "process group: sending ", op_name(h.op), " to ", who(peer),
                  " failed: ", ec.message());
  }

  // Reads a header that must match `want` (op, count, dtype, root), then `bytes` into data.
  void read(tcp::socket& s, const Header& want, void* data, size_t bytes, int peer) {
    Header h;
    boost::system::error_code ec;
    asio::read(s, asio::buffer(&h, sizeof h), ec);
    KESTREL_CHECK(!ec, "process group: ", who(peer), " went away during ", op_name(want.op), " (",
                  ec.message(), ")");
    KESTREL_CHECK(h.magic == kMagic, "process group: ", who(peer), " sent a bad frame");
    KESTREL_CHECK(
        h.op == want.op && h.count == want.count && h.dtype == want.dtype && h.root == want.root,
        "process group: ", who(opts.node_rank), " called ", op_name(want.op), " of ", want.count,
        " elements but ", who(peer), " called ", op_name(h.op), " of ", h.count,
        " (ranks must call the same collectives in the same order)");
    if (bytes > 0) asio::read(s, asio::buffer(data, bytes), ec);
    KESTREL_CHECK(!ec, "process group: ", who(peer), " went away during ", op_name(want.op), " (",
                  ec.message(), ")");
  }

  void join() {
    const auto deadline = std::chrono::steady_clock::now() + opts.timeout;
    boost::system::error_code ec;
    const auto addr = asio::ip::make_address(opts.master_addr, ec);
    KESTREL_CHECK(!ec, "--master-addr '", opts.master_addr, "' is not an IP address");
    const tcp::endpoint ep(addr, static_cast<unsigned short>(opts.master_port));
    if (opts.node_rank == 0) {
      tcp::acceptor acc(ctx);
      acc.open(ep.protocol());
      acc.set_option(tcp::acceptor::reuse_address(true));
      acc.bind(ep, ec);
      KESTREL_CHECK(!ec, "process group: rank 0 cannot listen on ", opts.master_addr, ":",
                    opts.master_port, ": ", ec.message());
      acc.listen();
      acc.non_blocking(true);
      peers.clear();
      for (int r = 0; r < opts.nnodes; ++r) peers.emplace_back(ctx);
      for (int joined = 1; joined < opts.nnodes;) {
        tcp::socket s(ctx);
        acc.accept(s, ec);
        if (ec == asio::error::would_block || ec == asio::error::try_again) {
          KESTREL_CHECK(std::chrono::steady_clock::now() < deadline, "process group: ", joined - 1,
                        " of ", opts.nnodes - 1, " ranks joined rank 0 on port ", opts.master_port,
                        " within ", opts.timeout.count(), " s");
          std::this_thread::sleep_for(std::chrono::milliseconds(10));
          continue;
        }
        KESTREL_CHECK(!ec, "process group: accept failed: ", ec.message());
        s.non_blocking(false);
        s.set_option(tcp::no_delay(true));
        Header h;
        asio::read(s, asio::buffer(&h, sizeof h), ec);
        if (ec || h.magic != kMagic || h.op != static_cast<uint32_t>(Op::kHello)) continue;
        const int r = static_cast<int>(h.count);
        KESTREL_CHECK(static_cast<int>(h.dtype) == opts.nnodes, "process group: rank ", r,
                      " was started with --nnodes ", h.dtype, ", rank 0 with ", opts.nnodes);
        KESTREL_CHECK(r >= 1 && r < opts.nnodes && !peers[r].is_open(), "process group: a second ",
                      "process says it is --node-rank ", r);
        peers[r] = std::move(s);
        ++joined;
      }
      Header ok{kMagic, static_cast<uint32_t>(Op::kHello), 0, static_cast<uint32_t>(opts.nnodes)};
      for (int r = 1; r < opts.nnodes; ++r) write(peers[r], ok, nullptr, 0, r);
    } else {
      peers.clear();
      peers.emplace_back(ctx);
      while (true) {
        tcp::socket s(ctx);
        s.connect(ep, ec);
        if (!ec) {
          s.set_option(tcp::no_delay(true));
          peers[0] = std::move(s);
          break;
        }
        KESTREL_CHECK(std::chrono::steady_clock::now() < deadline, "process group: rank ",
                      opts.node_rank, " could not reach rank 0 at ", opts.master_addr, ":",
                      opts.master_port, " within ", opts.timeout.count(), " s (", ec.message(),
                      ")");
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
      Header hello{kMagic, static_cast<uint32_t>(Op::kHello), static_cast<uint64_t>(opts.node_rank),
                   static_cast<uint32_t>(opts.nnodes)};
      write(to_root(), hello, nullptr, 0, 0);
      // Rank 0 answers once everybody is there.
      read(to_root(),
           Header{kMagic, static_cast<uint32_t>(Op::kHello), 0, static_cast<uint32_t>(opts.nnodes)},
           nullptr, 0, 0);
    }
  }
};

ProcessGroup::ProcessGroup(const ProcessGroupOptions& opts) : impl_(std::make_unique<Impl>()) {
  check_process_group(opts);
  impl_->opts = opts;
  if (opts.nnodes > 1) impl_->join();
}

ProcessGroup::~ProcessGroup() = default;

int ProcessGroup::rank() const {
  return impl_->opts.node_rank;
}
int ProcessGroup::size() const {
  return impl_->opts.nnodes;
}

void ProcessGroup::broadcast_bytes(std::vector<uint8_t>& bytes) {
  Impl& g = *impl_;
  if (size() == 1) return;
  const Header h{kMagic, static_cast<uint32_t>(Op::kBytes), bytes.size(), 0, 0};
  if (rank() == 0) {
    for (int r = 1; r < size(); ++r) g.write(g.peers[r], h, bytes.data(), bytes.size(), r);
  } else {
    g.read(g.to_root(), h, bytes.data(), bytes.size(), 0);
  }
}

class TcpCommunicator final : public Communicator {
 public:
  explicit TcpCommunicator(std::shared_ptr<ProcessGroup> group) : group_(std::move(group)) {}

  int rank() const override { return group_->rank(); }
  int size() const override { return group_->size(); }

  void all_reduce_sum(void* buf, size_t count, DType dtype) override {
    KESTREL_CHECK(dtype == DType::kF32 || dtype == DType::kI32 || dtype == DType::kI64,
                  "tcp all_reduce_sum: dtype ", dtype_name(dtype),
                  " not supported (F32, I32, I64)");
    if (size() == 1) return;
    ProcessGroup::Impl& g = *group_->impl_;
    const size_t bytes = count * dtype_size(dtype);
    const Header h{kMagic, static_cast<uint32_t>(Op::kAllReduce), count,
                   static_cast<uint32_t>(dtype), 0};
    if (rank() != 0) {
      g.write(g.to_root(), h, buf, bytes, 0);
      g.read(g.to_root(), h, buf, bytes, 0);
      return;
    }
    // Ranks summed in order 0..N-1, element by element, as the in-process communicator.
    scratch_.resize(bytes);
    for (int r = 1; r < size(); ++r) {
      g.read(g.peers[r], h, scratch_.data(), bytes, r);
      if (dtype == DType::kF32) add_into<float>(buf, scratch_.data(), count);
      if (dtype == DType::kI32) add_into<int32_t>(buf, scratch_.data(), count);
      if (dtype == DType::kI64) add_into<int64_t>(buf, scratch_.data(), count);
    }
    for (int r = 1; r < size(); ++r) g.write(g.peers[r], h, buf, bytes, r);
  }

  void all_gather(const void* send, void* recv, size_t count, DType dtype) override {
    const size_t bytes = count * dtype_size(dtype);
    auto* out = static_cast<uint8_t*>(recv);
    if (recv != send) std::memmove(out + rank() * bytes, send, bytes);
    if (size() == 1) return;
    ProcessGroup::Impl& g = *group_->impl_;
    const Header h{kMagic, static_cast<uint32_t>(Op::kAllGather), count,
                   static_cast<uint32_t>(dtype), 0};
    const size_t all = bytes * size();
    const Header h_all{kMagic, static_cast<uint32_t>(Op::kAllGather), count * size(),
                       static_cast<uint32_t>(dtype), 0};
    if (rank() != 0) {
      g.write(g.to_root(), h, out + rank() * bytes, bytes, 0);
      g.read(g.to_root(), h_all, out, all, 0);
      return;
    }
    for (int r = 1; r < size(); ++r) g.read(g.peers[r], h, out + r * bytes, bytes, r);
    for (int r = 1; r < size(); ++r) g.write(g.peers[r], h_all, out, all, r);
  }

  void broadcast(void* buf, size_t count, DType dtype, int root) override {
    KESTREL_CHECK(root >= 0 && root < size(), "broadcast: root ", root, " outside [0, ", size(),
                  ")");
    if (size() == 1) return;
    ProcessGroup::Impl& g = *group_->impl_;
    const size_t bytes = count * dtype_size(dtype);
    const Header h{kMagic, static_cast<uint32_t>(Op::kBroadcast), count,
                   static_cast<uint32_t>(dtype), static_cast<uint32_t>(root)};
    if (rank() == 0) {
      if (root != 0) g.read(g.peers[root], h, buf, bytes, root);
      for (int r = 1; r < size(); ++r)
        if (r != root) g.write(g.peers[r], h, buf, bytes, r);
    } else if (rank() == root) {
      g.write(g.to_root(), h, buf, bytes, 0);
    } else {
      g.read(g.to_root(), h, buf, bytes, 0);
    }
  }

  void barrier() override {
    int32_t one = 1;
    all_reduce_sum(&one, 1, DType::kI32);
  }

 private:
  std::shared_ptr<ProcessGroup> group_;
  std::vector<uint8_t> scratch_;
};

std::shared_ptr<Communicator> make_tcp_communicator(std::shared_ptr<ProcessGroup> group) {
  KESTREL_CHECK(group != nullptr, "make_tcp_communicator: no process group");
  return std::make_shared<TcpCommunicator>(std::move(group));
}

}  // namespace kestrel
