#include "tandem/server/embeddings_api.h"

#include <algorithm>
#include <bit>
#include <charconv>
#include <cmath>
#include <cstring>

namespace tandem::server {

using nlohmann::json;

namespace {

static_assert(std::endian::native == std::endian::little, "base64 embeddings are little-endian float32");

const char* type_name(const json& v) {
  if (v.is_null()) return "null";
  if (v.is_boolean()) return "a boolean";
  if (v.is_number()) return "a number";
  if (v.is_string()) return "a string";
  if (v.is_array()) return "an array";
  return "an object";
}

[[noreturn]] void wrong_type(const std::string& field, const char* want, const json& got) {
  throw bad_request("'" + field + "' must be " + want + ", not " + type_name(got), field);
}

// Optional fields: absent and null both mean "use the default".
const json* field(const json& body, const char* name) {
  auto it = body.find(name);
  if (it == body.end() || it->is_null()) return nullptr;
  return &*it;
}

constexpr const char* kInputKinds =
    "a string, an array of strings, an array of token ids or an array of arrays of token ids";

std::vector<int32_t> token_ids(const json& arr, const std::string& where, int64_t n_vocab) {
  std::vector<int32_t> ids;
  ids.reserve(arr.size());
  for (size_t i = 0; i < arr.size(); ++i) {
    const json& x = arr[i];
    const std::string at = where + "[" + std::to_string(i) + "]";
    if (!x.is_number_integer()) wrong_type(at, "a token id (an integer)", x);
    if (x.is_number_unsigned() ? x.get<uint64_t>() >= static_cast<uint64_t>(n_vocab)
                               : (x.get<int64_t>() < 0 || x.get<int64_t>() >= n_vocab))
      throw bad_request("token id " + x.dump() + " in '" + at + "' is outside the vocabulary (0.." +
                            std::to_string(n_vocab - 1) + ")",
                        at);
    ids.push_back(static_cast<int32_t>(x.get<int64_t>()));
  }
  if (ids.empty())
    throw bad_request("'" + where + "' is an empty list of token ids; give at least one", where);
  return ids;
}

void parse_input(const json& body, EmbeddingRequest& r, const EmbeddingLimits& limits) {
  const json* in = field(body, "input");
  if (!in) throw bad_request("'input' is required", "input");
  const int64_t n_vocab = limits.api.n_vocab;
  auto text = [&](const json& s, const std::string& where) {
    std::string t = s.get<std::string>();
    if (t.empty()) throw bad_request("'" + where + "' is an empty string; give every input some text", where);
    r.texts.push_back(std::move(t));
  };
  if (in->is_string()) {
    text(*in, "input");
    return;
  }
  if (!in->is_array()) wrong_type("input", kInputKinds, *in);
  if (in->empty()) throw bad_request("'input' is an empty list; give at least one input", "input");
  if (in->size() > limits.max_inputs && !(*in)[0].is_number())
    throw bad_request("'input' holds " + std::to_string(in->size()) + " inputs; at most " +
                          std::to_string(limits.max_inputs) + " are allowed per request",
                      "input");
  const json& first = (*in)[0];
  if (first.is_number()) {  // one input as token ids
    r.token_ids.push_back(token_ids(*in, "input", n_vocab));
    return;
  }
  for (size_t i = 0; i < in->size(); ++i) {
    const json& x = (*in)[i];
    const std::string at = "input[" + std::to_string(i) + "]";
    // All inputs of a request are of one kind, as the first one.
    if (first.is_string()) {
      if (!x.is_string()) wrong_type(at, "a string, as input[0] is", x);
      text(x, at);
    } else if (first.is_array()) {
      if (!x.is_array()) wrong_type(at, "an array of token ids, as input[0] is", x);
      r.token_ids.push_back(token_ids(x, at, n_vocab));
    } else {
      wrong_type(at, "a string, a token id or an array of token ids", x);
    }
  }
}

// The shortest text that reads back as the same float32 (JSON has no NaN or infinity: null).
void append_float(std::string& out, float x) {
  if (!std::isfinite(x)) {
    out += "null";
    return;
  }
  char buf[32];
  const auto end = std::to_chars(buf, buf + sizeof(buf), x).ptr;
  out.append(buf, end);
}

}  // namespace

EmbeddingRequest parse_embedding_request(const std::string& body, const EmbeddingLimits& limits) {
  check_json_shape(body, limits.api);
  const json j = json::parse(body);
  if (!j.is_object())
    throw bad_request(std::string("the request body must be a JSON object, not ") + type_name(j));
  EmbeddingRequest r;
  const json* model = field(j, "model");
  if (!model) throw bad_request("'model' is required", "model");
  if (!model->is_string()) wrong_type("model", "a string", *model);
  r.model = model->get<std::string>();
  if (r.model != limits.api.model_name)
    throw ApiError(
        404, "invalid_request_error",
        "The model '" + r.model + "' does not exist; this server serves '" + limits.api.model_name + "'",
        "model", "model_not_found");
  parse_input(j, r, limits);

  if (const json* f = field(j, "encoding_format")) {
    if (!f->is_string()) wrong_type("encoding_format", "\"float\" or \"base64\"", *f);
    const std::string format = f->get<std::string>();
    if (format != "float" && format != "base64")
      throw bad_request("'encoding_format' must be \"float\" or \"base64\", got \"" + format + "\"",
                        "encoding_format");
    r.base64 = format == "base64";
  }
  if (const json* d = field(j, "dimensions")) {
    if (!d->is_number_integer()) wrong_type("dimensions", "an integer", *d);
    const bool negative = d->is_number_integer() && !d->is_number_unsigned() && d->get<int64_t>() < 0;
    const int64_t k = negative ? -1 : static_cast<int64_t>(std::min<uint64_t>(d->get<uint64_t>(), INT64_MAX));
    const auto& allowed = limits.truncatable_dims;
    if (k != limits.dim && std::find(allowed.begin(), allowed.end(), k) == allowed.end()) {
      std::string widths = std::to_string(limits.dim);
      for (const int64_t w : allowed) widths += ", " + std::to_string(w);
      throw bad_request("'dimensions' is " + d->dump() + ", but this model's embeddings have " +
                            std::to_string(limits.dim) + " values and it allows " +
                            (allowed.empty() ? "no other width" : "only the widths " + widths),
                        "dimensions");
    }
    r.dimensions = k;
  }
  if (const json* t = field(j, "truncate")) {
    if (!t->is_boolean()) wrong_type("truncate", "a boolean", *t);
    r.truncate = t->get<bool>();
  }
  if (const json* u = field(j, "user")) {
    if (!u->is_string()) wrong_type("user", "a string", *u);
    r.user = u->get<std::string>();
  }
  return r;
}

void fit_to_context(std::vector<std::vector<int32_t>>& inputs, int64_t max_tokens, bool truncate) {
  for (size_t i = 0; i < inputs.size(); ++i) {
    auto& ids = inputs[i];
    if (static_cast<int64_t>(ids.size()) <= max_tokens) continue;
    if (truncate) {
      ids.resize(static_cast<size_t>(max_tokens));
      continue;
    }
    const std::string at = inputs.size() == 1 ? "input" : "input[" + std::to_string(i) + "]";
    throw ApiError(400, "invalid_request_error",
                   "This model's maximum context length is " + std::to_string(max_tokens) + " tokens, but '" +
                       at + "' has " + std::to_string(ids.size()) +
                       " tokens; shorten it, or send \"truncate\": true to embed its first " +
                       std::to_string(max_tokens) + " tokens",
                   at, "context_length_exceeded");
  }
}

void truncate_embeddings(std::vector<float>& embeddings, int64_t n, int64_t dim, int64_t width) {
  if (width == dim) return;
  for (int64_t s = 0; s < n; ++s) {
    float* dst = embeddings.data() + s * width;
    std::memmove(dst, embeddings.data() + s * dim, static_cast<size_t>(width) * sizeof(float));
    double sum = 0;
    for (int64_t i = 0; i < width; ++i) sum += static_cast<double>(dst[i]) * dst[i];
    if (sum <= 0) continue;
    const auto scale = static_cast<float>(1.0 / std::sqrt(sum));
    for (int64_t i = 0; i < width; ++i) dst[i] *= scale;
  }
  embeddings.resize(static_cast<size_t>(n * width));
}

std::string base64_encode(const void* bytes, size_t n) {
  static constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  const auto* p = static_cast<const unsigned char*>(bytes);
  std::string out;
  out.reserve((n + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 3 <= n; i += 3) {
    const uint32_t v = (uint32_t{p[i]} << 16) | (uint32_t{p[i + 1]} << 8) | p[i + 2];
    for (int k = 3; k >= 0; --k) out += kAlphabet[(v >> (6 * k)) & 63];
  }
  if (const size_t rest = n - i; rest > 0) {
    const uint32_t v = (uint32_t{p[i]} << 16) | (rest == 2 ? uint32_t{p[i + 1]} << 8 : 0);
    out += kAlphabet[(v >> 18) & 63];
    out += kAlphabet[(v >> 12) & 63];
    out += rest == 2 ? kAlphabet[(v >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

std::string embedding_response(const std::string& model, const std::vector<float>& embeddings, int64_t n,
                               int64_t width, bool base64, int64_t prompt_tokens) {
  std::string out = R"({"object":"list","data":[)";
  out.reserve(out.size() + static_cast<size_t>(n * (base64 ? width * 4 / 3 + 64 : width * 12 + 64)));
  for (int64_t s = 0; s < n; ++s) {
    if (s) out += ',';
    out += R"({"object":"embedding","index":)" + std::to_string(s) + R"(,"embedding":)";
    const float* e = embeddings.data() + s * width;
    if (base64) {
      out += '"' + base64_encode(e, static_cast<size_t>(width) * sizeof(float)) + '"';
    } else {
      out += '[';
      for (int64_t i = 0; i < width; ++i) {
        if (i) out += ',';
        append_float(out, e[i]);
      }
      out += ']';
    }
    out += '}';
  }
  out += R"(],"model":)" + dump(json(model)) + R"(,"usage":{"prompt_tokens":)" +
         std::to_string(prompt_tokens) + R"(,"total_tokens":)" + std::to_string(prompt_tokens) + "}}";
  return out;
}

}  // namespace tandem::server
