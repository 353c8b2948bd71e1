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

}  // namespace tandem::model
