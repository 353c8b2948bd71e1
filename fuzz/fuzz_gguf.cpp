// libFuzzer target for GGUF loading: any input must either parse into views that lie inside it or be refused
// with tandem::Error, and every input that parses then goes through model loading (bind_model: metadata,
// shapes, the consistency checks) and tokenizer construction, which must likewise succeed or throw
// tandem::Error, within the fuzzer's memory and time limits. Sanitizers turn overreads, overflows and
// undefined behaviour into crashes.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "tandem/gguf/reader.h"
#include "tandem/model/model.h"
#include "tandem/tokenizer/tokenizer.h"
#include "tandem/util/error.h"

namespace {

// Calls every typed getter on every key; each may refuse the value's type with tandem::Error.
void exercise_getters(const tandem::gguf::File& f) {
  for (const auto& [key, value] : f.metadata()) {
    try {
      (void)f.get_string(key);
    } catch (const tandem::Error&) {
    }
    try {
      (void)f.get_int(key);
    } catch (const tandem::Error&) {
    }
    try {
      (void)f.get_float(key);
    } catch (const tandem::Error&) {
    }
    try {
      (void)f.get_bool(key);
    } catch (const tandem::Error&) {
    }
    try {
      (void)f.get_strings(key);
    } catch (const tandem::Error&) {
    }
    try {
      (void)f.get_f32_array(key);
    } catch (const tandem::Error&) {
    }
    try {
      (void)f.get_i32_array(key);
    } catch (const tandem::Error&) {
    }
  }
}

// Binds the model; when that succeeds every view must lie inside the input.
void load_model(const tandem::gguf::File& f, const uint8_t* data, size_t size) {
  tandem::model::Config config;
  tandem::model::Weights weights;
  try {
    tandem::model::bind_model(f, config, weights);
  } catch (const tandem::Error&) {
    return;
  }
  auto inside = [&](const void* p, size_t n) {
    const auto* q = static_cast<const uint8_t*>(p);
    return q >= data && q <= data + size && n <= static_cast<size_t>(data + size - q);
  };
  for (const tandem::MatrixView* m : {&weights.tok_embd, &weights.output})
    if (!inside(m->data, m->bytes())) __builtin_trap();
  for (const tandem::model::LayerWeights& l : weights.layers)
    for (const tandem::MatrixView* m : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down})
      if (!inside(m->data, m->bytes())) __builtin_trap();
  if (static_cast<int64_t>(weights.layers.size()) != config.n_layer) __builtin_trap();
}

// Builds the tokenizer and runs a short text through it, specials parsed, and back.
void load_tokenizer(const tandem::gguf::File& f) {
  try {
    auto tok = tandem::tokenizer::Tokenizer::from_gguf(f);
    const std::vector<int32_t> ids = tok->encode("Hello world <s> \xC3\xA9\n", true, true);
    for (int32_t id : ids) (void)tok->token_to_piece(id);
  } catch (const tandem::Error&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    tandem::gguf::File f = tandem::gguf::File::parse(data, size, "fuzz.gguf");
    exercise_getters(f);
    // Touch the first and last byte of every tensor so the address sanitizer checks the bounds.
    volatile uint8_t sink = 0;
    for (const auto& t : f.tensors()) {
      (void)t.shape_string();
      if (t.bytes > 0) sink = static_cast<uint8_t>(sink + t.data[0] + t.data[t.bytes - 1]);
      if (f.tensor(t.name) == nullptr) __builtin_trap();
    }
    (void)sink;
    load_model(f, data, size);
    load_tokenizer(f);
  } catch (const tandem::Error&) {
  }
  return 0;
}
