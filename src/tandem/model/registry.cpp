// The registry of architecture families, keyed by general.architecture.
#include "tandem/model/arch.h"

namespace tandem::model {

const std::vector<ArchEntry>& architectures() {
  static const std::vector<ArchEntry> kArchitectures = {
      {"llama", load_llama},           {"mistral", load_llama},       {"qwen2", load_qwen2},
      {"qwen3", load_qwen3},           {"gemma2", load_gemma2},       {"qwen2moe", load_qwen2moe},
      {"qwen3moe", load_qwen3moe},     {"deepseek2", load_deepseek2}, {"bert", load_bert},
      {"nomic-bert", load_nomic_bert}, {"mamba", load_mamba},         {"jamba", load_jamba},
  };
  return kArchitectures;
}

}  // namespace tandem::model
