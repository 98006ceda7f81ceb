// tokenizer.json's decoders (see hf_pipeline.h), each read from the file and applied as the `tokenizers`
// library's decoders/*.rs do: a chain of token lists (decode_chain), joined at the end. WordPiece,
// ByteLevel, Metaspace, ByteFallback, Fuse, Strip, Replace, BPEDecoder. Not CTC: refused by name.
#include <cctype>

#include "attn/tokenizer.h"
#include "hf_pipeline.h"

namespace attn::hf {

Decoder decoder_of(const json& d, const std::string& type, const std::string& dw) {
  using K = Decoder::Kind;
  static const std::pair<const char*, K> kPlain[] = {
      {"ByteLevel", K::byte_level}, {"ByteFallback", K::byte_fallback}, {"Fuse", K::fuse}};
  for (const auto& [name, kind] : kPlain)  // the ones without options
    if (type == name) return {kind};
  Decoder x{K::wordpiece};
  if (type == "WordPiece") {
    x.prefix = field_or<std::string>(d, "prefix", dw, "##");
    x.cleanup = field_or<bool>(d, "cleanup", dw, true);
  } else if (type == "Metaspace") {
    x.kind = K::metaspace;
    x.text = one_char(d, "replacement", dw, "\u2581");
    x.prepend_never = metaspace_scheme(d, dw) == PrependScheme::never;
  } else if (type == "Strip") {
    x.kind = K::strip;
    x.content = utf8_decode(one_char(d, "content", dw, " "))[0];
    x.start = size_t(std::max<int64_t>(0, field_or<int64_t>(d, "start", dw, 0)));
    x.stop = size_t(std::max<int64_t>(0, field_or<int64_t>(d, "stop", dw, 0)));
  } else if (type == "Replace") {
    x.kind = K::replace;
    x.pattern = pattern_of(d, dw);
    x.text = field<std::string>(d, "content", dw);
  } else if (type == "BPEDecoder") {
    x.kind = K::bpe;
    x.text = field_or<std::string>(d, "suffix", dw, "</w>");
  } else {
    throw Error(cat("Expected a \"decoder\" WordPiece, ByteLevel, Metaspace, ByteFallback, Fuse, Strip, Replace, "
                    "BPEDecoder, Sequence or none, but got ", dw, " instead"));
  }
  return x;
}

namespace {

// One decoder's decode_chain: tokens in, tokens out.
std::vector<std::string> decode_chain(const Decoder& d, std::vector<std::string> toks, RegexBudget& budget) {
  using K = Decoder::Kind;
  switch (d.kind) {
    case K::wordpiece:
      for (size_t i = 0; i < toks.size(); ++i) {
        std::string& tok = toks[i];
        if (i != 0) {
          if (tok.starts_with(d.prefix)) tok.erase(0, d.prefix.size());
          else tok = " " + tok;
        }
        if (d.cleanup) {  // the library's cleanup(), on each token with its leading space
          static const std::pair<const char*, const char*> kRules[] = {
              {" .", "."}, {" ?", "?"}, {" !", "!"}, {" ,", ","}, {" ' ", "'"}, {" n't", "n't"}, {" 'm", "'m"},
              {" do not", " don't"}, {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"}};
          for (const auto& [from, to] : kRules) {
            const std::string f = from, r = to;
            for (size_t p = tok.find(f); p != std::string::npos; p = tok.find(f, p + r.size()))
              tok.replace(p, f.size(), r);
          }
        }
      }
      return toks;
    case K::byte_level: {  // each token's characters back to bytes (a token with other characters: as it is)
      std::string bytes;
      for (const std::string& tok : toks) {
        std::string b;
        bool all = true;
        for (char32_t c : utf8_decode(tok)) {
          const int v = char_byte(c);
          if (v < 0) {
            all = false;
            break;
          }
          b += char(v);
        }
        bytes += all ? b : tok;
      }
      return {utf8_lossy(bytes)};
    }
    case K::metaspace:  // the replacement character back to a space, dropped in the first token
      for (size_t i = 0; i < toks.size(); ++i) {
        std::string out;
        for (size_t p = 0; p < toks[i].size();) {
          if (toks[i].compare(p, d.text.size(), d.text) == 0) {
            if (i != 0 || d.prepend_never) out += ' ';
            p += d.text.size();
          } else {
            out += toks[i][p++];
          }
        }
        toks[i] = std::move(out);
      }
      return toks;
    case K::byte_fallback: {  // runs of <0xXX> tokens become their text, or one U+FFFD per byte if not UTF-8
      std::vector<std::string> out;
      std::string run;
      size_t run_len = 0;
      auto flush = [&] {
        if (!run_len) return;
        if (utf8_lossy(run) == run) {
          out.push_back(run);
        } else {
          for (size_t i = 0; i < run_len; ++i) out.push_back("\xEF\xBF\xBD");
        }
        run.clear();
        run_len = 0;
      };
      for (std::string& tok : toks) {
        const bool hex = tok.size() == 6 && tok.starts_with("<0x") && tok.back() == '>' &&
                         std::isxdigit(uint8_t(tok[3])) && std::isxdigit(uint8_t(tok[4]));
        if (hex) {
          run += char(std::stoi(tok.substr(3, 2), nullptr, 16));
          ++run_len;
          continue;
        }
        flush();
        out.push_back(std::move(tok));
      }
      flush();
      return out;
    }
    case K::fuse: {
      std::string all;
      for (const std::string& tok : toks) all += tok;
      return {all};
    }
    case K::strip:  // up to `start` leading and `stop` trailing `content` characters of each token
      for (std::string& tok : toks) {
        const std::u32string u = utf8_decode(tok);
        size_t a = 0, b = u.size();
        while (a < d.start && a < b && u[a] == d.content) ++a;
        for (size_t i = 0; i < d.stop && b > a && u[b - 1] == d.content; ++i) --b;
        tok = utf8_encode(std::u32string_view(u).substr(a, b - a));
      }
      return toks;
    case K::replace:
      for (std::string& tok : toks) tok = replace_all(d.pattern, tok, d.text, budget);
      return toks;
    case K::bpe:  // end_of_word_suffix -> a space, none after the last token
      for (size_t i = 0; i < toks.size(); ++i) {
        const std::string by = i + 1 == toks.size() ? "" : " ";
        for (size_t p = toks[i].find(d.text); p != std::string::npos; p = toks[i].find(d.text, p + by.size()))
          toks[i].replace(p, d.text.size(), by);
      }
      return toks;
  }
  return toks;
}

}  // namespace

std::string decode_tokens(const std::vector<Decoder>& decoders, std::vector<std::string> toks) {
  std::string out;
  if (decoders.empty()) {
    for (size_t i = 0; i < toks.size(); ++i) out += (i ? " " : "") + toks[i];
    return out;
  }
  size_t bytes = 0;
  for (const std::string& tok : toks) bytes += tok.size();
  RegexBudget budget(bytes);
  for (const Decoder& d : decoders) toks = decode_chain(d, std::move(toks), budget);
  for (const std::string& tok : toks) out += tok;
  return out;
}

}  // namespace attn::hf
