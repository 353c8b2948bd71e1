// tandem info: what a GGUF file holds (architecture, shapes, tensor types and sizes, vocabulary).
#include <cstdio>
#include <map>
#include <string>

#include "tandem/cache/kv_cache.h"
#include "tandem/cli/commands.h"
#include "tandem/gguf/reader.h"
#include "tandem/model/model.h"
#include "tandem/model/moe.h"
#include "tandem/model/session.h"
#include "tandem/train/checkpoint.h"
#include "tandem/util/error.h"

namespace tandem::cli {
namespace {

// A drafter checkpoint (docs/training.md): what it drafts for, what it reads and how well it did on held-out
// text when it was trained.
void print_drafter(const gguf::File& f) {
  const train::DrafterInfo info = train::load_drafter(f.path(), {});
  std::printf(
      "drafter: kind %s, %lld layer%s, width %lld, %lld heads (%lld KV), head size %lld, FFN %lld, "
      "vocab %lld, block %lld\n",
      info.kind.c_str(), static_cast<long long>(info.layer_count), info.layer_count == 1 ? "" : "s",
      static_cast<long long>(info.d), static_cast<long long>(info.n_head),
      static_cast<long long>(info.n_kv_head), static_cast<long long>(info.head_dim),
      static_cast<long long>(info.ffn), static_cast<long long>(info.vocab),
      static_cast<long long>(info.block_size));
  std::printf("target: file hash %s, vocabulary hash %s\n", info.target_file_hash.c_str(),
              info.target_vocab_hash.c_str());
  std::printf("taps: target layers");
  for (int32_t l : info.tap_layers) std::printf(" %d", l);
  std::printf("\n");
  if (info.draft_vocab.empty()) {
    std::printf("draft vocabulary: the whole, %lld tokens\n", static_cast<long long>(info.vocab));
  } else {
    std::printf("draft vocabulary: %zu of the target's %lld tokens (the head scores these only), ids",
                info.draft_vocab.size(), static_cast<long long>(info.vocab));
    constexpr size_t kShown = 16;
    for (size_t i = 0; i < info.draft_vocab.size() && i < kShown; ++i)
      std::printf(" %d", info.draft_vocab[i]);
    std::printf("%s\n", info.draft_vocab.size() > kShown ? " ..." : "");
  }
  int64_t params = 0, optimizer_values = 0;
  size_t bytes = 0;
  for (const auto& t : f.tensors()) {
    const int64_t n = t.elements();
    if (t.name.rfind("adam.", 0) == 0) {
      optimizer_values += n;
      continue;
    }
    params += n;
    bytes += t.bytes;
  }
  const int64_t head_rows =
      info.draft_vocab.empty() ? info.vocab : static_cast<int64_t>(info.draft_vocab.size());
  const int64_t shared = info.vocab * info.d + (info.own_head ? 0 : head_rows * info.d);
  std::printf(
      "size: %lld trained parameters (%.1f KiB), plus the target's %s (%lld parameters, not stored)\n",
      static_cast<long long>(params), static_cast<double>(bytes) / 1024.0,
      info.own_head ? "embedding" : "embedding and head", static_cast<long long>(shared));
  std::printf("training: %lld steps, seed %llu%s\n", static_cast<long long>(info.step),
              static_cast<unsigned long long>(info.seed),
              optimizer_values > 0 ? ", optimizer state stored (resumable)" : "");
  if (info.acceptance.empty()) {
    std::printf("held-out acceptance: not measured\n");
    return;
  }
  std::printf("held-out acceptance by draft position (first k drafts all accepted):");
  double expected = 1.0;
  for (float a : info.acceptance) {
    std::printf(" %.3f", a);
    expected += a;
  }
  std::printf("\nexpected tokens per target forward at depth %zu (greedy): %.2f\n", info.acceptance.size(),
              expected);
}

}  // namespace

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
    if (arch == train::kDrafterArchitecture) {
      print_drafter(f);
      return;
    }
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
          static_cast<double>(cache::KvCache(c.kv_geometry(), 16, cache::KvType::kF16).bytes_per_token());
      std::printf(
          "shape: %lld layers, width %lld, %lld heads (%lld KV), head size %lld, FFN %lld, vocab %lld\n",
          static_cast<long long>(c.n_layer), static_cast<long long>(c.n_embd),
          static_cast<long long>(c.n_head), static_cast<long long>(c.n_head_kv),
          static_cast<long long>(c.head_dim), static_cast<long long>(c.n_ff),
          static_cast<long long>(c.n_vocab));
      if (c.n_mtp > 0)
        std::printf(
            "mtp: %lld next-token-prediction layer%s after the %lld main ones (blk.%lld..blk.%lld; not run "
            "by the main forward; drafts with --draft mtp)\n",
            static_cast<long long>(c.n_mtp), c.n_mtp == 1 ? "" : "s", static_cast<long long>(c.n_layer),
            static_cast<long long>(c.n_layer), static_cast<long long>(c.n_layer + c.n_mtp - 1));
      std::printf(
          "memory needed: %.1f MiB weights + %.1f MiB f16 KV cache at context %lld (%.0f bytes/token)\n",
          total / 1048576.0, kv_per_token * static_cast<double>(ctx) / 1048576.0, static_cast<long long>(ctx),
          kv_per_token);
      if (c.mla.kv_lora_rank > 0) {
        const auto expanded = static_cast<double>(c.expanded_kv_bytes_per_token());
        std::printf(
            "latent cache: %lld latent + %lld rotary values per token and layer, the value read from the "
            "key's latent (%.0f bytes/token in f16 against %.0f for expanded keys and values: 1/%.1f)\n",
            static_cast<long long>(c.mla.kv_lora_rank), static_cast<long long>(c.n_rot), kv_per_token,
            expanded, expanded / kv_per_token);
      }
      if (c.moe.n_expert > 0) {
        const model::ExpertBytes eb = model::expert_bytes(*model);
        const char* gating = c.moe.gating == model::ExpertGating::kSigmoid ? "sigmoid" : "softmax";
        std::printf(
            "experts: %lld routed per MoE layer (top %lld, %s%s, width %lld, %.2f MiB each), shared width "
            "%lld; %lld MoE layers of %lld\n",
            static_cast<long long>(c.moe.n_expert), static_cast<long long>(c.moe.n_expert_used), gating,
            c.moe.selection_bias ? " + selection bias" : "", static_cast<long long>(c.moe.n_ff_expert),
            static_cast<double>(eb.per_expert) / 1048576.0, static_cast<long long>(c.moe.n_ff_shared),
            static_cast<long long>(eb.moe_layers), static_cast<long long>(c.n_layer));
        const auto token = static_cast<double>(model->weight_bytes_per_token());
        std::printf(
            "bytes a token reads: %.1f MiB of %.1f MiB (routed experts chosen %.1f MiB of %.1f; shared "
            "experts and routers %.1f; the rest %.1f)\n",
            token / 1048576.0, total / 1048576.0, static_cast<double>(eb.routed_chosen) / 1048576.0,
            static_cast<double>(eb.routed_all) / 1048576.0, static_cast<double>(eb.shared) / 1048576.0,
            (token - static_cast<double>(eb.routed_chosen + eb.shared)) / 1048576.0);
      }
      if (const size_t state = cache::recurrent_state_bytes(c.kv_geometry()); state > 0) {
        const int64_t depth = cache::KvStoreOptions{}.recurrent_rollback;
        std::printf(
            "recurrent state: %.2f MiB per sequence (%lld states of %.1f KiB: conv %lld x %lld, scan %lld x "
            "%lld per layer, the state before a verify window of up to %lld rows and after each of its rows; "
            "the inputs of %lld rows for rollbacks of up to %lld; at most %lld snapshots for prefix reuse; "
            "%.2f MiB without rollback: plain decoding keeps one state)\n",
            static_cast<double>(cache::recurrent_sequence_bytes(c.kv_geometry(), depth)) / 1048576.0,
            static_cast<long long>(cache::RecurrentState::slots(depth)), static_cast<double>(state) / 1024.0,
            static_cast<long long>(c.ssm_d_conv - 1), static_cast<long long>(c.ssm_d_inner),
            static_cast<long long>(c.ssm_d_state), static_cast<long long>(c.ssm_d_inner),
            static_cast<long long>(cache::RecurrentState::window_rows(depth)),
            static_cast<long long>(cache::RecurrentState::rows_kept(depth)), static_cast<long long>(depth),
            static_cast<long long>(cache::RecurrentState::kMaxSnapshots),
            static_cast<double>(cache::recurrent_sequence_bytes(c.kv_geometry(), 0)) / 1048576.0);
      }
    } catch (const Error& e) {
      std::printf("not runnable: %s\n", e.what());
    }
  });
}

}  // namespace tandem::cli
