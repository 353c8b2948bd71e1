// Chat templates: messages -> the prompt text a chat model was trained on.
//
// A GGUF file carries its template as Jinja source (tokenizer.chat_template). ChatTemplate::load renders that
// source with the Jinja interpreter (server/jinja), exactly as the model hub does; a file without a template,
// or one whose template does not parse, falls back to the families recognised by their marker tokens and
// rendered natively:
//   chatml   <|im_start|>{role}\n{content}<|im_end|>\n ... <|im_start|>assistant\n    (Qwen, many others;
//            a default system message written in the template, as Qwen's, is applied when none is given)
//   llama2   [INST] <<SYS>>\n{system}\n<</SYS>>\n\n{user} [/INST] {assistant} </s><s>[INST] ...
//   llama3   <|start_header_id|>{role}<|end_header_id|>\n\n{content}<|eot_id|> ... assistant header
//   mistral  [INST] {user} [/INST]{assistant}</s>[INST] ...   (a system message opens the first user turn)
//   gemma    <start_of_turn>{user|model}\n{content}<end_of_turn>\n ... <start_of_turn>model\n
//            (no system role: a system message opens the first user turn)
//   phi3     <|{role}|>\n{content}<|end|>\n ... <|assistant|>\n
// The BOS token that starts a conversation is not written (an interpreted template's leading bos_token is
// dropped): the tokenizer adds it when the model asks for
// one (tokenizer.ggml.add_bos_token), so it is never doubled. Later BOS / EOS tokens that a format places
// between turns are written as their text, which the tokenizer parses as special tokens.
//
// A model without a template, or with one of no known family, uses the plain transcript:
//   {system}\n\n            (when there is a system message)
//   User: {content}\n
//   Assistant: {content}\n
//   ...
//   Assistant:
// with "\nUser:" as an implicit stop sequence, so a base model does not write the next user turn.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace tandem::server {

namespace jinja {
class Template;
}

// A call an assistant message made (OpenAI's tool_calls[i]).
struct ChatToolCall {
  std::string id;
  std::string name;
  std::string arguments;  // JSON text, as OpenAI sends it
};

struct ChatMessage {
  std::string role;  // system | user | assistant | tool
  std::string content;
  std::vector<ChatToolCall> tool_calls;  // assistant
  std::string tool_call_id;              // tool: the call this message answers
  std::string name;                      // tool: the function's name, when given
};

enum class ChatFamily { kPlain, kChatML, kLlama2, kLlama3, kMistral, kGemma, kPhi3 };

class ChatTemplate {
 public:
  // Recognises the family of a tokenizer.chat_template source (empty: plain). bos / eos: the text of the
  // model's BOS and EOS tokens, written between turns by the llama2 and mistral formats.
  static ChatTemplate detect(std::string_view source, std::string bos = "<s>", std::string eos = "</s>");
  explicit ChatTemplate(ChatFamily family, std::string bos = "<s>", std::string eos = "</s>",
                        std::string default_system = {});
  // Renders `source` with the Jinja interpreter; throws jinja::SyntaxError (line and column) when it does not
  // parse.
  static ChatTemplate interpret(std::string_view source, std::string bos = "<s>", std::string eos = "</s>");
  // The template of a model file: interpreted when `source` parses, else (and when it is empty) the family
  // detect() recognises, with the syntax error in *problem when one is given.
  static ChatTemplate load(std::string_view source, std::string bos = "<s>", std::string eos = "</s>",
                           std::string* problem = nullptr);

  ChatFamily family() const { return family_; }
  // Whether the Jinja interpreter renders this template (name() is then "jinja").
  bool interpreted() const { return jinja_ != nullptr; }
  std::string_view name() const;
  const std::string& default_system() const { return default_system_; }
  // The Jinja source the template was made from (empty for a family without one): what the syntax of tool
  // calls and reasoning is read from.
  const std::string& source() const { return source_; }

  // The prompt for `messages`, ending where the assistant's reply starts. Throws tandem::Error when there is
  // no message, and an ApiError (400) when an interpreted template refuses the conversation (it raised, or
  // used a message in a way it cannot).
  // tools_json: the request's OpenAI `tools` array as JSON text (empty: none). An interpreted template gets
  // it as `tools`, and each assistant tool call with its arguments as an object when they parse (the form
  // most templates index into or serialise); a template that refuses objects (it concatenates the arguments
  // to strings, as DeepSeek R1's and Functionary's do) is rendered again with them as the JSON strings
  // OpenAI sends. An assistant message with tool calls and no text has null content, as OpenAI sends it.
  std::string render(std::span<const ChatMessage> messages, std::string_view tools_json = {}) const;
  // Whether the template renders tools, tool calls and tool results itself (an interpreted template that
  // reads `tools`); for others the caller writes them into the messages' text.
  bool renders_tools() const { return renders_tools_; }
  // Stop sequences the format implies beyond the model's end-of-generation tokens.
  std::vector<std::string> stop_sequences() const;

 private:
  std::string render_interpreted(std::span<const ChatMessage> messages, std::string_view tools_json,
                                 bool object_arguments) const;

  ChatFamily family_;
  std::string bos_, eos_, default_system_, source_;
  std::shared_ptr<const jinja::Template> jinja_;  // set when interpreted
  bool renders_tools_ = false;
};

}  // namespace tandem::server
