// tandem info: what a GGUF file holds (architecture, shapes, tensor types and sizes, vocabulary).
#include <cstdio>
#include <map>
#include <string>

#include "tandem/cli/commands.h"
#include "tandem/gguf/reader.h"
#include "tandem/model/model.h"
#include "tandem/model/session.h"
#include "tandem/util/error.h"

namespace tandem::cli {

void add_info_command(CLI::App& app) {
  auto* cmd =
      app.add_subcommand("info", "Describe a GGUF file: architecture, shapes, tensor types, vocabulary");
  auto path = std::make_shared<std::string>();
  auto all = std::make_shared<bool>(false);
  cmd->add_option("-m,--model", *path, "GGUF file")->required();
  cmd->add_flag("--tensors", *all, "List every tensor");
  cmd->callback([path, all] {
    gguf::File f = gguf::File::open(*path);
    std::printf("file: %s (GGUF v%u, %.1f MiB)\n", path->c_str(), f.version(), f.file_size() / 1048576.0);
    std::string arch(f.get_string("general.architecture").value_or("(none)"));
    std::printf("architecture: %s\n", arch.c_str());
    if (auto name = f.get_string("general.name"))
      std::printf("name: %.*s\n", int(name->size()), name->data());
    for (const auto& [key, v] : f.metadata()) {
      if (key.rfind(arch + ".", 0) != 0) continue;
      if (v.type == gguf::ValueType::STRING)
        std::printf("  %s = %.*s\n", key.c_str(), int(v.str.size()), v.str.data());
      else if (v.type == gguf::ValueType::ARRAY)
        std::printf("  %s = [%llu values]\n", key.c_str(), static_cast<unsigned long long>(v.count));
      else
        std::printf("  %s = %g\n", key.c_str(), v.f);
    }
    auto tokens = f.get_strings("tokenizer.ggml.tokens");
    std::string tok_model(f.get_string("tokenizer.ggml.model").value_or("(none)"));
    std::string pre(f.get_string("tokenizer.ggml.pre").value_or("default"));
    std::printf("vocabulary: %zu tokens, model %s, pre-tokenizer %s\n", tokens.size(), tok_model.c_str(),
                pre.c_str());
    std::map<std::string, std::pair<int, size_t>> by_type;
    size_t total = 0;
    for (const auto& t : f.tensors()) {
      auto& e = by_type[std::string(dtype_name(t.type))];
      e.first++;
      e.second += t.bytes;
      total += t.bytes;
      if (*all)
        std::printf("  %-40s %-6s %-22s %10zu bytes\n", t.name.c_str(),
                    std::string(dtype_name(t.type)).c_str(), t.shape_string().c_str(), t.bytes);
    }
    std::printf("tensors: %zu, %.2f MiB of weights\n", f.tensors().size(), total / 1048576.0);
    for (const auto& [name, e] : by_type)
      std::printf("  %-6s %4d tensors %10.2f MiB\n", name.c_str(), e.first, e.second / 1048576.0);
    if (f.tensors().empty()) return;  // a vocabulary-only file
    // Memory to run it: the mapped weights plus an f16 KV cache at the default context.
    try {
      auto model = model::Model::from_file(f);
      const model::Config& c = model->config();
      const int64_t ctx = model::default_context(*model, 0);
      const double kv_per_token =
          static_cast<double>(c.n_layer * c.n_head_kv * (c.head_dim + c.head_dim_v) * 2);
      std::printf(
          "shape: %lld layers, width %lld, %lld heads (%lld KV), head size %lld, FFN %lld, vocab %lld\n",
          static_cast<long long>(c.n_layer), static_cast<long long>(c.n_embd),
          static_cast<long long>(c.n_head), static_cast<long long>(c.n_head_kv),
          static_cast<long long>(c.head_dim), static_cast<long long>(c.n_ff),
          static_cast<long long>(c.n_vocab));
      std::printf(
          "memory needed: %.1f MiB weights + %.1f MiB f16 KV cache at context %lld (%.0f bytes/token)\n",
          total / 1048576.0, kv_per_token * static_cast<double>(ctx) / 1048576.0, static_cast<long long>(ctx),
          kv_per_token);
      if (const size_t state = cache::recurrent_state_bytes(c.kv_geometry()); state > 0) {
        const int64_t depth = cache::KvStoreOptions{}.recurrent_rollback;
        std::printf(
            "recurrent state: %.2f MiB per sequence (2 states of %.1f KiB: conv %lld x %lld, scan %lld x "
            "%lld "
            "per layer; the inputs of %lld rows for rollbacks of up to %lld; at most %lld snapshots for "
            "prefix "
            "reuse)\n",
            static_cast<double>(cache::recurrent_sequence_bytes(c.kv_geometry(), depth)) / 1048576.0,
            static_cast<double>(state) / 1024.0, static_cast<long long>(c.ssm_d_conv - 1),
            static_cast<long long>(c.ssm_d_inner), static_cast<long long>(c.ssm_d_state),
            static_cast<long long>(c.ssm_d_inner),
            static_cast<long long>(cache::RecurrentState::rows_kept(depth)), static_cast<long long>(depth),
            static_cast<long long>(cache::RecurrentState::kMaxSnapshots));
      }
    } catch (const Error& e) {
      std::printf("not runnable: %s\n", e.what());
    }
  });
}

}  // namespace tandem::cli
