// Hand-written matchers for the two most used pre-tokenizer regexes. They give the same pieces as the
// reference's own scanners (which define the results for these regexes), and run much faster than a regex.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace tandem::tokenizer {

// The exact regex strings these scanners stand for.
std::string pre_regex_gpt2();
std::string pre_regex_llama3();

// Split the code points [begin, end) of `cps` (with their CpFlags bits in `flags`) and append the length of
// each piece, in code points, to `pieces`. Neither looks outside [begin, end).
//
// GPT-2:   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
void scan_gpt2(const uint32_t* cps, const uint8_t* flags, size_t begin, size_t end,
               std::vector<uint32_t>& pieces);
// LLaMA-3: (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
// ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+
//          |\s+(?!\S)|\s+
void scan_llama3(const uint32_t* cps, const uint8_t* flags, size_t begin, size_t end,
                 std::vector<uint32_t>& pieces);

}  // namespace tandem::tokenizer
