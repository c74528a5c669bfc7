// The GPT example's training text (no LibTorch): byte-level tokens (vocabulary 256) from a text
// file, or a deterministic generated pseudo-text corpus. The trainer copies the corpus to the
// device once and cuts random windows of T+1 tokens there (gpt_trainer.cpp), so no loader sits on
// the step's critical path: this example is a compute benchmark (unless its host loader is on:
// TrainOptions::host_loader).
//
// Failure behaviour: load_text_corpus throws std::runtime_error naming the file when it cannot be
// read; both functions are pure otherwise. Thread-safety: none needed (no shared state).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace gpt_example {

// The bytes of a file, as tokens 0..255.
std::vector<uint8_t> load_text_corpus(const std::string& path);

// `bytes` bytes of English-looking pseudo-text, the same for the same seed on every machine:
// a fixed lexicon of 2,048 pseudo-words built from syllables, drawn with Zipf-like frequencies
// (p ~ 1 / rank), where with probability 1/2 a word is followed by its fixed "successor" word, so
// there is structure beyond letter and word frequencies to learn; sentences of 4-18 words with
// a capitalised first word, commas, and ". " / "? " / "! " endings; a blank line every 3-8
// sentences. splitmix64 is the only source of randomness.
std::vector<uint8_t> generate_corpus(size_t bytes, uint64_t seed);

}  // namespace gpt_example
