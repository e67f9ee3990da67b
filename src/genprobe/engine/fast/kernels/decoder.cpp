// The C++ loop of greedy decoding over AOTInductor-compiled graphs of genprobe's one forward.
//
// genprobe.engine.fast.aot exports GPT.forward over a StaticKVCache whose tensors are graph inputs: a "step" graph
// (one token per row, plus the greedy argmax and end-token bookkeeping of a decode step), a "prompt" graph
// (the same for T >= 2 tokens, T symbolic, the head applied to the last position only) and a "chunk" graph
// (T >= 2 tokens, the logits of every position: verify-cache and chunked prefill; loaded on first use).
// AOTInductor compiles each into a library; this class loads them and runs a whole greedy generation in one
// call: the prompt graph, then one step per token until every row has finished or the budget is spent. No
// Python and no per-call framework machinery runs between steps, and each step is one call into generated C++.
//
// The weights are bound as user-managed constants: the graphs read the model's own parameter tensors,
// so an in-place edit (a loop patch) is seen by the next call without recompiling.
#include <ATen/ATen.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>
#include <torch/csrc/inductor/aoti_package/model_package_loader.h>
#include <torch/custom_class.h>
#include <torch/library.h>

#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

namespace genprobe {
// Defined in linear.cpp: keep genprobe::small_linear on the calling thread (true) or let it split (false);
// returns the previous setting.
bool set_serial_products(bool serial);
}  // namespace genprobe

namespace {

using torch::inductor::AOTIModelPackageLoader;

// For the duration of a call: the products of programs compiled single-threaded stay on this thread. A step
// that small gains little from a second core, and loses a lot when a neighbour holds it (every split waits
// for the slower thread).
class SerialProducts {
 public:
  explicit SerialProducts(bool serial) : before_(genprobe::set_serial_products(serial)) {}
  ~SerialProducts() { genprobe::set_serial_products(before_); }
  SerialProducts(const SerialProducts&) = delete;
  SerialProducts& operator=(const SerialProducts&) = delete;

 private:
  bool before_;
};

// CPU buffers recycled by size. A decode step of a small model allocates about twenty buffers of a few KB (its
// intermediates and every product's output), and glibc serves each through its aligned-allocation path, which
// bypasses its per-thread cache: measured on the default model at batch 1 (Intel Xeon), with glibc's caches
// widened through GLIBC_TUNABLES a step took 43.9 instead of 46.8 us. Buffers up to kMaxBytes are kept on a
// free list per size when released (at most kPerSize each) and handed out again; larger ones go to the
// allocator this one replaced. A block is 64-byte aligned, as c10's own, behind a 64-byte header holding its size.
class BlockPool final : public c10::Allocator {
 public:
  static constexpr size_t kMaxBytes = size_t(1) << 20, kPerSize = 64, kHeader = 64;

  explicit BlockPool(c10::Allocator* fallback) : fallback_(fallback) {}

  c10::DataPtr allocate(size_t n) override {
    const size_t bytes = (n + 63) & ~size_t(63);
    if (n == 0 || bytes > kMaxBytes) return fallback_->allocate(n);
    void* block = nullptr;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      std::vector<void*>& free = free_[bytes];
      if (!free.empty()) {
        block = free.back();
        free.pop_back();
      }
    }
    if (block == nullptr) {
      block = c10::alloc_cpu(bytes + kHeader);
      *static_cast<size_t*>(block) = bytes;
    }
    void* data = static_cast<char*>(block) + kHeader;
    return {data, block, &BlockPool::release, c10::Device(c10::DeviceType::CPU)};
  }

  void copy_data(void* dest, const void* src, size_t count) const override { default_copy_data(dest, src, count); }

 private:
  c10::Allocator* fallback_;
  std::mutex mutex_;
  std::unordered_map<size_t, std::vector<void*>> free_;

  static void release(void* block) {
    BlockPool& pool = instance();
    const size_t bytes = *static_cast<size_t*>(block);
    {
      std::lock_guard<std::mutex> lock(pool.mutex_);
      std::vector<void*>& free = pool.free_[bytes];
      if (free.size() < kPerSize) {
        free.push_back(block);
        return;
      }
    }
    c10::free_cpu(block);
  }

 public:
  // One per process, never destroyed: a buffer may be released at any time, at exit included.
  static BlockPool& instance() {
    static BlockPool* pool = new BlockPool(c10::GetCPUAllocator());
    return *pool;
  }
};

// For the duration of a program run: CPU tensors come from the BlockPool. c10 has one CPU allocator per process,
// so it is replaced while a run is in progress in any thread and put back when the last one ends. (If another
// library installed an allocator of higher priority, c10 keeps that one and nothing changes.)
class PooledBuffers {
 public:
  PooledBuffers() {
    std::lock_guard<std::mutex> lock(mutex());
    if (depth()++ == 0) {
      previous() = c10::GetCPUAllocator();
      c10::SetCPUAllocator(&BlockPool::instance(), 0);
    }
  }
  ~PooledBuffers() {
    std::lock_guard<std::mutex> lock(mutex());
    if (--depth() == 0) c10::SetCPUAllocator(previous(), 0);
  }
  PooledBuffers(const PooledBuffers&) = delete;
  PooledBuffers& operator=(const PooledBuffers&) = delete;

 private:
  static std::mutex& mutex() {
    static std::mutex m;
    return m;
  }
  static int& depth() {
    static int d = 0;
    return d;
  }
  static c10::Allocator*& previous() {
    static c10::Allocator* p = nullptr;
    return p;
  }
};

std::unique_ptr<AOTIModelPackageLoader> open_package(const std::string& path) {
  // One runner, run single-threaded: this object is driven by one thread at a time, so the container's
  // model pool and its locks are not needed.
  return std::make_unique<AOTIModelPackageLoader>(path, "model", /*run_single_threaded=*/true, /*num_runners=*/1);
}

std::vector<at::Tensor> with_cache(std::vector<at::Tensor> head, const std::vector<at::Tensor>& cache) {
  head.insert(head.end(), cache.begin(), cache.end());
  return head;
}

}  // namespace

class GreedyDecoder : public torch::CustomClassHolder {
 public:
  // ``serial``: the programs were compiled single-threaded, and their products run on the calling thread too.
  GreedyDecoder(const std::string& step_package, const std::string& prompt_package, bool serial)
      : step_(open_package(step_package)), prompt_(open_package(prompt_package)), serial_(serial) {}

  // Names of the weights each graph reads (the exported module's parameter names).
  std::vector<std::string> constant_names() { return step_->get_constant_fqns(); }

  // Point every loaded graph at these tensors (no copy): later in-place edits of them are seen by every call.
  void bind_weights(c10::Dict<std::string, at::Tensor> weights) {
    weights_.clear();
    for (const auto& item : weights) weights_.emplace(item.key(), item.value());
    for (AOTIModelPackageLoader* graph : {step_.get(), prompt_.get(), chunk_.get()})
      if (graph != nullptr) bind(*graph);
  }

  bool has_chunk() const { return chunk_ != nullptr; }

  // Load the chunk graph, bound to the weights the other graphs read (if any were bound yet).
  void load_chunk(const std::string& chunk_package) {
    std::unique_ptr<AOTIModelPackageLoader> chunk = open_package(chunk_package);
    if (!weights_.empty()) bind(*chunk);
    chunk_ = std::move(chunk);
  }

  // T >= 2 tokens (B, T) with their validity (B, T) through the chunk graph: logits (B, T, V).
  at::Tensor forward(const at::Tensor& ids, const at::Tensor& valid, const std::vector<at::Tensor>& cache) {
    TORCH_CHECK(chunk_ != nullptr, "forward: the chunk program is not loaded (load_chunk first)");
    SerialProducts scope(serial_);
    PooledBuffers buffers;
    return chunk_->run(with_cache({ids, valid}, cache))[0];
  }

  // One decode step: [next token (B, 1), its validity (B, 1), done (B,), raw logits (B, V)].
  std::vector<at::Tensor> step(const at::Tensor& ids, const at::Tensor& valid, const at::Tensor& done,
                               const at::Tensor& eos, const std::vector<at::Tensor>& cache) {
    SerialProducts scope(serial_);
    PooledBuffers buffers;
    AOTIModelPackageLoader& graph = ids.size(1) == 1 ? *step_ : *prompt_;
    return graph.run(with_cache({ids, valid, done, eos}, cache));
  }

  // Greedy steps from the last chosen tokens ``ids`` (B, 1): step i writes column ``first + i`` of ``tokens``,
  // ``valids`` and (when defined) ``logits``; stops after ``steps`` steps or once every row is done.
  // Returns the number of steps run. ``done`` is updated in place.
  int64_t decode(at::Tensor ids, at::Tensor valid, const at::Tensor& done, const at::Tensor& eos,
                 const std::vector<at::Tensor>& cache, int64_t steps, const at::Tensor& tokens,
                 const at::Tensor& valids, const std::optional<at::Tensor>& logits, int64_t first) {
    check_outputs(tokens, valids, logits, first + steps);
    at::Tensor d = done.contiguous();
    int64_t ran = 0;
    for (; ran < steps && !all_true(d); ++ran) {
      std::vector<at::Tensor> out = step(ids, valid, d, eos, cache);
      record(out[0], out[1], out[3], tokens, valids, logits, first + ran);
      ids = out[0];
      valid = out[1];
      d = out[2];
    }
    done.copy_(d);
    return ran;
  }

  // A whole generation into a fresh cache: the prompt (B, P) with its validity, then up to ``steps`` tokens
  // (the first from the prompt's last position). Returns [tokens (B, n) int64, their validity (B, n), done (B,)
  // (the rows that emitted ``eos``), raw logits (B, n, V) when ``with_logits`` else an undefined tensor], n the
  // number of tokens generated. The outputs are allocated here: one call from Python, nothing to copy after.
  std::vector<at::Tensor> generate(const at::Tensor& prompt, const at::Tensor& prompt_valid, const at::Tensor& eos,
                                   const std::vector<at::Tensor>& cache, int64_t steps, bool with_logits) {
    TORCH_CHECK(steps >= 1, "generate: steps must be >= 1, got ", steps);
    const int64_t B = prompt.size(0);
    const at::Tensor tokens = at::empty({B, steps}, prompt.options().dtype(at::kLong));
    const at::Tensor valids = at::empty({B, steps}, prompt.options().dtype(at::kBool));
    std::optional<at::Tensor> logits;
    // The step graph for a one-token prompt, the prompt graph (head on the last position only) for longer ones.
    std::vector<at::Tensor> out = step(prompt, prompt_valid, at::zeros({B}, valids.options()), eos, cache);
    const at::Tensor &first = out[0], &first_valid = out[1], &d = out[2], &last = out[3];
    if (with_logits) logits = at::empty({B, steps, last.size(-1)}, last.options());
    record(first, first_valid, last, tokens, valids, logits, 0);
    const at::Tensor done = d.contiguous().clone();
    const int64_t ran = 1 + decode(first, first_valid, done, eos, cache, steps - 1, tokens, valids, logits, 1);
    return {tokens.narrow(1, 0, ran), valids.narrow(1, 0, ran), done,
            with_logits ? logits->narrow(1, 0, ran) : at::Tensor()};
  }

 private:
  std::unique_ptr<AOTIModelPackageLoader> step_;
  std::unique_ptr<AOTIModelPackageLoader> prompt_;
  std::unique_ptr<AOTIModelPackageLoader> chunk_;  // null until load_chunk
  bool serial_;
  std::unordered_map<std::string, at::Tensor> weights_;  // what bind_weights was given last

  void bind(AOTIModelPackageLoader& graph) {
    graph.load_constants(weights_, /*use_inactive=*/false, /*check_full_update=*/true, /*user_managed=*/true);
  }

  static bool all_true(const at::Tensor& done) {
    const bool* p = done.data_ptr<bool>();
    for (int64_t b = 0; b < done.numel(); ++b)
      if (!p[b]) return false;
    return true;
  }

  static void check_outputs(const at::Tensor& tokens, const at::Tensor& valids, const std::optional<at::Tensor>& logits,
                            int64_t columns) {
    TORCH_CHECK(tokens.is_contiguous() && tokens.scalar_type() == at::kLong && tokens.dim() == 2,
                "decode: tokens must be a contiguous (B, S) int64 tensor");
    TORCH_CHECK(valids.is_contiguous() && valids.scalar_type() == at::kBool && valids.sizes() == tokens.sizes(),
                "decode: valids must be a contiguous bool tensor shaped like tokens");
    TORCH_CHECK(tokens.size(1) >= columns, "decode: ", columns, " columns needed, tokens has ", tokens.size(1));
    if (logits.has_value() && logits->defined())
      TORCH_CHECK(logits->is_contiguous() && logits->scalar_type() == at::kFloat && logits->dim() == 3 &&
                      logits->size(0) == tokens.size(0) && logits->size(1) >= columns,
                  "decode: logits must be a contiguous (B, S, V) float32 tensor with ", columns, " columns");
  }

  // Column ``at`` of the outputs: tokens and validity (B, 1), raw logits (B, V) when asked for.
  static void record(const at::Tensor& token, const at::Tensor& token_valid, const at::Tensor& step_logits,
                     const at::Tensor& tokens, const at::Tensor& valids, const std::optional<at::Tensor>& logits,
                     int64_t at) {
    const int64_t B = tokens.size(0), S = tokens.size(1);
    const at::Tensor t = token.contiguous(), v = token_valid.contiguous();
    const int64_t* tp = t.data_ptr<int64_t>();
    const bool* vp = v.data_ptr<bool>();
    int64_t* out_t = tokens.data_ptr<int64_t>();
    bool* out_v = valids.data_ptr<bool>();
    for (int64_t b = 0; b < B; ++b) {
      out_t[b * S + at] = tp[b];
      out_v[b * S + at] = vp[b];
    }
    if (logits.has_value() && logits->defined()) {
      const at::Tensor l = step_logits.contiguous();
      const int64_t V = l.size(-1), LS = logits->size(1);
      const float* lp = l.data_ptr<float>();
      float* out_l = logits->data_ptr<float>();
      for (int64_t b = 0; b < B; ++b) std::memcpy(out_l + (b * LS + at) * V, lp + b * V, sizeof(float) * V);
    }
  }
};

TORCH_LIBRARY_FRAGMENT(genprobe, m) {
  m.class_<GreedyDecoder>("GreedyDecoder")
      .def(torch::init<std::string, std::string, bool>())
      .def("constant_names", &GreedyDecoder::constant_names)
      .def("bind_weights", &GreedyDecoder::bind_weights)
      .def("has_chunk", &GreedyDecoder::has_chunk)
      .def("load_chunk", &GreedyDecoder::load_chunk)
      .def("forward", &GreedyDecoder::forward)
      .def("step", &GreedyDecoder::step)
      .def("decode", &GreedyDecoder::decode)
      .def("generate", &GreedyDecoder::generate);
}
