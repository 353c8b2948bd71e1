// The architecture families. Each is defined in its own arch_*.cpp and listed in registry.cpp.
#pragma once

#include "tandem/model/model.h"

namespace tandem::model {

void load_llama(const ArchReader& r, Config& c, Weights& w);
void load_qwen2(const ArchReader& r, Config& c, Weights& w);
void load_qwen3(const ArchReader& r, Config& c, Weights& w);
void load_gemma2(const ArchReader& r, Config& c, Weights& w);
void load_bert(const ArchReader& r, Config& c, Weights& w);
void load_nomic_bert(const ArchReader& r, Config& c, Weights& w);
void load_qwen2moe(const ArchReader& r, Config& c, Weights& w);
void load_qwen3moe(const ArchReader& r, Config& c, Weights& w);
void load_deepseek2(const ArchReader& r, Config& c, Weights& w);
void load_mamba(const ArchReader& r, Config& c, Weights& w);
void load_jamba(const ArchReader& r, Config& c, Weights& w);

// Shared by the families with Mamba-1 mixers (arch_mamba.cpp): the ssm.* sizes, and one layer's mixer
// tensors (with jamba's RMSNorm weights for dt, B and C when `dt_b_c_norms`).
void read_ssm_config(const ArchReader& r, Config& c);
void bind_ssm_mixer(const ArchReader& r, const Config& c, int64_t layer, bool dt_b_c_norms, LayerWeights& l);

}  // namespace tandem::model
