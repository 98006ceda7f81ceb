// tokenizer.json's model (see hf_pipeline.h): its vocabulary read from the file, and WordPiece applied as
// the `tokenizers` library's models/wordpiece does (greedy longest match first); BPE is hf_bpe.cpp. Not
// Unigram or WordLevel: refused by name.
#include <algorithm>

#include "attn/tokenizer.h"
#include "hf_pipeline.h"

namespace attn::hf {

Model Model::read(const json& model, const std::string& where) {
  Model m;
  const std::string mtype = type_of(model, "\"model\"", where);
  ATTN_CHECK(mtype == "WordPiece" || mtype == "BPE", "Expected a \"model\" of type WordPiece or BPE in ", where,
             ", but got \"", mtype, "\" instead");
  const std::string mw = cat("the ", mtype, " model of ", where);
  ATTN_CHECK(model.contains("vocab") && model["vocab"].is_object(), "Expected \"vocab\" (token -> id) in ", mw,
             ", but got none instead");
  for (const auto& [tok, id] : model["vocab"].items()) {
    ATTN_CHECK(id.is_number_unsigned() && id.get<uint64_t>() <= kMaxTokenId, "Expected the id of '", tok, "' in ",
               mw, " to be an integer in [0, ", kMaxTokenId, "], but got ", brief(id), " instead");
    m.vocab[tok] = id.get<int64_t>();
    m.longest = std::max(m.longest, size_t(code_points(tok)));
  }
  if (mtype == "BPE") {
    m.bpe.emplace(model, m.vocab, mw);
  } else {
    m.unk = field<std::string>(model, "unk_token", mw);
    m.prefix = field_or<std::string>(model, "continuing_subword_prefix", mw, "##");
    m.max_chars = field_or<int64_t>(model, "max_input_chars_per_word", mw, 100);
    auto unk = m.vocab.find(m.unk);
    ATTN_CHECK(unk != m.vocab.end(), "Expected the unk_token '", m.unk, "' in the vocabulary of ", mw,
               ", but got none instead");
    m.unk_id = unk->second;
  }
  return m;
}

// WordPiece: greedy longest match first from the start of the word; any part without a match makes the
// whole word [UNK], and so does a word longer than max_input_chars_per_word. Candidates longer than the
// longest token are not tried (they can't match): a word of n characters costs n · longest lookups, not
// n² (a file allowing words of 10^9 characters made one 64 KB word a minute's work).
void Model::wordpiece(const std::u32string& word, std::vector<int64_t>& ids) const {
  if (int64_t(word.size()) > max_chars) return ids.push_back(unk_id);
  std::vector<int64_t> pieces;
  for (size_t start = 0; start < word.size();) {
    int64_t found = -1;
    size_t end = std::min(word.size(), start + longest);
    for (; end > start; --end) {
      const std::string sub = (start > 0 ? prefix : "") + utf8_encode(word.substr(start, end - start));
      auto it = vocab.find(sub);
      if (it != vocab.end()) {
        found = it->second;
        break;
      }
    }
    if (found < 0) return ids.push_back(unk_id);
    pieces.push_back(found);
    start = end;
  }
  ids.insert(ids.end(), pieces.begin(), pieces.end());
}

void Model::tokenize(const std::string& word, std::vector<int64_t>& ids) const {
  if (!bpe) return wordpiece(utf8_decode(word), ids);
  bpe->tokenize(word, vocab, ids);
}

}  // namespace attn::hf
