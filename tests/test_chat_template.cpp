// Chat templates: each family is recognised from its marker tokens and rendered as the model expects.
#include <gtest/gtest.h>

#include "tandem/server/chat_template.h"

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

}  // namespace
