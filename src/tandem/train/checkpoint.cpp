#include "tandem/train/checkpoint.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <optional>

#include "tandem/gguf/reader.h"
#include "tandem/gguf/writer.h"
#include "tandem/util/error.h"

namespace tandem::train {
namespace {

constexpr const char* kPrefix = "tandem.drafter.";

std::string key(const char* name) {
  return std::string(kPrefix) + name;
}

void validate(const DrafterInfo& info, const std::string& path) {
  const auto bad = [&](const std::string& what) { throw Error("drafter checkpoint " + path + ": " + what); };
  if (info.kind != "eagle3" && info.kind != "dflash")
    bad(key("kind") + " must be \"eagle3\" or \"dflash\" (got \"" + info.kind + "\")");
  if (info.target_file_hash.empty()) bad(key("target.file_hash") + " must name the target's file");
  if (info.target_vocab_hash.empty()) bad(key("target.vocab_hash") + " must name the target's vocabulary");
  if (info.tap_layers.empty()) bad(key("tap_layers") + " must list at least one target layer");
  for (int32_t layer : info.tap_layers)
    if (layer < 0) bad(key("tap_layers") + " holds a negative layer " + std::to_string(layer));
  if (info.block_size < 1) bad(key("block_size") + " must be at least 1");
  if (info.layer_count < 1 || info.d < 1 || info.n_head < 1 || info.n_kv_head < 1 || info.head_dim < 1 ||
      info.ffn < 1 || info.vocab < 1)
    bad("the layer count, widths, head counts and vocabulary size must all be positive");
  if (info.n_head % info.n_kv_head != 0) bad("the head count must be a multiple of the KV head count");
  if (info.rope_layout != "interleaved" && info.rope_layout != "halves")
    bad(key("rope.layout") + " must be \"interleaved\" or \"halves\" (got \"" + info.rope_layout + "\")");
  if (!info.draft_vocab.empty()) {
    std::vector<bool> seen(static_cast<size_t>(std::max<int64_t>(info.vocab, 0)), false);
    for (size_t i = 0; i < info.draft_vocab.size(); ++i) {
      const int32_t id = info.draft_vocab[i];
      if (id < 0 || id >= info.vocab)
        bad(key("draft_vocab.ids") + " entry " + std::to_string(i) + " is token id " + std::to_string(id) +
            ", outside the target's vocabulary of " + std::to_string(info.vocab) +
            ": the file is damaged; train the drafter again");
      if (seen[static_cast<size_t>(id)])
        bad(key("draft_vocab.ids") + " lists token id " + std::to_string(id) +
            " twice: the file is damaged; train the drafter again");
      seen[static_cast<size_t>(id)] = true;
    }
  }
  float prev = 1.0f;
  for (float a : info.acceptance) {
    if (!(a >= 0.0f && a <= prev)) bad(key("acceptance") + " must be non-increasing values in [0, 1]");
    prev = a;
  }
}

std::vector<int64_t> dims(const Param& p) {
  return p.cols == 1 ? std::vector<int64_t>{p.rows} : std::vector<int64_t>{p.cols, p.rows};
}

std::span<const uint8_t> bytes(const std::vector<float>& v) {
  return {reinterpret_cast<const uint8_t*>(v.data()), v.size() * sizeof(float)};
}

void read_tensor(const gguf::File& f, const std::string& name, const Param& like, std::vector<float>& out) {
  const gguf::TensorInfo* t = f.tensor(name);
  const std::string where = "drafter checkpoint " + f.path() + ": tensor " + name;
  if (t == nullptr) throw Error(where + " is missing");
  const std::vector<int64_t> want = dims(like);
  bool same = t->type == DType::F32 && t->n_dims == static_cast<int>(want.size());
  for (size_t i = 0; same && i < want.size(); ++i) same = t->ne[i] == want[i];
  if (!same) {
    std::string w = "[";
    for (size_t i = 0; i < want.size(); ++i) w += (i ? ", " : "") + std::to_string(want[i]);
    throw Error(where + " is " + std::string(dtype_name(t->type)) + " " + t->shape_string() +
                ", expected F32 " + w + "]");
  }
  out.resize(static_cast<size_t>(like.size()));
  std::memcpy(out.data(), t->data, out.size() * sizeof(float));
}

}  // namespace

void save_drafter(const std::string& path, const DrafterInfo& info, std::span<Param* const> params,
                  const AdamW* opt) {
  validate(info, path);
  gguf::Writer w;
  w.add_string("general.architecture", kDrafterArchitecture);
  w.add_string(key("kind"), info.kind);
  w.add_string(key("target.file_hash"), info.target_file_hash);
  w.add_string(key("target.vocab_hash"), info.target_vocab_hash);
  w.add_array(key("tap_layers"), std::span<const int32_t>(info.tap_layers));
  w.add_u32(key("block_size"), static_cast<uint32_t>(info.block_size));
  w.add_array(key("acceptance"), std::span<const float>(info.acceptance));
  w.add_u32(key("layer_count"), static_cast<uint32_t>(info.layer_count));
  w.add_u32(key("embedding_length"), static_cast<uint32_t>(info.d));
  w.add_u32(key("attention.head_count"), static_cast<uint32_t>(info.n_head));
  w.add_u32(key("attention.head_count_kv"), static_cast<uint32_t>(info.n_kv_head));
  w.add_u32(key("attention.key_length"), static_cast<uint32_t>(info.head_dim));
  w.add_f32(key("attention.layer_norm_rms_epsilon"), info.norm_eps);
  w.add_u32(key("feed_forward_length"), static_cast<uint32_t>(info.ffn));
  w.add_u32(key("vocab_size"), static_cast<uint32_t>(info.vocab));
  w.add_f32(key("rope.freq_base"), info.rope_theta);
  w.add_string(key("rope.layout"), info.rope_layout);
  w.add_bool(key("own_head"), info.own_head);
  if (!info.draft_vocab.empty()) {
    w.add_u32(key("draft_vocab.size"), static_cast<uint32_t>(info.draft_vocab.size()));
    w.add_array(key("draft_vocab.ids"), std::span<const int32_t>(info.draft_vocab));
  }
  w.add_u64(key("train.step"), static_cast<uint64_t>(info.step));
  w.add_u64(key("train.seed"), info.seed);
  w.add_u64(key("train.total_steps"), static_cast<uint64_t>(info.total_steps));
  w.add_u64(key("train.data_position"), info.data_position);
  if (opt != nullptr) w.add_u64(key("train.adam_steps"), static_cast<uint64_t>(opt->steps()));
  for (const Param* p : params)
    if (p->trainable()) w.add_tensor(p->name, DType::F32, dims(*p), bytes(p->value));
  if (opt != nullptr) {
    const AdamW& o = *opt;
    for (size_t i = 0; i < o.params().size(); ++i) {
      const Param& p = *o.params()[i];
      w.add_tensor("adam.m." + p.name, DType::F32, dims(p), bytes(o.first_moment(i)));
      w.add_tensor("adam.v." + p.name, DType::F32, dims(p), bytes(o.second_moment(i)));
    }
  }
  w.write_file(path);
}

DrafterInfo load_drafter(const std::string& path, std::span<Param* const> params, AdamW* opt) {
  const gguf::File f = gguf::File::open(path);
  const std::string where = "drafter checkpoint " + path;
  const auto arch = f.get_string("general.architecture");
  if (arch != std::string_view(kDrafterArchitecture))
    throw Error(where + ": general.architecture is \"" + std::string(arch.value_or("")) + "\", expected \"" +
                kDrafterArchitecture + "\" (is this a drafter checkpoint?)");
  const auto need = [&](const char* name) { return where + " lacks " + key(name); };
  const auto str = [&](const char* name) {
    const auto v = f.get_string(key(name));
    if (!v) throw Error(need(name) + " (a string)");
    return std::string(*v);
  };
  const auto integer = [&](const char* name) {
    const auto v = f.get_int(key(name));
    if (!v) throw Error(need(name) + " (an integer)");
    return *v;
  };
  const auto real = [&](const char* name) {
    const auto v = f.get_float(key(name));
    if (!v) throw Error(need(name) + " (a number)");
    return static_cast<float>(*v);
  };
  DrafterInfo info;
  info.kind = str("kind");
  info.target_file_hash = str("target.file_hash");
  info.target_vocab_hash = str("target.vocab_hash");
  info.tap_layers = f.get_i32_array(key("tap_layers"));
  info.block_size = integer("block_size");
  info.acceptance = f.get_f32_array(key("acceptance"));
  info.layer_count = integer("layer_count");
  info.d = integer("embedding_length");
  info.n_head = integer("attention.head_count");
  info.n_kv_head = integer("attention.head_count_kv");
  info.head_dim = integer("attention.key_length");
  info.norm_eps = real("attention.layer_norm_rms_epsilon");
  info.ffn = integer("feed_forward_length");
  info.vocab = integer("vocab_size");
  info.rope_theta = real("rope.freq_base");
  info.rope_layout = str("rope.layout");
  info.own_head = f.get_bool(key("own_head")).value_or(false);
  if (const auto size = f.get_int(key("draft_vocab.size"))) {
    if (f.find(key("draft_vocab.ids")) == nullptr)
      throw Error(need("draft_vocab.ids") + " (the token ids of its draft vocabulary of " +
                  std::to_string(*size) + ")");
    info.draft_vocab = f.get_i32_array(key("draft_vocab.ids"));
    if (*size < 1 || static_cast<int64_t>(info.draft_vocab.size()) != *size)
      throw Error(where + ": " + key("draft_vocab.size") + " is " + std::to_string(*size) + " but " +
                  key("draft_vocab.ids") + " holds " + std::to_string(info.draft_vocab.size()) +
                  " ids: the file is damaged; train the drafter again");
  } else if (f.find(key("draft_vocab.ids")) != nullptr) {
    throw Error(need("draft_vocab.size") + " beside its " + key("draft_vocab.ids"));
  }
  info.step = integer("train.step");
  info.seed = static_cast<uint64_t>(integer("train.seed"));
  info.total_steps = f.get_int(key("train.total_steps")).value_or(0);
  // The whole u64 range (a generator's state), which get_int refuses past int64's.
  if (const gguf::Value* v = f.find(key("train.data_position"))) {
    if (v->type != gguf::ValueType::U64)
      throw Error(where + ": " + key("train.data_position") + " must be a u64");
    info.data_position = v->u;
  }
  validate(info, path);

  for (Param* p : params)
    if (p->trainable()) read_tensor(f, p->name, *p, p->value);
  if (opt != nullptr) {
    const auto steps = f.get_int(key("train.adam_steps"));
    if (!steps) throw Error(need("train.adam_steps") + ": it holds no optimizer state to resume from");
    for (size_t i = 0; i < opt->params().size(); ++i) {
      const Param& p = *opt->params()[i];
      read_tensor(f, "adam.m." + p.name, p, opt->first_moment(i));
      read_tensor(f, "adam.v." + p.name, p, opt->second_moment(i));
    }
    opt->set_steps(*steps);
  }
  return info;
}

void check_target(const DrafterInfo& info, const std::string& file_hash, const std::string& vocab_hash) {
  if (info.target_vocab_hash != vocab_hash)
    throw Error("this drafter was trained for a target with vocabulary hash " + info.target_vocab_hash +
                ", not " + vocab_hash + ": its token ids would not match; train one for this target");
  if (info.target_file_hash != file_hash)
    throw Error("this drafter was trained for the target file with hash " + info.target_file_hash + ", not " +
                file_hash + ": use the target it was trained on, or train one for this target");
}

}  // namespace tandem::train
