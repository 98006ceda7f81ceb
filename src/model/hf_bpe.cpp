// BPE and GPT-2's byte-level alphabet (see hf_bpe.h), following the `tokenizers` library's
// models/bpe/model.rs (merge_word, tokenize_with_cache) and word.rs (merge_all) step by step: the same
// queue order (rank, then position), the same checks that skip a stale entry, so the same ids.
#include "hf_bpe.h"

#include <array>
#include <mutex>
#include <queue>

#include "attn/check.h"
#include "attn/tokenizer.h"

namespace attn::hf {

namespace {

struct ByteMap {
  std::array<std::string, 256> chars;
  std::unordered_map<char32_t, int> bytes;
  ByteMap() {
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      const char32_t c = printable ? char32_t(b) : char32_t(256 + n++);
      chars[size_t(b)] = utf8_encode(std::u32string(1, c));
      bytes[c] = b;
    }
  }
};

const ByteMap& byte_map() {
  static const ByteMap m;
  return m;
}

// The length of the valid UTF-8 sequence at s[i], or 0 with `bad` = the bytes of its maximal invalid
// subpart (at least 1): a lead byte followed by as many bytes as could still continue it.
size_t utf8_sequence(std::string_view s, size_t i, size_t& bad) {
  const auto u = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char b = u(i);
  bad = 1;
  if (b < 0x80) return 1;
  size_t n;
  unsigned char lo = 0x80, hi = 0xBF;  // the second byte's range (Unicode Table 3-7)
  if (b >= 0xC2 && b <= 0xDF) n = 2;
  else if (b >= 0xE0 && b <= 0xEF) {
    n = 3;
    if (b == 0xE0) lo = 0xA0;
    if (b == 0xED) hi = 0x9F;
  } else if (b >= 0xF0 && b <= 0xF4) {
    n = 4;
    if (b == 0xF0) lo = 0x90;
    if (b == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  for (size_t k = 1; k < n; ++k) {
    if (i + k >= s.size()) return 0;
    const unsigned char c = u(i + k);
    if (c < (k == 1 ? lo : 0x80) || c > (k == 1 ? hi : 0xBF)) return 0;
    bad = k + 1;
  }
  return n;
}

}  // namespace

const std::string& byte_char(unsigned char b) { return byte_map().chars[b]; }

int char_byte(char32_t c) {
  const auto& m = byte_map().bytes;
  auto it = m.find(c);
  return it == m.end() ? -1 : it->second;
}

std::string utf8_lossy(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    size_t bad = 1;
    const size_t n = utf8_sequence(s, i, bad);
    if (n) {
      out.append(s.substr(i, n));
      i += n;
    } else {
      out += "\xEF\xBF\xBD";  // U+FFFD for the maximal subpart
      i += bad;
    }
  }
  return out;
}

struct Bpe::Cache {
  std::mutex mutex;
  std::unordered_map<std::string, std::vector<int64_t>> words;
};

Bpe::Bpe(const json& model, const Vocab& vocab, const std::string& where) : cache_(std::make_shared<Cache>()) {
  auto opt = [&](const char* key, std::string& to) {
    auto it = model.find(key);
    if (it == model.end() || it->is_null()) return false;
    to = field<std::string>(model, key, where);
    return true;
  };
  has_unk_ = opt("unk_token", unk_);
  opt("continuing_subword_prefix", prefix_);
  opt("end_of_word_suffix", suffix_);
  fuse_unk_ = field_or<bool>(model, "fuse_unk", where, false);
  byte_fallback_ = field_or<bool>(model, "byte_fallback", where, false);
  ignore_merges_ = field_or<bool>(model, "ignore_merges", where, false);
  const double dropout = field_or<double>(model, "dropout", where, 0.0);
  ATTN_CHECK(dropout == 0.0, "Expected \"dropout\" null or 0 in ", where,
             " (BPE-dropout samples at random; attn gives the library's deterministic ids), but got ", dropout,
             " instead");

  auto it = model.find("merges");
  ATTN_CHECK(it != model.end() && it->is_array(), "Expected \"merges\" (a list) in ", where, ", but got ",
             it == model.end() ? std::string("none") : brief(*it), " instead");
  auto id_of = [&](const std::string& tok, size_t rank) {
    auto v = vocab.find(tok);
    ATTN_CHECK(v != vocab.end(), "Expected the merge ", rank + 1, " of ", where,
               " to be of vocabulary tokens, but got '", tok, "', which is not one, instead");
    return v->second;
  };
  uint32_t rank = 0;
  for (const json& m : *it) {
    std::string a, b;
    if (m.is_string()) {  // the legacy "a b" form (merges.txt's lines)
      const std::string line = m.get<std::string>();
      if (line.starts_with("#version")) continue;
      const size_t sp = line.find(' ');
      ATTN_CHECK(sp != std::string::npos && line.find(' ', sp + 1) == std::string::npos, "Expected merge ", rank + 1,
                 " of ", where, " to be two tokens \"a b\", but got ", brief(m), " instead");
      a = line.substr(0, sp);
      b = line.substr(sp + 1);
    } else {
      ATTN_CHECK(m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string(), "Expected merge ", rank + 1,
                 " of ", where, " to be a pair [a, b] of strings, but got ", brief(m), " instead");
      a = m[0].get<std::string>();
      b = m[1].get<std::string>();
    }
    const int64_t ia = id_of(a, rank), ib = id_of(b, rank);
    // the merged token: b loses the continuing_subword_prefix's length, as the library cuts it
    const int64_t merged = id_of(a + b.substr(std::min(prefix_.size(), b.size())), rank);
    merges_[uint64_t(ia) << 32 | uint64_t(ib)] = {rank, merged};  // a repeated pair: the later rank, as there
    ++rank;
  }
}

void Bpe::tokenize(const std::string& word, const Vocab& vocab, std::vector<int64_t>& out) const {
  if (word.empty()) return;
  if (ignore_merges_) {  // a word that is a token is that token, whatever the merges would make of it
    if (auto it = vocab.find(word); it != vocab.end()) return out.push_back(it->second);
  }
  constexpr size_t kCacheWordBytes = 256, kCacheWords = 10000;  // the library's MAX_LENGTH and capacity
  if (word.size() < kCacheWordBytes) {
    std::lock_guard<std::mutex> lock(cache_->mutex);
    if (auto it = cache_->words.find(word); it != cache_->words.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<int64_t> ids = merge_word(word, vocab);
  out.insert(out.end(), ids.begin(), ids.end());
  if (word.size() < kCacheWordBytes) {
    std::lock_guard<std::mutex> lock(cache_->mutex);
    if (cache_->words.size() < kCacheWords) cache_->words.emplace(word, std::move(ids));
  }
}

std::vector<int64_t> Bpe::merge_word(const std::string& w, const Vocab& vocab) const {
  struct Symbol {
    int64_t c;
    int64_t prev, next;  // indices, -1: none
    size_t len;          // bytes of the word it covers; 0: merged into its left neighbour
  };
  std::vector<Symbol> sym;
  auto add = [&](int64_t id, size_t len) {
    const int64_t n = int64_t(sym.size());
    if (n) sym.back().next = n;
    sym.push_back({id, n - 1, -1, len});
  };
  auto unk_id = [&] {
    auto it = vocab.find(unk_);
    ATTN_CHECK(it != vocab.end(), "Expected the unk_token '", unk_, "' in the BPE vocabulary, but got none instead");
    return it->second;
  };
  bool pending = false;  // an unk token not added yet (consecutive unknown characters fuse with fuse_unk)
  int64_t pending_id = 0;
  size_t pending_len = 0;
  size_t bad = 0;
  for (size_t i = 0; i < w.size();) {
    size_t n = utf8_sequence(w, i, bad);
    ATTN_CHECK(n > 0, "Expected a word of valid UTF-8, but got an invalid byte at offset ", i, " instead");
    std::string s = w.substr(i, n);
    const bool first = i == 0, last = i + n == w.size();
    i += n;
    if (!first) s = prefix_ + s;
    if (last) s += suffix_;
    if (auto it = vocab.find(s); it != vocab.end()) {
      if (pending) add(pending_id, pending_len), pending = false;
      add(it->second, n);
      continue;
    }
    if (byte_fallback_) {  // every byte of s as <0xXX>, if all are tokens
      std::vector<int64_t> bytes;
      for (unsigned char b : s) {
        static const char* kHex = "0123456789ABCDEF";
        auto it = vocab.find(std::string("<0x") + kHex[b >> 4] + kHex[b & 15] + ">");
        if (it == vocab.end()) break;
        bytes.push_back(it->second);
      }
      if (bytes.size() == s.size()) {
        for (int64_t id : bytes) add(id, 1);
        continue;
      }
    }
    if (!has_unk_) continue;  // no unk token: the library drops the character
    if (pending && fuse_unk_) {
      pending_len += n;
    } else {
      if (pending) add(pending_id, pending_len);
      pending = true, pending_id = unk_id(), pending_len = n;
    }
  }
  if (pending) add(pending_id, pending_len);

  // merge_all: a queue of (rank, position) pairs, lowest rank first, then leftmost
  struct Entry {
    uint32_t rank;
    int64_t pos, id;
    bool operator<(const Entry& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  auto merge_of = [&](int64_t a, int64_t b) -> const Merge* {
    auto it = merges_.find(uint64_t(a) << 32 | uint64_t(b));
    return it == merges_.end() ? nullptr : &it->second;
  };
  std::priority_queue<Entry> queue;
  for (size_t k = 0; k + 1 < sym.size(); ++k)
    if (const Merge* m = merge_of(sym[k].c, sym[k + 1].c)) queue.push({m->rank, int64_t(k), m->id});
  while (!queue.empty()) {
    const Entry top = queue.top();
    queue.pop();
    Symbol& cur = sym[size_t(top.pos)];
    if (cur.len == 0 || cur.next == -1) continue;  // merged away, or nothing to its right any more
    const Symbol right = sym[size_t(cur.next)];
    const Merge* m = merge_of(cur.c, right.c);
    if (!m || m->id != top.id) continue;  // a stale entry: the pair changed since it was queued
    const int64_t next_pos = cur.next;
    cur.c = top.id;
    cur.len += right.len;
    cur.next = right.next;
    sym[size_t(next_pos)].len = 0;
    if (right.next >= 0) sym[size_t(right.next)].prev = top.pos;
    if (cur.prev >= 0)
      if (const Merge* p = merge_of(sym[size_t(cur.prev)].c, cur.c)) queue.push({p->rank, cur.prev, p->id});
    if (cur.next >= 0)
      if (const Merge* q = merge_of(cur.c, sym[size_t(cur.next)].c)) queue.push({q->rank, top.pos, q->id});
  }
  std::vector<int64_t> ids;
  for (const Symbol& s : sym)
    if (s.len) ids.push_back(s.c);
  return ids;
}

}  // namespace attn::hf
