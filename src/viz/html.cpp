// The interactive attention page: one self-contained HTML file (inline CSS, JS and JSON data).
// Not a web app: no server, no URL of any kind (a CSP meta tag makes the browser refuse any request),
// no library. The JS and CSS live in view_template.h; this file checks the record, writes the JSON
// (weights in shortest round-trip form, tokens escaped for JSON inside HTML) and splices the page.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <fstream>
#include <limits>
#include <numeric>

#include "attn/file.h"
#include "attn/viz.h"
#include "colormap.h"
#include "view_template.h"

namespace attn::viz {
namespace {

// Auto top-k: all weights for up to this many keys, this many per row beyond.
constexpr int64_t kAutoAllKeys = 64, kAutoTopK = 16;

// A JSON string that is also safe inside <script>: no '<', '>' or '&' (so no "</script" or "<!--"),
// no raw control characters, U+2028/2029 escaped, invalid UTF-8 replaced by U+FFFD.
void put_string(std::string& out, const std::string& raw) {
  static constexpr char kHex[] = "0123456789abcdef";
  const std::string s = valid_utf8(raw);
  out += '"';
  for (size_t i = 0; i < s.size(); ++i) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    if (c == '"') out += "\\\"";
    else if (c == '\\') out += "\\\\";
    else if (c == '\n') out += "\\n";
    else if (c == '\t') out += "\\t";
    else if (c == '\r') out += "\\r";
    else if (c < 0x20 || c == '<' || c == '>' || c == '&' || c == 0x7F) {
      out += "\\u00";
      out += kHex[c >> 4];
      out += kHex[c & 15];
    } else if (c == 0xE2 && i + 2 < s.size() && s[i + 1] == '\x80' && (s[i + 2] == '\xA8' || s[i + 2] == '\xA9')) {
      out += s[i + 2] == '\xA8' ? "\\u2028" : "\\u2029";
      i += 2;
    } else {
      out += static_cast<char>(c);
    }
  }
  out += '"';
}

// Shortest text that parses back to the same float; NaN and +-Inf become null (JSON has no such numbers).
void put_number(std::string& out, float v) {
  if (!std::isfinite(v)) {
    out += "null";
    return;
  }
  char buf[32];
  auto res = std::to_chars(buf, buf + sizeof buf, v);
  out.append(buf, res.ptr);
}

template <typename T, typename Put>
void put_array(std::string& out, const std::vector<T>& xs, Put put) {
  out += '[';
  for (size_t i = 0; i < xs.size(); ++i) {
    if (i) out += ',';
    put(out, xs[i]);
  }
  out += ']';
}

void put_strings(std::string& out, const std::vector<std::string>& xs) { put_array(out, xs, put_string); }

std::vector<std::string> labels(const std::vector<std::string>& tokens) {
  std::vector<std::string> out;
  for (const auto& t : tokens) out.push_back(display_token(t, 24));
  return out;
}

std::string escape_html(const std::string& raw) {
  std::string out;
  for (char c : valid_utf8(raw)) {
    if (c == '<') out += "&lt;";
    else if (c == '>') out += "&gt;";
    else if (c == '&') out += "&amp;";
    else if (c == '"') out += "&quot;";
    else if (c == '\'') out += "&#39;";
    else out += c;
  }
  return out;
}

// One head (L, S) as JSON: {"w": [[...] x L]} with all weights, or with top_k > 0,
// {"k": [[key indices] x L], "w": [[weights] x L]}: each row's top_k largest (ties: lower index),
// in key order. Adds the fraction of each row's weight kept to `kept_mass`.
void put_head(std::string& out, View<const float> w, int64_t top_k, double& kept_mass) {
  const int64_t L = w.size(0), S = w.size(1);
  const auto at = [&](int64_t i, int64_t j) { return w.data[i * w.strides[0] + j * w.strides[1]]; };
  std::string idx_json = "[", w_json = "[";
  std::vector<int64_t> order(S);
  for (int64_t i = 0; i < L; ++i) {
    if (i) idx_json += ',', w_json += ',';
    w_json += '[';
    if (top_k == 0) {
      for (int64_t j = 0; j < S; ++j) {
        if (j) w_json += ',';
        put_number(w_json, at(i, j));
      }
    } else {
      // NaN ranks last, so the comparison stays a strict weak order
      const auto key = [&](int64_t j) {
        const float v = at(i, j);
        return std::isnan(v) ? -std::numeric_limits<float>::infinity() : v;
      };
      std::iota(order.begin(), order.end(), 0);
      std::partial_sort(order.begin(), order.begin() + top_k, order.end(), [&](int64_t a, int64_t b) {
        return key(a) > key(b) || (key(a) == key(b) && a < b);
      });
      std::sort(order.begin(), order.begin() + top_k);
      double all = 0, kept = 0;
      for (int64_t j = 0; j < S; ++j) all += std::isfinite(at(i, j)) ? at(i, j) : 0;
      idx_json += '[';
      for (int64_t t = 0; t < top_k; ++t) {
        if (t) idx_json += ',', w_json += ',';
        idx_json += std::to_string(order[t]);
        put_number(w_json, at(i, order[t]));
        kept += std::isfinite(at(i, order[t])) ? at(i, order[t]) : 0;
      }
      idx_json += ']';
      kept_mass += all > 0 ? kept / all : 1.0;  // a fully masked row keeps all of nothing
    }
    w_json += ']';
  }
  out += top_k == 0 ? "{\"w\":" + w_json + "]}" : "{\"k\":" + idx_json + "],\"w\":" + w_json + "]}";
}

}  // namespace

std::string render_html(const AttentionRecord& r, const HtmlOptions& opt) {
  const bool self = r.key_tokens.empty();
  const auto& keys = self ? r.query_tokens : r.key_tokens;
  const int64_t L = static_cast<int64_t>(r.query_tokens.size()), S = static_cast<int64_t>(keys.size());
  ATTN_CHECK(L > 0 && S > 0, "Expected at least one query and one key token, but got ", L, " and ", S, " instead");
  ATTN_CHECK(!r.layers.empty(), "Expected at least one layer of weights, but got none instead");
  ATTN_CHECK(r.layer_names.empty() || r.layer_names.size() == r.layers.size(), "Expected ", r.layers.size(),
             " layer_names (or none), but got ", r.layer_names.size(), " instead");
  for (size_t l = 0; l < r.layers.size(); ++l) {
    const auto& w = r.layers[l];
    ATTN_CHECK(w.rank() == 3 && w.size(0) > 0 && w.size(1) == L && w.size(2) == S, "Expected layers[", l,
               "] of shape (H, ", L, ", ", S, ") to match ", L, " query and ", S, " key tokens",
               self ? " (self-attention: no key_tokens given)" : "", ", but got ", to_string(w.shape), " instead");
  }
  ATTN_CHECK(opt.top_k >= -1, "Expected top_k >= -1 (-1: auto, 0: all), but got ", opt.top_k, " instead");
  ATTN_CHECK(opt.scale == "row" || opt.scale == "absolute", "Expected scale \"row\" or \"absolute\", but got \"",
             opt.scale, "\" instead");
  int64_t top_k = opt.top_k == -1 ? (S <= kAutoAllKeys ? 0 : kAutoTopK) : opt.top_k;
  if (top_k >= S) top_k = 0;

  std::string j = "{\"title\":";
  put_string(j, opt.title);
  j += ",\"self\":";
  j += self ? "true" : "false";
  j += ",\"L\":" + std::to_string(L) + ",\"S\":" + std::to_string(S) + ",\"query_tokens\":";
  put_strings(j, r.query_tokens);
  j += ",\"key_tokens\":";
  put_strings(j, keys);
  j += ",\"query_labels\":";
  put_strings(j, labels(r.query_tokens));
  j += ",\"key_labels\":";
  put_strings(j, labels(keys));
  std::vector<std::string> names = r.layer_names;
  for (size_t l = names.size(); l < r.layers.size(); ++l) names.push_back("layer " + std::to_string(l));
  j += ",\"layer_names\":";
  put_strings(j, names);
  j += ",\"colours\":[";
  for (int k = 0; k < kNumStops; ++k)
    j += (k ? ",[" : "[") + std::to_string(kColourStops[k][0]) + "," + std::to_string(kColourStops[k][1]) + "," +
         std::to_string(kColourStops[k][2]) + "]";
  j += "],\"layers\":[";
  double kept_mass = 0;
  int64_t rows = 0;
  for (size_t l = 0; l < r.layers.size(); ++l) {
    j += l ? ",[" : "[";
    for (int64_t h = 0; h < r.layers[l].size(0); ++h) {
      if (h) j += ',';
      put_head(j, r.layers[l].select(0, h), top_k, kept_mass);
      rows += L;
    }
    j += ']';
  }
  // Rollout, of self-attention only: every position's mix of the input tokens through layers 0..l.
  j += "],\"rollout\":";
  if (self) {
    j += '[';
    double unused = 0;
    const std::vector<Tensor> rollout = attention_rollout(r.layers);
    for (size_t l = 0; l < rollout.size(); ++l) {
      if (l) j += ',';
      put_head(j, rollout[l].view(), top_k, unused);
    }
    j += ']';
  } else {
    j += "null";
  }
  j += ",\"scale\":";
  put_string(j, opt.scale);
  j += ",\"top_k\":" + (top_k ? std::to_string(top_k) : "null") + ",\"kept_mass\":";
  if (top_k) put_number(j, static_cast<float>(kept_mass / rows));
  else j += "null";
  j += '}';

  return std::string("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n") +
         // No network, enforced: nothing but this file's own inline style and script may load.
         "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; "
         "style-src 'unsafe-inline'; script-src 'unsafe-inline'\">\n<title>" +
         escape_html(opt.title) + "</title>\n<style>" + kViewCss + "</style>\n</head>\n<body>" + kViewBody +
         "<script type=\"application/json\" id=\"attn-data\">" + j + "</script>\n<script>" + kViewJs +
         "</script>\n</body>\n</html>\n";
}

void write_html(const std::string& path, const AttentionRecord& record, const HtmlOptions& options) {
  check_path(path, "the HTML path");
  std::string page = render_html(record, options);
  std::ofstream f(path, std::ios::binary);
  ATTN_CHECK(f.good(), "Expected a writable path for the HTML page, but got '", path, "' instead");
  f << page;
  f.close();
  ATTN_CHECK(f.good(), "Expected to write ", page.size(), " bytes to '", path, "', but writing failed instead");
}

}  // namespace attn::viz
