// The CUDA backend's plumbing: kestrel's stream, a caching device allocator
// (registered for Device::kCuda at start-up; the model allocates temporaries
// every forward, and cudaMalloc / cudaFree would synchronise each time), host
// <-> device copies with dtype conversion, and weight upload through pinned
// staging buffers.
#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>
#include <unordered_map>
#include <vector>

#include <cuda_runtime_api.h>

#include "backend/cuda/cuda_common.h"
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/kernels.h"
#include "core/logging.h"

namespace kestrel::cuda {
namespace {

cudaStream_t main_stream();

// The stream and event of this thread's SideStream scope (null outside one).
struct Side {
  cudaStream_t stream = nullptr;
  cudaEvent_t main_done = nullptr;  // recorded on the main stream at each allocation
  int* counters = nullptr;          // stream_counters of this stream, made at first use
};
thread_local Side t_side;

// Sizes round up to 512 bytes below 1 MiB and to 2 MiB above, and a freed
// block waits in a free list of its rounded size. The forward passes run on one
// stream, so a block freed by the host can be handed out again at once: the
// stream orders its next use after the last. A thread in a SideStream scope
// orders its work after the main stream's at each allocation and waits for its
// own before each free (device_alloc, device_free).
class CachingAllocator {
 public:
  // pool: serve from (and give back to) the graph pool (see GraphPoolScope).
  void* alloc(size_t nbytes, bool pool = false) {
    const size_t size = round_size(nbytes);
    std::lock_guard<std::mutex> lock(mu_);
    if (pool) {
      // Best fit among the pool's free blocks: graphs replay one at a time, so a
      // larger block serving a smaller request only costs memory, never safety.
      auto pit = pool_free_.lower_bound(size);
      if (pit != pool_free_.end()) {
        void* p = pit->second;
        pool_free_.erase(pit);
        const size_t got = pool_size_.at(p);
        sizes_[p] = got;
        stats_.in_use += got;
        stats_.peak_in_use = std::max(stats_.peak_in_use, stats_.in_use);
        return p;
      }
    }
    auto it = free_.find(size);
    void* p = nullptr;
    if (it != free_.end() && !it->second.empty()) {
      p = it->second.back();
      it->second.pop_back();
    } else {
      ensure_device();
      cudaError_t err = cudaMalloc(&p, size);
      if (err == cudaErrorMemoryAllocation) {
        (void)cudaGetLastError();
        release_free_locked();
        err = cudaMalloc(&p, size);
      }
      if (err != cudaSuccess) {
        (void)cudaGetLastError();
        size_t free_b = 0, total_b = 0;
        cudaMemGetInfo(&free_b, &total_b);
        KESTREL_FAIL("CUDA out of memory allocating ", size, " bytes (", free_b >> 20,
                     " MiB free of ", total_b >> 20, " MiB; kestrel holds ", stats_.reserved >> 20,
                     " MiB): ", cudaGetErrorString(err));
      }
      stats_.reserved += size;
    }
    sizes_[p] = size;
    if (pool) pool_size_[p] = size;
    stats_.in_use += size;
    stats_.peak_in_use = std::max(stats_.peak_in_use, stats_.in_use);
    return p;
  }

  void free(void* p) {
    if (p == nullptr) return;
    std::lock_guard<std::mutex> lock(mu_);
    auto it = sizes_.find(p);
    if (it == sizes_.end()) return;  // not ours: never happens, never crash over it
    stats_.in_use -= it->second;
    if (pool_size_.count(p)) {
      pool_free_.emplace(it->second, p);  // graph memory stays the graphs'
    } else {
      free_[it->second].push_back(p);
    }
    sizes_.erase(it);
  }

  // Bytes the graph pool holds (handed out or free within it).
  size_t pool_bytes() {
    std::lock_guard<std::mutex> lock(mu_);
    size_t n = 0;
    for (const auto& [p, size] : pool_size_) n += size;
    return n;
  }

  void release_free() {
    std::lock_guard<std::mutex> lock(mu_);
    release_free_locked();
  }

  MemoryStats stats() {
    std::lock_guard<std::mutex> lock(mu_);
    return stats_;
  }

  void reset_peak() {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.peak_in_use = stats_.in_use;
  }

 private:
  static size_t round_size(size_t n) {
    constexpr size_t kSmall = 512, kLarge = size_t{2} << 20;
    n = std::max<size_t>(n, 1);
    return n < (size_t{1} << 20) ? (n + kSmall - 1) / kSmall * kSmall
                                 : (n + kLarge - 1) / kLarge * kLarge;
  }
  void release_free_locked() {
    cudaStreamSynchronize(main_stream());
    for (auto& [size, ptrs] : free_) {
      for (void* p : ptrs) {
        cudaFree(p);
        stats_.reserved -= size;
      }
      ptrs.clear();
    }
  }

  std::mutex mu_;
  std::unordered_map<size_t, std::vector<void*>> free_;
  std::unordered_map<void*, size_t> sizes_;
  // The graph pool: blocks that captured graphs address. Never returned to the
  // main free lists (a replay writes them), shared by every graph of the process
  // (they replay one at a time on the one stream).
  std::multimap<size_t, void*> pool_free_;
  std::unordered_map<void*, size_t> pool_size_;
  MemoryStats stats_;
};

// Never destroyed: tensors held by static objects may be freed after main returns.
CachingAllocator& allocator() {
  static CachingAllocator* a = new CachingAllocator();
  return *a;
}

// Set on the thread that captures a graph (GraphPoolScope): its allocations come
// from the graph pool. Other threads (an adapter loading) keep the main lists.
thread_local bool t_graph_pool = false;

// Held through a graph capture and by the copies and uploads that other threads (the adapter
// store's loader) queue on kestrel's stream: such work must not land inside a capture, and its
// synchronisations would invalidate it. Recursive: the capturing thread may copy.
std::recursive_mutex& capture_mutex() {
  static std::recursive_mutex* m = new std::recursive_mutex();
  return *m;
}

void* device_alloc(size_t nbytes) {
  void* p = allocator().alloc(nbytes, t_graph_pool);
  if (t_side.stream) {
    // The block may be one the main stream freed with work still queued on it: the side
    // stream's use of it waits for that work. Under the capture lock, so that the record
    // never lands inside a graph being captured.
    std::lock_guard<std::recursive_mutex> capture_lock(capture_mutex());
    CUDA_CHECK(cudaEventRecord(t_side.main_done, main_stream()));
    CUDA_CHECK(cudaStreamWaitEvent(t_side.stream, t_side.main_done, 0));
  }
  return p;
}
void device_free(void* p) {
  // The main stream may take the block at once: the side stream's work on it ends first.
  if (t_side.stream) (void)cudaStreamSynchronize(t_side.stream);
  allocator().free(p);
}

// Registration only stores two function pointers: no CUDA call at start-up.
const bool g_registered = [] {
  register_device_allocator(Device::kCuda, DeviceAllocator{&device_alloc, &device_free});
  return true;
}();

// Pinned staging for uploads: two buffers, so that filling one overlaps the
// copy of the other.
constexpr size_t kStagingBytes = size_t{32} << 20;
struct Staging {
  void* host[2] = {nullptr, nullptr};
  void* device[2] = {nullptr, nullptr};
  cudaEvent_t done[2] = {nullptr, nullptr};
};
Staging* make_staging() {
  auto* st = new Staging();
  for (int i = 0; i < 2; ++i) {
    CUDA_CHECK(cudaMallocHost(&st->host[i], kStagingBytes));
    st->device[i] = device_alloc(kStagingBytes);
    CUDA_CHECK(cudaEventCreateWithFlags(&st->done[i], cudaEventDisableTiming));
  }
  return st;
}
// The main stream's uploads (under the capture lock) and the side streams' (one at a time,
// under side_staging_mutex) each have their own pair.
Staging& main_staging() {
  static Staging* s = make_staging();
  return *s;
}
std::mutex& side_staging_mutex() {
  static std::mutex* m = new std::mutex();
  return *m;
}
Staging& side_staging() {
  static Staging* s = make_staging();
  return *s;
}

int kind_of(DType d) {
  switch (d) {
    case DType::kF32:
      return 0;
    case DType::kF16:
      return 1;
    case DType::kBF16:
      return 2;
    default:
      KESTREL_FAIL("upload: unsupported weight dtype ", dtype_name(d));
  }
}

}  // namespace

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

void ensure_device() {
  static const bool ok = [] {
    KESTREL_CHECK(g_registered, "CUDA allocator not registered");
    KESTREL_CHECK(device_count() > 0, "no CUDA device is visible (driver missing or no GPU)");
    return true;
  }();
  (void)ok;
}

namespace {
cudaStream_t main_stream() {
  static cudaStream_t s = [] {
    ensure_device();
    cudaStream_t st;
    CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    return st;
  }();
  return s;
}
}  // namespace

cudaStream_t stream() {
  return t_side.stream ? t_side.stream : main_stream();
}

namespace {
int* new_counters(cudaStream_t s) {
  void* p = nullptr;
  const size_t bytes = sizeof(int) * kCounterSlots * kCountersPerSlot;
  CUDA_CHECK(cudaMalloc(&p, bytes));
  CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, s));
  return static_cast<int*>(p);
}
}  // namespace

int* stream_counters(CounterSlot slot) {
  int* base = nullptr;
  if (t_side.stream) {
    if (!t_side.counters) t_side.counters = new_counters(t_side.stream);
    base = t_side.counters;
  } else {
    static int* main_counters = new_counters(main_stream());  // held for the process
    base = main_counters;
  }
  return base + static_cast<int>(slot) * kCountersPerSlot;
}

SideStream::SideStream() {
  KESTREL_CHECK(t_side.stream == nullptr, "SideStream: this thread is in one already");
  ensure_device();
  CUDA_CHECK(cudaStreamCreateWithFlags(&t_side.stream, cudaStreamNonBlocking));
  const cudaError_t err = cudaEventCreateWithFlags(&t_side.main_done, cudaEventDisableTiming);
  if (err != cudaSuccess) {
    cudaStreamDestroy(t_side.stream);
    t_side.stream = nullptr;
    CUDA_CHECK(err);
  }
}

SideStream::~SideStream() {
  (void)cudaStreamSynchronize(t_side.stream);
  if (t_side.counters) cudaFree(t_side.counters);
  cudaEventDestroy(t_side.main_done);
  cudaStreamDestroy(t_side.stream);
  t_side = Side{};
}

void synchronize() {
  CUDA_CHECK(cudaStreamSynchronize(stream()));
}

MemoryStats memory_stats() {
  return allocator().stats();
}
void empty_cache() {
  allocator().release_free();
}
void reset_peak_memory() {
  allocator().reset_peak();
}
std::string device_name() {
  ensure_device();
  int dev = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  cudaDeviceProp prop{};
  CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
  return "cuda: " + std::string(prop.name) + ", " + std::to_string(prop.multiProcessorCount) +
         " SMs";
}

DeviceMemoryInfo device_memory_info() {
  ensure_device();
  DeviceMemoryInfo m;
  CUDA_CHECK(cudaMemGetInfo(&m.free, &m.total));
  return m;
}

void copy_2d(const void* src, size_t src_pitch, void* dst, size_t dst_pitch, size_t width,
             int64_t rows) {
  // One contiguous block: a copy kernel streams it faster than the copy engine.
  const size_t n = width * static_cast<size_t>(rows);
  if (src_pitch == width && dst_pitch == width && n % 16 == 0 &&
      reinterpret_cast<uintptr_t>(src) % 16 == 0 && reinterpret_cast<uintptr_t>(dst) % 16 == 0) {
    kernels::copy_bytes(src, dst, static_cast<int64_t>(n), stream());
    CUDA_CHECK_LAUNCH();
    return;
  }
  CUDA_CHECK(cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, width, static_cast<size_t>(rows),
                               cudaMemcpyDeviceToDevice, stream()));
}

void copy(const Tensor& src, Tensor& dst) {
  std::lock_guard<std::recursive_mutex> capture_lock(capture_mutex());
  cudaStream_t s = stream();
  const bool src_dev = src.device() == Device::kCuda, dst_dev = dst.device() == Device::kCuda;
  if (src.dtype() == dst.dtype()) {
    KESTREL_CHECK(src.nbytes() == dst.nbytes(), "copy: ", shape_str(src.shape()), " into ",
                  shape_str(dst.shape()));
    if (src.nbytes() == 0) return;
    CUDA_CHECK(cudaMemcpyAsync(dst.raw(), src.raw(), src.nbytes(), cudaMemcpyDefault, s));
    if (!dst_dev) CUDA_CHECK(cudaStreamSynchronize(s));
    return;
  }
  KESTREL_CHECK(src.numel() == dst.numel(), "copy: ", shape_str(src.shape()), " into ",
                shape_str(dst.shape()));
  const int64_t n = src.numel();
  if (n == 0) return;
  if (src.dtype() == DType::kBF16 && dst.dtype() == DType::kF32 && src_dev) {
    Tensor tmp = dst_dev ? dst : Tensor::empty(DType::kF32, dst.shape(), Device::kCuda);
    kernels::bf16_to_f32(src.data<uint16_t>(), tmp.data<float>(), n, s);
    CUDA_CHECK_LAUNCH();
    if (!dst_dev) {
      CUDA_CHECK(cudaMemcpyAsync(dst.raw(), tmp.raw(), dst.nbytes(), cudaMemcpyDeviceToHost, s));
      CUDA_CHECK(cudaStreamSynchronize(s));
    }
    return;
  }
  if (dst.dtype() == DType::kBF16 && dst_dev &&
      (src.dtype() == DType::kF32 || src.dtype() == DType::kF16)) {
    Tensor tmp = src_dev ? src : Tensor::empty(src.dtype(), src.shape(), Device::kCuda);
    if (!src_dev)
      CUDA_CHECK(cudaMemcpyAsync(tmp.raw(), src.raw(), src.nbytes(), cudaMemcpyHostToDevice, s));
    kernels::to_bf16(tmp.raw(), kind_of(src.dtype()), dst.data<uint16_t>(), n, s);
    CUDA_CHECK_LAUNCH();
    return;
  }
  KESTREL_FAIL("copy: no conversion from ", dtype_name(src.dtype()), " on ",
               src_dev ? "cuda" : "cpu", " to ", dtype_name(dst.dtype()), " on ",
               dst_dev ? "cuda" : "cpu");
}

Tensor random_uniform(const Shape& shape, DType dtype, uint64_t seed, float amp, float constant) {
  std::lock_guard<std::recursive_mutex> capture_lock(capture_mutex());
  Tensor out = Tensor::empty(dtype, shape, Device::kCuda);
  kernels::random_uniform(out.raw(), dtype == DType::kBF16, out.numel(), seed, amp, constant,
                          stream());
  CUDA_CHECK_LAUNCH();
  return out;
}

Tensor upload_weight(const void* data, DType src_dtype, const Shape& shape, DType dtype) {
  // On the main stream, not inside a capture; on a side stream, one upload at a time.
  const bool side = t_side.stream != nullptr;
  std::unique_lock<std::recursive_mutex> capture_lock(capture_mutex(), std::defer_lock);
  std::unique_lock<std::mutex> side_lock(side_staging_mutex(), std::defer_lock);
  if (side)
    side_lock.lock();
  else
    capture_lock.lock();
  KESTREL_CHECK(dtype == DType::kBF16 || dtype == DType::kF32 ||
                    (dtype == DType::kF8E4M3 && src_dtype == dtype),
                "upload_weight: the CUDA backend keeps weights in BF16 or F32 (or FP8 as read), "
                "not ",
                dtype_name(dtype));
  const int src_kind = kind_of(src_dtype);
  Tensor out = Tensor::empty(dtype, shape, Device::kCuda);
  const int64_t n = out.numel();
  const size_t esize = dtype_size(src_dtype);
  const int64_t per_chunk = static_cast<int64_t>(kStagingBytes / esize);
  cudaStream_t s = stream();
  Staging& st = side ? side_staging() : main_staging();
  const char* src = static_cast<const char*>(data);
  for (int64_t i0 = 0, c = 0; i0 < n; i0 += per_chunk, ++c) {
    const int64_t cnt = std::min(per_chunk, n - i0);
    const int buf = static_cast<int>(c % 2);
    CUDA_CHECK(cudaEventSynchronize(st.done[buf]));  // the last copy out of this buffer ended
    std::memcpy(st.host[buf], src + i0 * esize, static_cast<size_t>(cnt) * esize);
    if (src_dtype == dtype) {
      CUDA_CHECK(cudaMemcpyAsync(static_cast<char*>(out.raw()) + i0 * esize, st.host[buf],
                                 static_cast<size_t>(cnt) * esize, cudaMemcpyHostToDevice, s));
    } else {
      CUDA_CHECK(cudaMemcpyAsync(st.device[buf], st.host[buf], static_cast<size_t>(cnt) * esize,
                                 cudaMemcpyHostToDevice, s));
      if (dtype == DType::kBF16) {
        kernels::to_bf16(st.device[buf], src_kind, out.data<uint16_t>() + i0, cnt, s);
      } else if (src_dtype == DType::kBF16) {
        kernels::bf16_to_f32(static_cast<const uint16_t*>(st.device[buf]), out.data<float>() + i0,
                             cnt, s);
      } else {
        kernels::f16_to_f32(static_cast<const uint16_t*>(st.device[buf]), out.data<float>() + i0,
                            cnt, s);
      }
      CUDA_CHECK_LAUNCH();
    }
    CUDA_CHECK(cudaEventRecord(st.done[buf], s));
  }
  return out;
}

namespace {

struct GraphPoolScope {
  GraphPoolScope() { t_graph_pool = true; }
  ~GraphPoolScope() { t_graph_pool = false; }
};

class CudaGraph final : public ops::DeviceGraph {
 public:
  explicit CudaGraph(cudaGraphExec_t exec) : exec_(exec) {}
  ~CudaGraph() override { cudaGraphExecDestroy(exec_); }
  void replay() override { CUDA_CHECK(cudaGraphLaunch(exec_, stream())); }

 private:
  cudaGraphExec_t exec_;
};

}  // namespace

std::unique_ptr<ops::DeviceGraph> capture_graph(const std::function<Tensor()>& body, Tensor* out) {
  cudaStream_t s = stream();
  std::lock_guard<std::recursive_mutex> capture_lock(capture_mutex());
  GraphPoolScope pool;
  // The eager run sets what the first launch of a kernel or a GEMM shape sets up (attributes,
  // cuBLASLt plans, workspaces) and leaves the pool holding the blocks the capture will take.
  { const Tensor warm = body(); }
  CUDA_CHECK(cudaStreamSynchronize(s));
  // Relaxed: the allocator may still cudaMalloc a block the pool lacks.
  CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
  cudaGraph_t graph = nullptr;
  try {
    *out = body();
  } catch (...) {
    cudaStreamEndCapture(s, &graph);
    if (graph) cudaGraphDestroy(graph);
    (void)cudaGetLastError();
    throw;
  }
  CUDA_CHECK(cudaStreamEndCapture(s, &graph));
  cudaGraphExec_t exec = nullptr;
  const cudaError_t err = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  CUDA_CHECK(err);
  return std::make_unique<CudaGraph>(exec);
}

size_t graph_pool_bytes() {
  return allocator().pool_bytes();
}

}  // namespace kestrel::cuda
