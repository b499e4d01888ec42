// The program as the runner holds it: ExecuTorch's C++ runtime, every method sharing one planned arena
// per memory id (so the state one method writes the next reads), inputs checked against the program
// record before a method runs; a refusal is one line (`Refusal`).
#pragma once

#include <executorch/extension/data_loader/mmap_data_loader.h>
#include <executorch/extension/flat_tensor/flat_tensor_data_map.h>
#include <executorch/extension/memory_allocator/malloc_memory_allocator.h>
#include <executorch/runtime/core/evalue.h>
#include <executorch/runtime/core/hierarchical_allocator.h>
#include <executorch/runtime/core/portable_type/tensor_impl.h>
#include <executorch/runtime/executor/memory_manager.h>
#include <executorch/runtime/executor/method.h>
#include <executorch/runtime/executor/program.h>

#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "../trt/blob.h"
#include "npy.h"
#include "record.h"

extern "C" {
const char* pipeline_trt_last_error();
int pipeline_trt_set_cuda_graph(int mode);
int pipeline_trt_set_kernel_specialization(int strategy);
unsigned long long pipeline_trt_bytes_to_device();
unsigned long long pipeline_trt_bytes_to_host();
int pipeline_trt_pin_host(void* ptr, size_t bytes);
void pipeline_trt_unpin_host(void* ptr);
}

namespace pipeline_runner {


namespace et = ::executorch::runtime;
using executorch::extension::FlatTensorDataMap;
using executorch::extension::MallocMemoryAllocator;
using executorch::extension::MmapDataLoader;

struct Refusal {
  std::string line;
};

[[noreturn]] inline void refuse(const std::string& line) { throw Refusal{line}; }

inline std::string hex(et::Error e) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%x", static_cast<unsigned>(e));
  return buf;
}

// The delegate's line when it refused, else ExecuTorch's error code.
inline std::string why(et::Error e) {
  const char* line = pipeline_trt_last_error();
  return line && *line ? std::string(line) : "ExecuTorch error " + hex(e) + " (see the log above)";
}

// ---- the program --------------------------------------------------------------------------------
class Runner {
 public:
  Runner(const std::string& pte, const std::optional<std::string>& ptd) : where_(pte) {
    std::string error;
    if (!pipeline_runner::regular_file(pte, error) || (ptd && !pipeline_runner::regular_file(*ptd, error))) refuse(error);
    auto loader = MmapDataLoader::from(pte.c_str());
    if (!loader.ok()) refuse(pte + ": cannot open it (error " + hex(loader.error()) + ")");
    pte_loader_.emplace(std::move(loader.get()));
    auto program = et::Program::load(&*pte_loader_, et::Program::Verification::InternalConsistency);
    if (!program.ok()) refuse(pte + ": not a program ExecuTorch loads (error " + hex(program.error()) + "); rebuild it");
    program_.emplace(std::move(program.get()));
    if (ptd) {
      auto data_loader = MmapDataLoader::from(ptd->c_str());
      if (!data_loader.ok()) refuse(*ptd + ": cannot open it (error " + hex(data_loader.error()) + ")");
      ptd_loader_.emplace(std::move(data_loader.get()));
      auto map = FlatTensorDataMap::load(&*ptd_loader_);
      if (!map.ok()) refuse(*ptd + ": not a .ptd ExecuTorch reads (error " + hex(map.error()) + "); use the one written with the program");
      data_map_.emplace(std::move(map.get()));
    }
    // One arena per memory id for every method, so that state planned there is shared by them.
    for (size_t m = 0; m < program_->num_methods(); ++m) {
      const char* name = program_->get_method_name(m).get();
      auto meta = program_->method_meta(name);
      if (!meta.ok()) continue;
      for (size_t i = 0; i < meta->num_memory_planned_buffers(); ++i) {
        size_t size = static_cast<size_t>(meta->memory_planned_buffer_size(i).get());
        if (arenas_.size() <= i) arenas_.resize(i + 1);
        if (arenas_[i].size() < size) arenas_[i].resize(size);
      }
    }
    for (auto& a : arenas_) {
      spans_.emplace_back(a.data(), a.size());
      // Page-locked where the driver allows: the delegate's copies of inputs and outputs then go
      // straight to and from the device (a decode step's logits each step); else they stay pageable.
      if (pipeline_trt_pin_host(a.data(), a.size()) == 0) pinned_.push_back(a.data());
    }
    read_record();
  }
  ~Runner() {
    methods_.clear();
    for (void* p : pinned_) pipeline_trt_unpin_host(p);
  }
  Runner(const Runner&) = delete;
  Runner& operator=(const Runner&) = delete;

  et::Method& method(const std::string& name) {
    auto found = methods_.find(name);
    if (found != methods_.end()) return *found->second->method;
    auto meta = program_->method_meta(name.c_str());
    if (!meta.ok()) refuse(where_ + " has no method '" + name + "'");
    auto slot = std::make_unique<Loaded>();
    slot->spans.assign(spans_.begin(), spans_.begin() + static_cast<long>(meta->num_memory_planned_buffers()));
    slot->planned.emplace(et::Span<et::Span<uint8_t>>(slot->spans.data(), slot->spans.size()));
    slot->memory.emplace(&slot->method_allocator, &*slot->planned, &slot->temp_allocator);
    auto loaded = program_->load_method(name.c_str(), &*slot->memory, nullptr, data_map_ ? &*data_map_ : nullptr);
    if (!loaded.ok()) refuse("method '" + name + "' does not load: " + why(loaded.error()));
    slot->method.emplace(std::move(loaded.get()));
    et::Method& m = *slot->method;
    methods_.emplace(name, std::move(slot));
    return m;
  }

  // Outputs of `name` on `inputs`, after the record's checks.
  std::vector<Array> call(const std::string& name, const std::vector<Array>& inputs) {
    et::Method& m = call_in_place(name, inputs);
    std::vector<Array> outs;
    for (size_t i = 0; i < m.outputs_size(); ++i) outs.push_back(to_array(m.get_output(i), name, i));
    return outs;
  }

  // Run `name` on `inputs` (after the record's checks); its outputs stay where the method wrote them,
  // valid until its next call.
  et::Method& call_in_place(const std::string& name, const std::vector<Array>& inputs) {
    check(name, inputs);
    et::Method& m = method(name);
    execute(m, name, inputs);
    return m;
  }

  void check(const std::string& name, const std::vector<Array>& inputs) {
    auto specs = specs_.find(name);
    std::string error;
    if (specs != specs_.end() && !pipeline_runner::check_inputs(name, specs->second, inputs, error)) refuse(error);
  }

  void execute(et::Method& m, const std::string& name, const std::vector<Array>& inputs) {
    if (inputs.size() != m.inputs_size())
      refuse("method '" + name + "' takes " + std::to_string(m.inputs_size()) + " inputs, got " + std::to_string(inputs.size()));
    std::vector<std::unique_ptr<Held>> held;
    for (size_t i = 0; i < inputs.size(); ++i) {
      held.push_back(std::make_unique<Held>(inputs[i]));
      et::Error e = m.set_input(et::EValue(executorch::aten::Tensor(&held.back()->impl)), i);
      if (e != et::Error::Ok)
        refuse("method '" + name + "' input " + std::to_string(i) + " is refused by ExecuTorch (error " + hex(e) +
               "): its dtype or shape is not the program's");
    }
    et::Error e = m.execute();
    if (e != et::Error::Ok) refuse("method '" + name + "' failed: " + why(e));
  }

  // The most bytes input `i` of `name` can hold (the .npy header's room included): no input file
  // larger is read.
  uint64_t input_limit(const std::string& name, size_t i) {
    auto meta = program_->method_meta(name.c_str());
    if (!meta.ok()) refuse(where_ + " has no method '" + name + "'");
    if (i >= meta->num_inputs())
      refuse("method '" + name + "' takes " + std::to_string(meta->num_inputs()) + " inputs, got more");
    auto tensor = meta->input_tensor_meta(i);
    return tensor.ok() ? tensor->nbytes() + (1 << 16) + 12 : 0;
  }

  // How many inputs method `name` takes.
  size_t num_inputs(const std::string& name) {
    auto meta = program_->method_meta(name.c_str());
    if (!meta.ok()) refuse(where_ + " has no method '" + name + "'");
    return meta->num_inputs();
  }

  // Whether the program has a method of that name (asked by name, ExecuTorch would log its absence).
  bool has_constant(const std::string& name) {
    for (size_t m = 0; m < program_->num_methods(); ++m) {
      auto found = program_->get_method_name(m);
      if (found.ok() && name == found.get()) return true;
    }
    return false;
  }

  std::string constant_string(const std::string& name) {
    et::Method& m = method(name);
    if (m.execute() != et::Error::Ok || m.outputs_size() != 1 || !m.get_output(0).isString())
      refuse(where_ + ": constant method '" + name + "' is not a string");
    auto text = m.get_output(0).toString();
    return std::string(text.data(), text.size());
  }

  int64_t constant_int(const std::string& name) {
    et::Method& m = method(name);
    if (m.execute() != et::Error::Ok || m.outputs_size() != 1 || !m.get_output(0).isInt())
      refuse(where_ + ": constant method '" + name + "' is not an integer");
    return m.get_output(0).toInt();
  }

 private:
  struct Loaded {
    MallocMemoryAllocator method_allocator, temp_allocator;
    std::vector<et::Span<uint8_t>> spans;
    std::optional<et::HierarchicalAllocator> planned;
    std::optional<et::MemoryManager> memory;
    std::optional<et::Method> method;
  };
  // An input's tensor: sizes, dim order and strides for ExecuTorch's TensorImpl over the array's own
  // data (set_input copies it into the program's planned memory and never writes it).
  struct Held {
    explicit Held(const Array& a)
        : sizes(a.shape.begin(), a.shape.end()),
          order(a.shape.size()),
          strides(a.shape.size()),
          impl(static_cast<executorch::aten::ScalarType>(pipeline_trt::dtype_scalar_type(a.dtype)),
               static_cast<ssize_t>(sizes.size()), sizes.data(), const_cast<uint8_t*>(a.data.data()), fill_order(),
               fill_strides()) {}
    executorch::aten::DimOrderType* fill_order() {
      for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<executorch::aten::DimOrderType>(i);
      return order.data();
    }
    executorch::aten::StridesType* fill_strides() {
      executorch::aten::StridesType s = 1;
      for (size_t i = strides.size(); i-- > 0;) {
        strides[i] = s;
        s *= sizes[i];
      }
      return strides.data();
    }
    std::vector<executorch::aten::SizesType> sizes;
    std::vector<executorch::aten::DimOrderType> order;
    std::vector<executorch::aten::StridesType> strides;
    executorch::runtime::etensor::TensorImpl impl;
  };

  Array to_array(const et::EValue& v, const std::string& name, size_t i) {
    if (!v.isTensor()) refuse("method '" + name + "' output " + std::to_string(i) + " is not a tensor; run it from Python");
    const auto& t = v.toTensor();
    Array a;
    a.dtype = pipeline_trt::dtype_of_scalar_type(static_cast<int>(t.scalar_type()));
    a.shape.assign(t.sizes().begin(), t.sizes().end());
    const auto* p = static_cast<const uint8_t*>(t.const_data_ptr());
    a.data.assign(p, p + t.nbytes());
    return a;
  }

  void read_record() {
    auto meta = program_->method_meta("pipeline_record");
    if (!meta.ok()) return;  // a program from elsewhere: the delegate's checks only
    et::Method& m = method("pipeline_record");
    if (m.execute() != et::Error::Ok || m.outputs_size() != 1 || !m.get_output(0).isString())
      refuse(where_ + ": its program record does not run; rebuild it");
    auto text = m.get_output(0).toString();
    std::string error;
    if (!pipeline_runner::parse_record(std::string(text.data(), text.size()), specs_, error)) refuse(where_ + ": " + error);
  }

  std::string where_;
  std::optional<MmapDataLoader> pte_loader_, ptd_loader_;
  std::optional<et::Program> program_;
  std::optional<FlatTensorDataMap> data_map_;
  std::vector<std::vector<uint8_t>> arenas_;
  std::vector<et::Span<uint8_t>> spans_;
  std::vector<void*> pinned_;
  std::map<std::string, std::unique_ptr<Loaded>> methods_;
  std::map<std::string, std::vector<pipeline_runner::Spec>> specs_;
};

}  // namespace pipeline_runner
