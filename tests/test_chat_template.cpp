// Chat templates: each family is recognised from its marker tokens and rendered as the model expects.
#include <gtest/gtest.h>

#include "tandem/server/chat_template.h"
#include "tandem/server/jinja/error.h"
#include "tandem/server/openai_api.h"

namespace {

using tandem::server::ChatFamily;
using tandem::server::ChatMessage;
using tandem::server::ChatTemplate;

const std::vector<ChatMessage> kChat = {
    {"system", "Be brief."}, {"user", "Hi"}, {"assistant", "Hello."}, {"user", "Bye"}};

TEST(ChatTemplate, DetectsFamilies) {
  struct Case {
    const char* source;
    ChatFamily family;
  };
  const Case cases[] = {
      {"", ChatFamily::kPlain},
      {"{{ messages }}", ChatFamily::kPlain},
      {"{% for m in messages %}{{'<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>'}}",
       ChatFamily::kChatML},
      {"{{ '<|start_header_id|>' + role + '<|end_header_id|>\\n\\n' }}", ChatFamily::kLlama3},
      {"{{ '<start_of_turn>' + role }}", ChatFamily::kGemma},
      {"{{'<|user|>\\n' + content + '<|end|>\\n'}}", ChatFamily::kPhi3},
      {"{{ bos_token + '[INST] ' + '<<SYS>>\\n' }}", ChatFamily::kLlama2},
      {"{{ '[INST] ' + content + ' [/INST]' }}", ChatFamily::kMistral},
  };
  for (const Case& c : cases) EXPECT_EQ(ChatTemplate::detect(c.source).family(), c.family) << c.source;
}

TEST(ChatTemplate, ChatMLWithDefaultSystem) {
  const ChatTemplate t = ChatTemplate::detect(
      "{% if messages[0]['role'] != 'system' %}{{ '<|im_start|>system\\nYou are a helpful "
      "assistant.<|im_end|>\\n' "
      "}}{% endif %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + "
      "'\\n'}}");
  EXPECT_EQ(t.default_system(), "You are a helpful assistant.");
  const std::vector<ChatMessage> user_only = {{"user", "Hi"}};
  EXPECT_EQ(t.render(user_only),
            "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
            "<|im_start|>assistant\n");
  EXPECT_EQ(t.render(kChat),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
            "Hello.<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n");
}

TEST(ChatTemplate, RendersEachFamily) {
  EXPECT_EQ(ChatTemplate(ChatFamily::kLlama3).render(kChat),
            "<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\nHello.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nBye<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
  EXPECT_EQ(ChatTemplate(ChatFamily::kLlama2).render(kChat),
            "[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi [/INST] Hello. </s><s>[INST] Bye [/INST]");
  EXPECT_EQ(ChatTemplate(ChatFamily::kMistral).render(kChat),
            "[INST] Be brief.\n\nHi [/INST]Hello.</s>[INST] Bye [/INST]");
  EXPECT_EQ(ChatTemplate(ChatFamily::kGemma).render(kChat),
            "<start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\nHello.<end_of_turn>\n"
            "<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n");
  EXPECT_EQ(ChatTemplate(ChatFamily::kPhi3).render(kChat),
            "<|system|>\nBe "
            "brief.<|end|>\n<|user|>\nHi<|end|>\n<|assistant|>\nHello.<|end|>\n<|user|>\nBye<|end|>\n"
            "<|assistant|>\n");
  const ChatTemplate plain(ChatFamily::kPlain);
  EXPECT_EQ(plain.render(kChat), "Be brief.\n\nUser: Hi\nAssistant: Hello.\nUser: Bye\nAssistant:");
  EXPECT_EQ(plain.stop_sequences(), std::vector<std::string>{"\nUser:"});
  EXPECT_THROW(plain.render({}), std::exception);
}

TEST(ChatTemplate, UsesTheModelsBosAndEos) {
  const ChatTemplate t = ChatTemplate::detect("[INST] <<SYS>>", "<BOS>", "<EOS>");
  EXPECT_EQ(t.render(std::vector<ChatMessage>{{"user", "a"}, {"assistant", "b"}, {"user", "c"}}),
            "[INST] a [/INST] b <EOS><BOS>[INST] c [/INST]");
}

// A template that never ends, or that cannot render a conversation, is a 400 for that request naming the
// cause; the server goes on.
TEST(ChatTemplate, RunawayAndBrokenTemplatesAre400) {
  const std::vector<ChatMessage> hi = {{"user", "Hi"}};
  struct Case {
    const char* source;
    const char* says;
  };
  const Case cases[] = {
      {"{% for a in range(100000) %}{% for b in range(100000) %}x{% endfor %}{% endfor %}", "StepLimitError"},
      {"{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "RecursionError"},
      {"{{ messages[0].content + 1 }}", "TypeError"},
      {"{{ raise_exception('Only user and assistant roles are supported') }}", "Only user and assistant"},
  };
  for (const Case& c : cases) {
    const ChatTemplate t = ChatTemplate::interpret(c.source);
    try {
      t.render(hi);
      ADD_FAILURE() << "rendered: " << c.source;
    } catch (const tandem::server::ApiError& e) {
      EXPECT_EQ(e.status, 400) << c.source;
      EXPECT_EQ(e.param, "messages") << c.source;
      EXPECT_NE(std::string(e.what()).find(c.says), std::string::npos) << c.source << ": " << e.what();
    }
  }
  // A template that does not parse is refused where it is given, with its line and column; a model file's
  // falls back to the family its markers show.
  EXPECT_THROW(ChatTemplate::interpret("{% for m in messages %}{{ m.content }}"),
               tandem::server::jinja::SyntaxError);
  std::string problem;
  const ChatTemplate fallback = ChatTemplate::load("<|im_start|>{% if %}", "<s>", "</s>", &problem);
  EXPECT_FALSE(fallback.interpreted());
  EXPECT_EQ(fallback.family(), ChatFamily::kChatML);
  EXPECT_NE(problem.find("line 1"), std::string::npos) << problem;
}

// An assistant turn that only calls tools has null content, as OpenAI sends it (templates test for none).
TEST(ChatTemplate, CallOnlyTurnHasNullContent) {
  const ChatTemplate t = ChatTemplate::interpret(
      "{% for m in messages %}{{ m.role }}:{% if m.content is none %}none{% else %}{{ m.content }}{% endif "
      "%};"
      "{% endfor %}");
  const std::vector<ChatMessage> chat = {{"user", "Hi", {}, {}, {}},
                                         {"assistant", "", {{"c1", "f", "{}"}}, {}, {}},
                                         {"assistant", "", {}, {}, {}}};
  EXPECT_EQ(t.render(chat), "user:Hi;assistant:none;assistant:;");
}

}  // namespace
