// The Jinja interpreter against the renderings the model hub's Jinja2 produces (../shared/chat), and its
// sandbox: step and depth limits, refused attributes, syntax errors that say where.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "tandem/server/chat_template.h"
#include "tandem/server/jinja/template.h"
#include "tandem/server/openai_api.h"
#include "test_util.h"

namespace {

using tandem::server::jinja::Json;
using tandem::server::jinja::RenderError;
using tandem::server::jinja::RenderOptions;
using tandem::server::jinja::SyntaxError;
using tandem::server::jinja::Template;

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in) << "cannot read " << path;
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Noon UTC on 7 Dec 2026: the day the shared cases were rendered with, in any time zone within 12 hours.
RenderOptions fixed_clock() {
  RenderOptions o;
  o.now = std::chrono::sys_days(std::chrono::year(2026) / 12 / 7) + std::chrono::hours(12);
  return o;
}

std::string render(const std::string& source, const Json& vars = Json::object(),
                   const RenderOptions& options = {}) {
  return Template::parse(source).render(vars, options);
}

// The message of the RenderError that rendering throws ("" when it renders).
std::string render_error(const std::string& source, const Json& vars = Json::object(),
                         const RenderOptions& options = {}) {
  try {
    render(source, vars, options);
  } catch (const RenderError& e) {
    return e.what();
  }
  return "";
}

const Json kVars = Json::parse(R"({"x": 3, "f": 2.5, "d": {"b": 1, "a": [1, 2.0, null, true, "q'\"\\"]},
  "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"},
               {"role": "assistant", "content": "a"}]})");

TEST(Jinja, RendersEveryPublicCaseByteForByte) {
  const std::string dir = tandem::testing::shared_path("chat");
  std::ifstream in(dir + "/cases.public.jsonl");
  ASSERT_TRUE(in) << "missing " << dir << "/cases.public.jsonl";
  std::map<std::string, Template> templates;
  std::string line;
  int rendered = 0, refused = 0;
  while (std::getline(in, line)) {
    const Json record = Json::parse(line);
    const std::string name = record.at("template").get<std::string>();
    SCOPED_TRACE(name + " / " + record.at("case").get<std::string>() + " / add_generation_prompt=" +
                 record.at("vars").value("add_generation_prompt", Json()).dump());
    auto it = templates.find(name);
    if (it == templates.end())
      it = templates.emplace(name, Template::parse(read_file(dir + "/templates/" + name))).first;
    if (record.contains("error")) {
      // The template refuses this conversation: so must the interpreter, with the same kind and message.
      const std::string want = record.at("error").get<std::string>();
      try {
        const std::string out = it->second.render(record.at("vars"), fixed_clock());
        ADD_FAILURE() << "rendered where Jinja2 raises " << want << ":\n" << out;
      } catch (const RenderError& e) {
        EXPECT_EQ(std::string(e.detail()), want);
        ++refused;
      }
      continue;
    }
    EXPECT_EQ(it->second.render(record.at("vars"), fixed_clock()), record.at("expected").get<std::string>());
    ++rendered;
  }
  EXPECT_EQ(rendered + refused, 160);
  EXPECT_GT(refused, 0);
  EXPECT_EQ(templates.size(), 10u);
}

TEST(Jinja, StepLimitStopsARunawayLoop) {
  const std::string source =
      "{% for a in range(1000) %}{% for b in range(1000) %}{% for c in range(1000) %}x{% endfor %}"
      "{% endfor %}{% endfor %}";
  RenderOptions small;
  small.max_steps = 100000;
  const std::string err = render_error(source, Json::object(), small);
  EXPECT_NE(err.find("StepLimitError"), std::string::npos) << err;
  EXPECT_NE(err.find("100000 steps"), std::string::npos) << err;
  // The default limit stops it too, well before a billion iterations.
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_NE(render_error(source).find("StepLimitError"), std::string::npos);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(20));
  // A loop within the limit runs to its end.
  EXPECT_EQ(render("{% for i in range(3) %}{{ i }}{% endfor %}", Json::object(), small), "012");
}

TEST(Jinja, EndlessRecursionIsRefused) {
  const std::string err = render_error("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}");
  EXPECT_NE(err.find("RecursionError"), std::string::npos) << err;
}

TEST(Jinja, OversizedStringsAreRefused) {
  const std::string err = render_error(
      "{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s + ns.s %}{% endfor %}");
  EXPECT_NE(err.find("MemoryError"), std::string::npos) << err;
  EXPECT_NE(render_error("{{ 'x' * 1000000000000 }}").find("MemoryError"), std::string::npos);
}

TEST(Jinja, DeepNestingIsRefusedNotACrash) {
  // A chain of 100000 operators would nest the tree as deep; evaluating or freeing it would overflow the
  // stack.
  std::string chain = "{{ 1";
  for (int i = 0; i < 100000; ++i) chain += " + 1";
  EXPECT_THROW(Template::parse(chain + " }}"), SyntaxError);
  // A value nested 200000 deep is freed without recursing once per level.
  EXPECT_EQ(
      render("{% set ns = namespace(l=[]) %}{% for i in range(200000) %}{% set ns.l = [ns.l] %}{% endfor %}"
             "done"),
      "done");
  // Walking a value that holds itself stops.
  EXPECT_NE(render_error("{% set ns = namespace() %}{% set ns.me = ns %}{{ ns }}").find("RecursionError"),
            std::string::npos);
  // Macros calling macros through deep expressions stop at the nesting limit.
  std::string deep = "{% macro f(n) %}{{ ";
  for (int i = 0; i < 90; ++i) deep += "-";
  deep += "f(n + 1)|length }}{% endmacro %}{{ f(0) }}";
  EXPECT_NE(render_error(deep).find("RecursionError"), std::string::npos);
}

TEST(Jinja, RefusesAttributeAccessOutsideTheData) {
  for (const char* source :
       {"{{ messages.__class__ }}", "{{ ''.__class__.__mro__ }}", "{{ x.__add__(1) }}",
        "{{ messages[0]._private }}", "{{ raise_exception.__globals__ }}", "{{ namespace.__init__ }}"}) {
    const std::string err = render_error(source, kVars);
    EXPECT_NE(err.find("SecurityError"), std::string::npos) << source << " gave: " << err;
  }
  // The sandbox is immutable: methods that would change the data are refused.
  for (const char* source : {"{{ messages.append(1) }}", "{{ d.update({'b': 2}) }}", "{{ d.pop('b') }}"}) {
    const std::string err = render_error(source, kVars);
    EXPECT_NE(err.find("SecurityError"), std::string::npos) << source << " gave: " << err;
  }
  // What the data holds stays reachable.
  EXPECT_EQ(render("{{ messages[1].role }} {{ d.b }} {{ d['a'][1] }} {{ 'a,b'.split(',') }}", kVars),
            "user 1 2.0 ['a', 'b']");
}

TEST(Jinja, SyntaxErrorsNameLineAndColumn) {
  struct Case {
    const char* source;
    int line, column;
    const char* says;
  };
  const Case cases[] = {
      {"Hello\n{% if x %}\n  {{ 1 + }}\n{% endif %}", 3, 10, "expected an expression"},
      {"{% for m in messages %}\n{{ m }}\n", 2, 8, "inside the block opened at line 1; expected 'endfor'"},
      {"line\n  {{ x|nosuchfilter }}", 2, 8, "unknown filter 'nosuchfilter'"},
      {"{{ x is nosuchtest }}", 1, 9, "unknown test 'nosuchtest'"},
      {"\n\n{% frobnicate %}", 3, 4, "unknown tag 'frobnicate'"},
      {"{{ 'unterminated }}", 1, 4, "never closed"},
      {"a\n\n   {# no end", 3, 4, "never closed with '#}'"},
      {"{{ (1 + 2 }}", 1, 11, "unexpected '}', expected ')'"},
      {"{% include 'other.jinja' %}", 1, 4, "not supported"},
      {"{% break %}", 1, 4, "outside a for loop"},
      {"{{ x ? y }}", 1, 6, "unexpected character '?'"},
  };
  for (const Case& c : cases) {
    try {
      Template::parse(c.source);
      ADD_FAILURE() << "parsed: " << c.source;
    } catch (const SyntaxError& e) {
      EXPECT_EQ(e.line(), c.line) << c.source << " -> " << e.what();
      EXPECT_EQ(e.column(), c.column) << c.source << " -> " << e.what();
      EXPECT_NE(std::string(e.what()).find(c.says), std::string::npos) << c.source << " -> " << e.what();
      EXPECT_NE(std::string(e.what()).find("line " + std::to_string(c.line)), std::string::npos) << e.what();
    }
  }
}

TEST(Jinja, RenderErrorsNameTheirLine) {
  const std::string err = render_error("{{ 'a' }}\n{{ 'b' + d }}", kVars);
  EXPECT_NE(err.find("TypeError: can only concatenate str (not \"dict\") to str"), std::string::npos) << err;
  EXPECT_NE(err.find("line 2"), std::string::npos) << err;
  EXPECT_EQ(render_error("{{ raise_exception('no system role, please') }}"),
            "TemplateError: no system role, please (template line 1, column 4)");
}

TEST(Jinja, WhitespaceControlMatchesTheHub) {
  // trim_blocks drops the newline after a block tag, lstrip_blocks the indentation before one; "-" strips
  // all whitespace on its side, "+" keeps the indentation. Expected texts are Jinja2's.
  EXPECT_EQ(
      render("  {% if x > 2 %}\n    big\n  {% else %}\n    small\n  {% endif %}\n  {{- ' after' }}\n", kVars),
      "    big\n after");
  EXPECT_EQ(render("{# comment #}\n  {#- stripped comment -#}\ntext {{ x }}   \n{%- if true %}\n yes\n"
                   "{%+ if true %}keep{% endif %}\n{% endif %}\n",
                   kVars),
            "text 3 yes\nkeep");
  EXPECT_EQ(render("{% raw %}{{ not evaluated }}{% endraw %}"), "{{ not evaluated }}");
  EXPECT_EQ(render("a\r\nb\n"), "a\nb");  // newlines normalised, one trailing newline dropped
}

TEST(Jinja, ValuesBehaveAsInPython) {
  EXPECT_EQ(
      render("{{ f }}|{{ 1/3 }}|{{ 7//2 }}|{{ -7//2 }}|{{ -7 % 3 }}|{{ 1e20 }}|{{ 0.00001 }}|{{ 1e16 }}",
             kVars),
      "2.5|0.3333333333333333|3|-4|2|1e+20|1e-05|1e+16");
  EXPECT_EQ(
      render("{{ d|tojson }}|{{ d|tojson(indent=2) }}|{{ d }}", kVars),
      "{\"b\": 1, \"a\": [1, 2.0, null, true, \"q'\\\"\\\\\"]}|{\n  \"b\": 1,\n  \"a\": [\n    1,\n    2.0,\n"
      "    null,\n    true,\n    \"q'\\\"\\\\\"\n  ]\n}|{'b': 1, 'a': [1, 2.0, None, True, 'q\\'\"\\\\']}");
  EXPECT_EQ(
      render("{{ 'h\u00e9llo'[1] }}|{{ 'h\u00e9llo'|length }}|{{ 'abcdef'[::-2] }}|{{ ' a  b '.split() }}|"
             "{{ 'a-b-c'.rsplit('-', 1) }}|{{ '\u00e9\u2028\x01'|tojson }}"),
      "\u00e9|5|fdb|['a', 'b']|['a-b', 'c']|\"\u00e9\u2028\\u0001\"");
  EXPECT_EQ(
      render("{% for m in messages if m.role != 'system' %}{{ loop.index }}/{{ loop.length }}{{ m.role }}"
             "{{ loop.previtem.role if loop.previtem }}{% if not loop.last %},{% endif %}{% endfor %}",
             kVars),
      "1/2user,2/2assistantuser");
  EXPECT_EQ(render("{% macro tag(name, close=true) %}<{{ name }}>{% if close %}</{{ name }}>{% endif %}"
                   "{% endmacro %}{{ tag('a') }}{{ tag('b', close=false) }}{{ d|items|list }}",
                   kVars),
            "<a></a><b>[('b', 1), ('a', [1, 2.0, None, True, 'q\\'\"\\\\'])]");
  EXPECT_EQ(
      render("{% set ns = namespace(n=0) %}{% for i in range(4) %}{% if i == 1 %}{% continue %}{% endif %}"
             "{% if i == 3 %}{% break %}{% endif %}{% set ns.n = ns.n + 10 %}{% endfor %}{{ ns.n }}"),
      "20");
}

TEST(Jinja, FiltersFallBackAndRoundAsPython) {
  // Defaults passed by the filter itself (not by the template) must survive the call.
  EXPECT_EQ(render("{{ 'x'|int }}|{{ 'x'|int(7) }}|{{ 'x'|float }}|{{ '0x1A'|int(0, 16) }}|{{ ' 7 '|int }}"),
            "0|7|0.0|26|7");
  EXPECT_EQ(render("{{ 17|round }}|{{ 2.675|round(2) }}|{{ 2.5|round }}|{{ 3.5|round }}|{{ "
                   "2.1|round(method='ceil') }}"),
            "17|2.67|2.0|4.0|3.0");
}

TEST(Jinja, UndefinedFailsOnlyWhenUsed) {
  EXPECT_EQ(
      render("[{{ nothing }}][{{ nothing|length }}][{{ nothing is defined }}][{{ d.zz is defined }}]", kVars),
      "[][0][False][False]");
  EXPECT_EQ(render_error("{{ 'a' + d.description }}", kVars),
            "UndefinedError: 'dict object' has no attribute 'description' (template line 1, column 8)");
  EXPECT_NE(render_error("{{ nothing.attr }}").find("UndefinedError: 'nothing' is undefined"),
            std::string::npos);
}

TEST(Jinja, StrftimeNowReadsTheGivenClock) {
  EXPECT_EQ(render("{{ strftime_now('%d %b %Y') }}", Json::object(), fixed_clock()), "07 Dec 2026");
  EXPECT_FALSE(render("{{ strftime_now('%Y') }}").empty());
}

TEST(Jinja, TemplateRenderCommandWritesOneLinePerInput) {
  const std::string dir = ::testing::TempDir();
  const std::string tmpl = dir + "/jinja_cli.jinja";
  const std::string input = dir + "/jinja_cli.jsonl";
  std::ofstream(tmpl) << "{{ greeting }}, {{ messages[0].content }}{{ raise_exception('no') if fail }}";
  std::ofstream(input) << "{\"greeting\": \"Hi\", \"messages\": [{\"content\": \"\u00e9\\n\"}]}\n"
                       << "{\"fail\": true, \"messages\": [{}]}\n"
                       << "[1, 2]\n"
                       << "not json\n";
  const auto [out, status] = tandem::testing::run_command(
      std::string(TANDEM_BINARY) + " template render --template " + tmpl + " < " + input);
  ASSERT_EQ(status, 0) << out;
  std::istringstream lines(out);
  std::string line;
  std::vector<Json> got;
  while (std::getline(lines, line)) got.push_back(Json::parse(line));
  ASSERT_EQ(got.size(), 4u) << out;
  EXPECT_EQ(got[0], "Hi, \u00e9\n");
  EXPECT_EQ(got[1].at("error").get<std::string>().rfind("TemplateError: no", 0), 0u) << got[1];
  EXPECT_NE(got[2].at("error").get<std::string>().find("not a JSON object"), std::string::npos) << got[2];
  EXPECT_NE(got[3].at("error").get<std::string>().find("not valid JSON"), std::string::npos) << got[3];
  // A template that does not parse is reported once, with its line and column, and the command fails.
  std::ofstream(tmpl) << "ok\n{% if %}";
  const auto [bad_out, bad_status] = tandem::testing::run_command(
      std::string(TANDEM_BINARY) + " template render --template " + tmpl + " < " + input + " 2>&1");
  EXPECT_NE(bad_status, 0);
  EXPECT_NE(bad_out.find("line 2, column 7"), std::string::npos) << bad_out;
}

TEST(Jinja, ChatTemplateRendersTheModelsOwnTemplate) {
  using tandem::server::ChatMessage;
  using tandem::server::ChatTemplate;
  const std::string dir = tandem::testing::shared_path("chat/templates");
  const std::string source = read_file(dir + "/meta-llama-Llama-3.1-8B-Instruct.jinja");
  const ChatTemplate chat = ChatTemplate::load(source, "<|begin_of_text|>", "<|eot_id|>");
  ASSERT_TRUE(chat.interpreted());
  EXPECT_EQ(chat.name(), "jinja");
  EXPECT_TRUE(chat.stop_sequences().empty());
  const std::vector<ChatMessage> messages = {{"system", "Be brief. "}, {"user", "Hi"}};
  // The interpreter's rendering, less the leading BOS that the tokenizer adds itself.
  const Json vars = {
      {"messages", {{{"role", "system"}, {"content", "Be brief. "}}, {{"role", "user"}, {"content", "Hi"}}}},
      {"bos_token", "<|begin_of_text|>"},
      {"eos_token", "<|eot_id|>"},
      {"add_generation_prompt", true}};
  const std::string full = Template::parse(source).render(vars);
  ASSERT_EQ(full.rfind("<|begin_of_text|>", 0), 0u);
  EXPECT_EQ(chat.render(messages), full.substr(std::string("<|begin_of_text|>").size()));
  EXPECT_NE(chat.render(messages).find(
                "Be brief.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"),
            std::string::npos);
}

TEST(Jinja, ChatTemplateRefusalIsABadRequest) {
  using tandem::server::ChatMessage;
  using tandem::server::ChatTemplate;
  const std::string dir = tandem::testing::shared_path("chat/templates");
  const ChatTemplate chat =
      ChatTemplate::load(read_file(dir + "/mistralai-Mistral-Nemo-Instruct-2407.jinja"));
  ASSERT_TRUE(chat.interpreted());
  const std::vector<ChatMessage> two_users = {{"user", "a"}, {"user", "b"}};
  try {
    chat.render(two_users);
    ADD_FAILURE() << "rendered a conversation the template refuses";
  } catch (const tandem::server::ApiError& e) {
    EXPECT_EQ(e.status, 400);
    EXPECT_NE(std::string(e.what()).find("roles must alternate"), std::string::npos) << e.what();
  }
}

TEST(Jinja, ChatTemplateFallsBackToTheRecognisedFamilies) {
  using tandem::server::ChatFamily;
  using tandem::server::ChatTemplate;
  EXPECT_FALSE(ChatTemplate::load("").interpreted());
  EXPECT_EQ(ChatTemplate::load("").family(), ChatFamily::kPlain);
  std::string problem;
  const ChatTemplate broken =
      ChatTemplate::load("{% for m in messages %}<|im_start|>{{ m.content }}", "<s>", "</s>", &problem);
  EXPECT_FALSE(broken.interpreted());
  EXPECT_EQ(broken.family(), ChatFamily::kChatML);
  EXPECT_NE(problem.find("line 1"), std::string::npos) << problem;
  EXPECT_THROW(ChatTemplate::interpret("{% if %}"), SyntaxError);
}

}  // namespace
