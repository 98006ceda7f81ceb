// tokenizer.json's post-processors (see hf_pipeline.h) for a single sequence: the special tokens that
// BertProcessing, RobertaProcessing and TemplateProcessing put around it, read from the file, and put
// there; ByteLevel's (offsets only) is nothing here. Not pairs of sequences and not offsets.
#include "hf_pipeline.h"

namespace attn::hf {

void add_post_processor(const json& post, const std::string& where, Specials& before, Specials& after) {
  const std::string type = type_of(post, "a \"post_processor\"", where);
  Specials b, a;
  if (type.empty() || type == "ByteLevel") {  // ByteLevel trims offsets only, which attn does not keep
    return;
  } else if (type == "Sequence") {
    for (const json& item : items_of(post, "processors", where)) add_post_processor(item, where, before, after);
    return;
  } else if (type == "BertProcessing" || type == "RobertaProcessing") {
    for (const char* k : {"cls", "sep"}) {
      const json& p = post.contains(k) ? post[k] : json();
      ATTN_CHECK(p.is_array() && p.size() == 2 && p[0].is_string() && p[1].is_number_unsigned() &&
                     p[1].get<uint64_t>() <= uint64_t(kMaxTokenId),
                 "Expected \"", k, "\" [token, id] in the post-processor of ", where, ", but got ", brief(p),
                 " instead");
      (std::string(k) == "cls" ? b : a).emplace_back(p[0].get<std::string>(), p[1].get<int64_t>());
    }
  } else if (type == "TemplateProcessing") {
    const json& single = post.contains("single") ? post["single"] : json();
    ATTN_CHECK(single.is_array(), "Expected \"single\" in the post-processor of ", where, ", but got ",
               brief(single), " instead");
    const json none;
    auto at = [&](const json& j, const char* key) -> const json& {  // j[key], or null where j has none
      auto it = j.is_object() ? j.find(key) : j.end();
      return it == j.end() ? none : *it;
    };
    bool seen = false;
    for (const json& item : single) {
      if (!at(item, "Sequence").is_null()) {
        seen = true;
        continue;
      }
      const json& id = at(at(item, "SpecialToken"), "id");
      ATTN_CHECK(id.is_string(), "Expected Sequence or SpecialToken items (with a string \"id\") in the "
                 "post-processor of ", where, ", but got ", brief(item), " instead");
      const std::string name = id.get<std::string>();
      const json& st = at(at(post, "special_tokens"), name.c_str());
      const json &ids = at(st, "ids"), &tokens = at(st, "tokens");
      bool ok = ids.is_array() && tokens.is_array() && ids.size() == tokens.size();
      for (size_t i = 0; ok && i < ids.size(); ++i)
        ok = ids[i].is_number_unsigned() && ids[i].get<uint64_t>() <= uint64_t(kMaxTokenId) && tokens[i].is_string();
      ATTN_CHECK(ok, "Expected special_tokens[\"", name, "\"] with as many ids (integers in [0, ", kMaxTokenId,
                 "]) as tokens (strings) in the post-processor of ", where, ", but got ",
                 st.is_null() ? std::string("none") : brief(st), " instead");
      for (size_t i = 0; i < ids.size(); ++i)
        (seen ? a : b).emplace_back(tokens[i].get<std::string>(), ids[i].get<int64_t>());
    }
  } else {
    throw Error(cat("Expected a \"post_processor\" BertProcessing, RobertaProcessing, TemplateProcessing, ByteLevel, "
                    "Sequence or none in ", where, ", but got \"", type, "\" instead"));
  }
  before.insert(before.begin(), b.begin(), b.end());
  after.insert(after.end(), a.begin(), a.end());
}

Encoding post_process(const Specials& before, const Specials& after, const Encoding& body) {
  Encoding out;
  for (const auto& [tok, id] : before) out.ids.push_back(id), out.tokens.push_back(tok);
  out.ids.insert(out.ids.end(), body.ids.begin(), body.ids.end());
  out.tokens.insert(out.tokens.end(), body.tokens.begin(), body.tokens.end());
  for (const auto& [tok, id] : after) out.ids.push_back(id), out.tokens.push_back(tok);
  return out;
}

}  // namespace attn::hf
