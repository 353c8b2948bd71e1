#include "tandem/server/openai_api.h"

#include <cmath>
#include <limits>

#include "tandem/sampling/json_schema.h"
#include "tandem/util/error.h"

namespace tandem::server {

using nlohmann::json;

json ApiError::to_json() const {
  json e = {{"message", what()}, {"type", type}, {"param", nullptr}, {"code", nullptr}};
  if (!param.empty()) e["param"] = param;
  if (!code.empty()) e["code"] = code;
  return json{{"error", e}};
}

ApiError bad_request(const std::string& message, const std::string& param) {
  return ApiError(400, "invalid_request_error", message, param);
}

std::string dump(const json& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

namespace {

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

double number_in(const json& body, const char* name, double fallback, double lo, double hi) {
  const json* v = field(body, name);
  if (!v) return fallback;
  if (!v->is_number()) wrong_type(name, "a number", *v);
  const double x = v->get<double>();
  if (!std::isfinite(x) || x < lo || x > hi)
    throw bad_request(
        "'" + std::string(name) + "' must be between " + dump(lo) + " and " + dump(hi) + ", got " + dump(*v),
        name);
  return x;
}

std::optional<int64_t> integer(const json& body, const char* name) {
  const json* v = field(body, name);
  if (!v) return std::nullopt;
  if (!v->is_number_integer()) {
    // 5.0 is accepted as 5, as JSON does not distinguish them.
    if (v->is_number_float()) {
      const double d = v->get<double>();
      if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9e15) return static_cast<int64_t>(d);
    }
    wrong_type(name, "an integer", *v);
  }
  if (v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
    throw bad_request("'" + std::string(name) + "' is too large", name);
  return v->get<int64_t>();
}

bool boolean(const json& body, const char* name, bool fallback) {
  const json* v = field(body, name);
  if (!v) return fallback;
  if (!v->is_boolean()) wrong_type(name, "a boolean", *v);
  return v->get<bool>();
}

std::string message_content(const json& m, size_t i) {
  const std::string where = "messages[" + std::to_string(i) + "].content";
  auto it = m.find("content");
  if (it == m.end() || it->is_null()) return {};  // an assistant turn with tool calls only
  if (it->is_string()) return it->get<std::string>();
  if (!it->is_array()) wrong_type(where, "a string or an array of text parts", *it);
  std::string text;
  for (const json& part : *it) {
    if (!part.is_object()) wrong_type(where, "a string or an array of text parts", part);
    auto type = part.find("type");
    auto t = part.find("text");
    if (type == part.end() || *type != "text" || t == part.end() || !t->is_string())
      throw bad_request("only text content parts are supported (" + where + ")", where);
    text += t->get<std::string>();
  }
  return text;
}

std::string string_field(const json& obj, const char* name, const std::string& where, bool required) {
  const json* v = field(obj, name);
  if (!v) {
    if (required) throw bad_request("'" + where + "." + name + "' is required", where + "." + name);
    return {};
  }
  if (!v->is_string()) wrong_type(where + "." + name, "a string", *v);
  return v->get<std::string>();
}

// An assistant message's tool_calls, a tool message's tool_call_id and name.
void parse_message_tools(const json& m, const std::string& where, ChatMessage& msg) {
  msg.tool_call_id = string_field(m, "tool_call_id", where, false);
  msg.name = string_field(m, "name", where, false);
  const json* calls = field(m, "tool_calls");
  if (!calls) return;
  if (!calls->is_array()) wrong_type(where + ".tool_calls", "an array", *calls);
  for (size_t k = 0; k < calls->size(); ++k) {
    const json& c = (*calls)[k];
    const std::string at = where + ".tool_calls[" + std::to_string(k) + "]";
    if (!c.is_object()) wrong_type(at, "an object", c);
    const json* fn = field(c, "function");
    if (!fn) throw bad_request("'" + at + ".function' is required", at + ".function");
    if (!fn->is_object()) wrong_type(at + ".function", "an object", *fn);
    ChatToolCall call;
    call.id = string_field(c, "id", at, false);
    call.name = string_field(*fn, "name", at + ".function", true);
    call.arguments = string_field(*fn, "arguments", at + ".function", false);
    if (call.arguments.empty()) call.arguments = "{}";
    msg.tool_calls.push_back(std::move(call));
  }
}

void parse_messages(const json& body, CompletionRequest& r) {
  auto it = body.find("messages");
  if (it == body.end()) throw bad_request("'messages' is required", "messages");
  if (!it->is_array()) wrong_type("messages", "an array", *it);
  if (it->empty()) throw bad_request("'messages' must hold at least one message", "messages");
  for (size_t i = 0; i < it->size(); ++i) {
    const json& m = (*it)[i];
    const std::string where = "messages[" + std::to_string(i) + "]";
    if (!m.is_object()) wrong_type(where, "an object", m);
    auto role = m.find("role");
    if (role == m.end()) throw bad_request("'" + where + ".role' is required", where + ".role");
    if (!role->is_string()) wrong_type(where + ".role", "a string", *role);
    ChatMessage msg{role->get<std::string>(), message_content(m, i), {}, {}, {}};
    parse_message_tools(m, where, msg);
    if (msg.role == "developer") msg.role = "system";
    if (msg.role != "system" && msg.role != "user" && msg.role != "assistant" && msg.role != "tool")
      throw bad_request(
          "'" + where + ".role' must be system, user, assistant or tool, got '" + msg.role + "'",
          where + ".role");
    r.messages.push_back(std::move(msg));
  }
}

void parse_prompt(const json& body, CompletionRequest& r, const ApiLimits& limits) {
  auto it = body.find("prompt");
  if (it == body.end() || it->is_null()) throw bad_request("'prompt' is required", "prompt");
  const json& p = *it;
  auto ids = [&](const json& arr) {
    for (const json& x : arr) {
      if (!x.is_number_integer()) wrong_type("prompt", "a string, an array of strings or of token ids", x);
      const int64_t id = x.get<int64_t>();
      if (id < 0 || id >= limits.n_vocab)
        throw bad_request("token id " + std::to_string(id) + " in 'prompt' is outside the vocabulary (0.." +
                              std::to_string(limits.n_vocab - 1) + ")",
                          "prompt");
      r.prompt_ids.push_back(static_cast<int32_t>(id));
    }
    if (r.prompt_ids.empty()) throw bad_request("'prompt' is empty", "prompt");
  };
  if (p.is_string()) {
    r.prompt = p.get<std::string>();
  } else if (p.is_array()) {
    if (p.empty()) throw bad_request("'prompt' is empty", "prompt");
    if (p[0].is_number()) {
      ids(p);
    } else {
      if (p.size() != 1) throw bad_request("only one prompt per request is supported", "prompt");
      if (p[0].is_string())
        r.prompt = p[0].get<std::string>();
      else if (p[0].is_array())
        ids(p[0]);
      else
        wrong_type("prompt", "a string, an array of strings or of token ids", p[0]);
    }
  } else {
    wrong_type("prompt", "a string, an array of strings or of token ids", p);
  }
}

void parse_stop(const json& body, CompletionRequest& r) {
  const json* v = field(body, "stop");
  if (!v) return;
  if (v->is_string()) {
    r.stop.push_back(v->get<std::string>());
  } else if (v->is_array()) {
    if (v->size() > 4) throw bad_request("'stop' holds at most 4 sequences", "stop");
    for (const json& s : *v) {
      if (!s.is_string()) wrong_type("stop", "a string or an array of strings", s);
      r.stop.push_back(s.get<std::string>());
    }
  } else {
    wrong_type("stop", "a string or an array of strings", *v);
  }
  std::erase_if(r.stop, [](const std::string& s) { return s.empty(); });
}

void parse_logprobs(const json& body, CompletionRequest& r) {
  if (!r.chat) {
    // Completions: logprobs is the number of alternatives, 0..5.
    if (auto n = integer(body, "logprobs")) {
      if (*n < 0 || *n > 5) throw bad_request("'logprobs' must be between 0 and 5", "logprobs");
      r.top_logprobs = static_cast<int>(*n);
    }
    return;
  }
  const bool on = boolean(body, "logprobs", false);
  const auto top = integer(body, "top_logprobs");
  if (top && (*top < 0 || *top > 20))
    throw bad_request("'top_logprobs' must be between 0 and 20", "top_logprobs");
  if (top && !on) throw bad_request("'top_logprobs' requires 'logprobs': true", "top_logprobs");
  if (on) r.top_logprobs = top ? static_cast<int>(*top) : 0;
}

// response_format: {"type": "text"}, {"type": "json_object"} or {"type": "json_schema", "json_schema":
// {"name": ..., "schema": {...}, "strict": ...}}. The schema is read again from the body as ordered JSON, as
// its properties are written in their declared order.
void parse_response_format(const json& body, const nlohmann::ordered_json& ordered_body,
                           CompletionRequest& r) {
  const json* rf = field(body, "response_format");
  if (!rf) return;
  if (!rf->is_object()) wrong_type("response_format", "an object", *rf);
  const json* type = field(*rf, "type");
  if (!type) throw bad_request("'response_format.type' is required", "response_format.type");
  if (!type->is_string()) wrong_type("response_format.type", "a string", *type);
  const std::string kind = type->get<std::string>();
  if (kind == "text") return;
  if (kind == "json_object") {
    r.grammar = std::make_shared<const sampling::Grammar>(sampling::json_object_grammar());
    return;
  }
  if (kind != "json_schema")
    throw bad_request("'response_format.type' must be text, json_object or json_schema, got '" + kind + "'",
                      "response_format.type");
  const json* js = field(*rf, "json_schema");
  if (!js) throw bad_request("'response_format.json_schema' is required", "response_format.json_schema");
  if (!js->is_object()) wrong_type("response_format.json_schema", "an object", *js);
  if (const json* name = field(*js, "name"); name && !name->is_string())
    wrong_type("response_format.json_schema.name", "a string", *name);
  // Output that matches the schema is what strict mode promises; it is enforced either way.
  if (const json* strict = field(*js, "strict"); strict && !strict->is_boolean())
    wrong_type("response_format.json_schema.strict", "a boolean", *strict);
  const json* schema = field(*js, "schema");
  const std::string param = "response_format.json_schema.schema";
  if (!schema) throw bad_request("'" + param + "' is required", param);
  if (!schema->is_object() && !schema->is_boolean()) wrong_type(param, "an object", *schema);
  const nlohmann::ordered_json& ordered = ordered_body.at("response_format").at("json_schema").at("schema");
  try {
    r.grammar = std::make_shared<const sampling::Grammar>(sampling::grammar_from_parsed_json_schema(ordered));
  } catch (const tandem::Error& e) {
    throw bad_request("'" + param + "' cannot be enforced: " + e.what(), param);
  }
}

// tools, tool_choice and parallel_tool_calls (chat). Parameters are read from the ordered body, as a schema's
// properties are written in their declared order.
void parse_tools(const json& body, const nlohmann::ordered_json& ordered_body, CompletionRequest& r,
                 ToolFormat format) {
  if (const json* tools = field(body, "tools")) {
    if (!tools->is_array()) wrong_type("tools", "an array", *tools);
    for (size_t i = 0; i < tools->size(); ++i) {
      const json& t = (*tools)[i];
      const std::string where = "tools[" + std::to_string(i) + "]";
      if (!t.is_object()) wrong_type(where, "an object", t);
      const std::string type = string_field(t, "type", where, false);
      if (!type.empty() && type != "function")
        throw bad_request("'" + where + ".type' must be function, got '" + type + "'", where + ".type");
      const json* fn = field(t, "function");
      if (!fn) throw bad_request("'" + where + ".function' is required", where + ".function");
      if (!fn->is_object()) wrong_type(where + ".function", "an object", *fn);
      ToolSpec spec;
      spec.name = string_field(*fn, "name", where + ".function", true);
      if (spec.name.empty())
        throw bad_request("'" + where + ".function.name' must not be empty", where + ".function.name");
      for (const ToolSpec& other : r.tools)
        if (other.name == spec.name)
          throw bad_request("'" + where + ".function.name' repeats the function '" + spec.name + "'",
                            where + ".function.name");
      spec.description = string_field(*fn, "description", where + ".function", false);
      if (const json* params = field(*fn, "parameters")) {
        if (!params->is_object()) wrong_type(where + ".function.parameters", "an object", *params);
        spec.parameters = ordered_body.at("tools").at(i).at("function").at("parameters");
      }
      r.tools.push_back(std::move(spec));
    }
    if (!r.tools.empty()) {
      r.tools_json = ordered_body.at("tools").dump();
      r.tool_choice = ToolChoice::kAuto;
    }
  }
  r.parallel_tool_calls = boolean(body, "parallel_tool_calls", true);
  const json* choice = field(body, "tool_choice");
  if (!choice) return;
  if (choice->is_string()) {
    const std::string c = choice->get<std::string>();
    if (c == "none")
      r.tool_choice = ToolChoice::kNone;
    else if (c == "auto" || c == "required")
      r.tool_choice = c == "auto" ? ToolChoice::kAuto : ToolChoice::kRequired;
    else
      throw bad_request(
          "'tool_choice' must be none, auto, required or {\"type\": \"function\", \"function\": "
          "{\"name\": ...}}, got '" +
              c + "'",
          "tool_choice");
  } else if (choice->is_object()) {
    const json* fn = field(*choice, "function");
    if (!fn || !fn->is_object())
      throw bad_request("'tool_choice.function' must be an object naming the function",
                        "tool_choice.function");
    r.tool_name = string_field(*fn, "name", "tool_choice.function", true);
    r.tool_choice = ToolChoice::kNamed;
  } else {
    wrong_type("tool_choice", "a string or an object", *choice);
  }
  if (r.tool_choice != ToolChoice::kNone && r.tools.empty())
    throw bad_request("'tool_choice' needs 'tools' to choose from", "tool_choice");
  if (r.tool_choice == ToolChoice::kRequired || r.tool_choice == ToolChoice::kNamed) {
    if (r.grammar)
      throw bad_request("'response_format' cannot be combined with a required or named 'tool_choice'",
                        "response_format");
    r.grammar = std::make_shared<const sampling::Grammar>(
        tool_call_grammar(r.tools, r.tool_choice == ToolChoice::kNamed ? r.tool_name : std::string(),
                          r.parallel_tool_calls, format));
  }
}

// Where the value being read sits, as the error messages name it: "messages[2].content", "logit_bias.42".
struct Frame {
  bool object = false;
  std::string key;   // objects: the current member's name
  size_t index = 0;  // arrays: the current element's index
  size_t next = 0;   // arrays: the index the next element gets
};

// A SAX pass that enforces ApiLimits' depth and element bounds and turns every parse error into a 400
// naming what is wrong and, where there is one, the field. Builds nothing; throws ApiError.
class ShapeCheck final : public json::json_sax_t {
 public:
  explicit ShapeCheck(const ApiLimits& limits) : limits_(limits) {}

  bool null() override { return value(); }
  bool boolean(bool) override { return value(); }
  bool number_integer(json::number_integer_t) override { return value(); }
  bool number_unsigned(json::number_unsigned_t) override { return value(); }
  bool number_float(json::number_float_t, const json::string_t&) override { return value(); }
  bool string(json::string_t&) override { return value(); }
  bool binary(json::binary_t&) override { return value(); }
  bool start_object(std::size_t) override { return open(true); }
  bool key(json::string_t& k) override {
    frames_.back().key = k;
    return true;
  }
  bool end_object() override { return close(); }
  bool start_array(std::size_t) override { return open(false); }
  bool end_array() override { return close(); }

  bool parse_error(std::size_t, const std::string& token, const json::exception& e) override {
    const std::string why = e.what();
    if (e.id == 406) {  // out_of_range: a number past the double range
      const std::string at = path(/*pending=*/true);
      const std::string what = at.empty() ? "the request body" : "'" + at + "'";
      throw bad_request(what + " is out of range: " + token + " does not fit a 64-bit float", at);
    }
    if (why.find("UTF-8") != std::string::npos || why.find("utf-8") != std::string::npos)
      throw bad_request("the request body is not valid UTF-8");
    throw bad_request("the request body is not valid JSON: " + why);
  }

 private:
  bool value() {
    if (++elements_ > limits_.max_json_elements)
      throw bad_request("the request body holds more than " + std::to_string(limits_.max_json_elements) +
                        " JSON values (the server's --max-json-elements)");
    if (!frames_.empty() && !frames_.back().object) frames_.back().index = frames_.back().next++;
    return true;
  }
  bool open(bool object) {
    value();
    if (frames_.size() >= static_cast<size_t>(limits_.max_json_depth))
      throw bad_request("the request body nests arrays and objects deeper than " +
                        std::to_string(limits_.max_json_depth) + " levels (the server's --max-json-depth)");
    frames_.push_back(Frame{object});
    return true;
  }
  bool close() {
    frames_.pop_back();
    return true;
  }
  // pending: the innermost array's element has not been counted yet (a parse error inside it).
  std::string path(bool pending) const {
    std::string p;
    for (size_t i = 0; i < frames_.size(); ++i) {
      const Frame& f = frames_[i];
      if (f.object) {
        if (!p.empty()) p += '.';
        p += f.key;
      } else {
        const bool last = i + 1 == frames_.size();
        p += '[';
        p += std::to_string(last && pending ? f.next : f.index);
        p += ']';
      }
    }
    return p;
  }

  const ApiLimits& limits_;
  std::vector<Frame> frames_;
  size_t elements_ = 0;
};

}  // namespace

void check_json_shape(const std::string& body, const ApiLimits& limits) {
  ShapeCheck check(limits);
  json::sax_parse(body, &check);
}

CompletionRequest parse_request(const std::string& body, bool chat, const ApiLimits& limits) {
  check_json_shape(body, limits);
  // The shape check saw every token: this parse cannot fail, and its tree is bounded by the limits.
  const json j = json::parse(body);
  if (!j.is_object())
    throw bad_request(std::string("the request body must be a JSON object, not ") + type_name(j));
  CompletionRequest r;
  r.chat = chat;
  auto model = j.find("model");
  if (model == j.end() || model->is_null()) throw bad_request("'model' is required", "model");
  if (!model->is_string()) wrong_type("model", "a string", *model);
  r.model = model->get<std::string>();
  if (r.model != limits.model_name)
    throw ApiError(
        404, "invalid_request_error",
        "The model '" + r.model + "' does not exist; this server serves '" + limits.model_name + "'", "model",
        "model_not_found");
  if (chat)
    parse_messages(j, r);
  else
    parse_prompt(j, r, limits);

  auto max_tokens = integer(j, "max_tokens");
  if (chat) {
    if (auto m = integer(j, "max_completion_tokens")) max_tokens = m;
  }
  if (max_tokens && *max_tokens <= 0)
    throw bad_request("'max_tokens' must be at least 1, got " + std::to_string(*max_tokens), "max_tokens");
  r.max_tokens = max_tokens;
  if (auto n = integer(j, "n"); n && *n != 1) throw bad_request("only n = 1 is supported", "n");
  r.temperature = number_in(j, "temperature", 1.0, 0.0, 2.0);
  r.top_p = number_in(j, "top_p", 1.0, 0.0, 1.0);
  if (r.top_p <= 0) throw bad_request("'top_p' must be greater than 0", "top_p");
  r.presence_penalty = number_in(j, "presence_penalty", 0.0, -2.0, 2.0);
  r.frequency_penalty = number_in(j, "frequency_penalty", 0.0, -2.0, 2.0);
  if (const json* s = field(j, "seed")) {
    if (!s->is_number_integer()) wrong_type("seed", "an integer", *s);
    r.seed = s->is_number_unsigned() ? s->get<uint64_t>() : static_cast<uint64_t>(s->get<int64_t>());
  }
  parse_stop(j, r);
  parse_logprobs(j, r);
  if (const json* u = field(j, "user")) {
    if (!u->is_string()) wrong_type("user", "a string", *u);
    r.user = u->get<std::string>();
  }
  const bool ordered = field(j, "response_format") || (chat && field(j, "tools"));
  const nlohmann::ordered_json ordered_body = ordered ? nlohmann::ordered_json::parse(body) : nullptr;
  parse_response_format(j, ordered_body, r);
  if (chat) parse_tools(j, ordered_body, r, limits.tool_format);
  r.reasoning_format = limits.reasoning_format;
  if (const json* rf = field(j, "reasoning_format")) {
    if (!rf->is_string()) wrong_type("reasoning_format", "a string", *rf);
    const std::optional<ReasoningFormat> f = reasoning_format_from(rf->get<std::string>());
    if (!f)
      throw bad_request("'reasoning_format' must be none or deepseek, got '" + rf->get<std::string>() + "'",
                        "reasoning_format");
    r.reasoning_format = *f;
  }
  r.stream = boolean(j, "stream", false);
  r.ignore_eos = boolean(j, "ignore_eos", false);
  if (const json* so = field(j, "stream_options")) {
    if (!so->is_object()) wrong_type("stream_options", "an object", *so);
    r.include_usage = boolean(*so, "include_usage", false);
  }
  return r;
}

json usage_json(const engine::Usage& u) {
  json j = {{"prompt_tokens", u.prompt_tokens},
            {"completion_tokens", u.completion_tokens},
            {"total_tokens", u.prompt_tokens + u.completion_tokens}};
  j["prompt_tokens_details"] = {{"cached_tokens", u.cached_tokens}};
  return j;
}

namespace {

json bytes_of(const std::string& s) {
  json b = json::array();
  for (unsigned char c : s) b.push_back(static_cast<int>(c));
  return b;
}

json logprobs_json(const CompletionRequest& req, const std::vector<Choice::Logprob>& lps) {
  if (req.chat) {
    json content = json::array();
    for (const auto& lp : lps) {
      json top = json::array();
      for (const auto& [tok, v] : lp.top)
        top.push_back({{"token", tok}, {"logprob", v}, {"bytes", bytes_of(tok)}});
      content.push_back({{"token", lp.token},
                         {"logprob", lp.logprob},
                         {"bytes", bytes_of(lp.token)},
                         {"top_logprobs", top}});
    }
    return {{"content", content}};
  }
  json tokens = json::array(), token_logprobs = json::array(), top = json::array(), offsets = json::array();
  for (const auto& lp : lps) {
    tokens.push_back(lp.token);
    token_logprobs.push_back(lp.logprob);
    json alt = json::object();
    for (const auto& [tok, v] : lp.top) alt[tok] = v;
    top.push_back(alt);
    offsets.push_back(lp.text_offset);
  }
  return {{"tokens", tokens},
          {"token_logprobs", token_logprobs},
          {"top_logprobs", top},
          {"text_offset", offsets}};
}

json tool_calls_json(const std::vector<ChatToolCall>& calls, bool indexed, size_t first_index = 0) {
  json out = json::array();
  for (size_t i = 0; i < calls.size(); ++i) {
    json c = {{"id", calls[i].id},
              {"type", "function"},
              {"function", {{"name", calls[i].name}, {"arguments", calls[i].arguments}}}};
    if (indexed) c["index"] = first_index + i;
    out.push_back(std::move(c));
  }
  return out;
}

json base_json(const CompletionRequest& req, const std::string& id, int64_t created, const char* object) {
  return {{"id", id},
          {"object", object},
          {"created", created},
          {"model", req.model},
          {"system_fingerprint", "tandem"}};
}

}  // namespace

json response_json(const CompletionRequest& req, const std::string& id, int64_t created, const Choice& c,
                   const engine::Usage& usage) {
  json j = base_json(req, id, created, req.chat ? "chat.completion" : "text_completion");
  json choice = {{"index", 0}, {"finish_reason", c.finish_reason}};
  choice["logprobs"] = c.want_logprobs ? logprobs_json(req, c.logprobs) : json(nullptr);
  if (req.chat) {
    choice["message"] = {{"role", "assistant"}, {"content", c.text}};
    if (!c.reasoning.empty()) choice["message"]["reasoning_content"] = c.reasoning;
    if (!c.tool_calls.empty()) {
      if (c.text.empty()) choice["message"]["content"] = nullptr;
      choice["message"]["tool_calls"] = tool_calls_json(c.tool_calls, false);
    }
  } else
    choice["text"] = c.text;
  j["choices"] = json::array({choice});
  j["usage"] = usage_json(usage);
  return j;
}

json chunk_json(const CompletionRequest& req, const std::string& id, int64_t created,
                const std::string& delta, const std::vector<Choice::Logprob>& logprobs, bool want_logprobs,
                const std::string& finish_reason, bool first, const std::string& reasoning) {
  json j = base_json(req, id, created, req.chat ? "chat.completion.chunk" : "text_completion");
  json choice = {{"index", 0}};
  choice["finish_reason"] = finish_reason.empty() ? json(nullptr) : json(finish_reason);
  choice["logprobs"] = want_logprobs && !logprobs.empty() ? logprobs_json(req, logprobs) : json(nullptr);
  if (req.chat) {
    json d = json::object();
    if (first) d["role"] = "assistant";
    if (!reasoning.empty()) d["reasoning_content"] = reasoning;
    if (!delta.empty() || first) d["content"] = delta;
    choice["delta"] = d;
  } else {
    choice["text"] = delta;
  }
  j["choices"] = json::array({choice});
  if (req.include_usage) j["usage"] = nullptr;
  return j;
}

json tool_calls_chunk_json(const CompletionRequest& req, const std::string& id, int64_t created,
                           const std::vector<ChatToolCall>& calls, size_t first_index) {
  json j = base_json(req, id, created, "chat.completion.chunk");
  json choice = {{"index", 0}, {"finish_reason", nullptr}, {"logprobs", nullptr}};
  choice["delta"] = {{"tool_calls", tool_calls_json(calls, true, first_index)}};
  j["choices"] = json::array({choice});
  if (req.include_usage) j["usage"] = nullptr;
  return j;
}

json usage_chunk_json(const CompletionRequest& req, const std::string& id, int64_t created,
                      const engine::Usage& usage) {
  json j = base_json(req, id, created, req.chat ? "chat.completion.chunk" : "text_completion");
  j["choices"] = json::array();
  j["usage"] = usage_json(usage);
  return j;
}

}  // namespace tandem::server
