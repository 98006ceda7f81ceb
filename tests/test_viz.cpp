// viz: PNG heatmaps are read back pixel by pixel; the HTML page's JSON is parsed back and compared
// bit for bit with the weights given; hostile tokens stay data; the page names no URL.
#include <cairo.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>

#include "attn/viz.h"
#include "test_util.h"

using namespace attn;
using namespace attn::viz;
using nlohmann::json;

namespace {

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("attn_test_viz_" + std::to_string(::getpid()) + "_" + name))
      .string();
}

std::vector<std::string> tokens(int64_t n, const std::string& prefix = "t") {
  std::vector<std::string> out;
  for (int64_t i = 0; i < n; ++i) out.push_back(prefix + std::to_string(i));
  return out;
}

// Rows of random softmax weights, shape as given (last dim: keys).
Tensor softmax_weights(Shape shape, uint32_t seed) {
  Tensor t(shape);
  std::mt19937 gen(seed);
  std::normal_distribution<float> n(0.f, 2.f);
  const int64_t S = shape.back();
  for (int64_t r = 0; r < t.numel() / S; ++r) {
    float* row = t.data() + r * S;
    float sum = 0;
    for (int64_t j = 0; j < S; ++j) sum += row[j] = std::exp(n(gen));
    for (int64_t j = 0; j < S; ++j) row[j] /= sum;
  }
  return t;
}

struct Png {
  int width = 0, height = 0;
  std::vector<uint32_t> px;  // 0x00RRGGBB
  // Luma in [0, 1] of the pixel at (x, y).
  double luma(double x, double y) const {
    uint32_t p = px[static_cast<size_t>(y) * width + static_cast<size_t>(x)];
    return (0.299 * ((p >> 16) & 255) + 0.587 * ((p >> 8) & 255) + 0.114 * (p & 255)) / 255.0;
  }
};

Png read_png(const std::string& path) {
  cairo_surface_t* s = cairo_image_surface_create_from_png(path.c_str());
  EXPECT_EQ(cairo_surface_status(s), CAIRO_STATUS_SUCCESS) << path;
  Png png;
  png.width = cairo_image_surface_get_width(s);
  png.height = cairo_image_surface_get_height(s);
  const int stride = cairo_image_surface_get_stride(s);
  const unsigned char* data = cairo_image_surface_get_data(s);
  for (int y = 0; y < png.height; ++y)
    for (int x = 0; x < png.width; ++x) {
      uint32_t p;
      std::memcpy(&p, data + y * stride + 4 * x, 4);
      png.px.push_back(p & 0xFFFFFF);
    }
  cairo_surface_destroy(s);
  return png;
}

// Luma at the centre of drawn cell (i, j) of panel p.
double cell_luma(const Png& png, const HeatmapLayout& lay, int64_t i, int64_t j, size_t p = 0) {
  return png.luma(lay.panels[p].x + (j + 0.5) * lay.cell, lay.panels[p].y + (i + 0.5) * lay.cell);
}

// Thresholds on the scale's ends: weight 0 is #f7fbff (luma 0.98), weight vmax is #08306b (luma 0.17).
constexpr double kLight = 0.9, kDark = 0.3;

std::string embedded_json(const std::string& html) {
  const std::string open = "<script type=\"application/json\" id=\"attn-data\">";
  size_t a = html.find(open);
  EXPECT_NE(a, std::string::npos);
  a += open.size();
  size_t b = html.find("</script>", a);
  EXPECT_NE(b, std::string::npos);
  return html.substr(a, b - a);
}

size_t count(const std::string& hay, const std::string& needle) {
  size_t n = 0;
  for (size_t p = hay.find(needle); p != std::string::npos; p = hay.find(needle, p + 1)) ++n;
  return n;
}

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

}  // namespace

TEST(VizTokens, InvalidUtf8IsRepairedAndBlanksAreVisible) {
  EXPECT_EQ(valid_utf8("ok \xC3\xA9"), "ok \xC3\xA9");              // é stays
  EXPECT_EQ(valid_utf8("a\xFF" "b"), "a\xEF\xBF\xBD" "b");           // stray byte -> U+FFFD
  EXPECT_EQ(valid_utf8("\xC3"), "\xEF\xBF\xBD");                     // truncated sequence
  EXPECT_EQ(valid_utf8("\xC0\xAF"), "\xEF\xBF\xBD\xEF\xBF\xBD");     // overlong '/'
  EXPECT_EQ(valid_utf8("\xED\xA0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // surrogate
  EXPECT_EQ(display_token("\n"), "\u23CE");
  EXPECT_EQ(display_token("a\tb"), "a\u21E5b");
  EXPECT_EQ(display_token("  "), "\u2423\u2423");
  EXPECT_EQ(display_token(" x"), " x");
  EXPECT_EQ(display_token(""), "\u2205");
  EXPECT_EQ(display_token("abcdef", 3), "abc\u2026");
  EXPECT_EQ(display_token("\xE4\xBD\xA0\xE5\xA5\xBD", 1), "\xE4\xBD\xA0\u2026");  // cut by code point
}

TEST(VizHeatmap, PngHasTheLayoutSizeAndIsNotBlank) {
  Tensor w = softmax_weights({6, 9}, 1);  // (L, S)
  const std::string path = temp_path("random.png");
  HeatmapLayout lay = write_heatmap_png(path, w, tokens(6, "q"), tokens(9, "k"), {.title = "layer 0 · head 3"});
  Png png = read_png(path);
  EXPECT_EQ(png.width, lay.width);
  EXPECT_EQ(png.height, lay.height);
  EXPECT_EQ(lay.rows, 6);
  EXPECT_EQ(lay.cols, 9);
  EXPECT_GE(lay.cell, 20);  // short input: big readable cells
  ASSERT_EQ(lay.panels.size(), 1u);
  // the matrix lies inside the picture
  EXPECT_GE(lay.panels[0].x, 0);
  EXPECT_LE(lay.panels[0].x + 9 * lay.cell, lay.width);
  EXPECT_LE(lay.panels[0].y + 6 * lay.cell, lay.height);
  // not blank: many colours, and a clearly dark cell where the row maximum is
  std::vector<uint32_t> colours = png.px;
  std::sort(colours.begin(), colours.end());
  EXPECT_GT(std::unique(colours.begin(), colours.end()) - colours.begin(), 30);
  float vmax = *std::max_element(w.data(), w.data() + w.numel());
  int64_t arg = std::max_element(w.data(), w.data() + w.numel()) - w.data();
  EXPECT_LT(cell_luma(png, lay, arg / 9, arg % 9), kDark) << "the largest weight " << vmax << " is darkest";
  std::filesystem::remove(path);
}

// The scale rule of every view: each query row relative to its largest weight. A causal matrix whose
// row 0 holds weight 1 (one key) and whose later rows spread thinly still shows every row's largest
// weight dark and its smallest light; an explicit vmax is one absolute scale instead.
TEST(VizHeatmap, EachRowIsDrawnRelativeToItsLargestWeight) {
  const int64_t n = 8;
  Tensor w({n, n});  // (L, S) causal: row i spreads over keys 0..i, its largest at key i
  for (int64_t i = 0; i < n; ++i) {
    float sum = 0;
    for (int64_t j = 0; j <= i; ++j) sum += (w.data()[i * n + j] = j == i ? 2.f : 1.f);
    for (int64_t j = 0; j <= i; ++j) w.data()[i * n + j] /= sum;
  }
  const std::string path = temp_path("rows.png");
  HeatmapLayout lay = write_heatmap_png(path, w, tokens(n, "t"));
  Png png = read_png(path);
  for (int64_t i = 1; i < n; ++i) {
    EXPECT_LT(cell_luma(png, lay, i, i), kDark) << "row " << i << "'s largest weight " << w.data()[i * n + i];
    EXPECT_GT(cell_luma(png, lay, i, 0), cell_luma(png, lay, i, i) + 0.2) << "row " << i;
  }
  lay = write_heatmap_png(path, w, tokens(n, "t"), {}, {.vmax = 1.f});  // absolute: row 7's 0.22 is pale
  EXPECT_GT(cell_luma(read_png(path), lay, n - 1, n - 1), 0.6);
  std::filesystem::remove(path);
}

TEST(VizHeatmap, IdentityIsDarkOnTheDiagonalAndLightElsewhere) {
  const int64_t n = 7;
  Tensor eye({n, n});
  for (int64_t i = 0; i < n; ++i) eye.data()[i * n + i] = 1.f;
  const std::string path = temp_path("identity.png");
  HeatmapLayout lay = write_heatmap_png(path, eye, {"The", "cat", "\"sat\"", "<on>", "the", "\n", "mat"});
  Png png = read_png(path);
  ASSERT_EQ(png.width, lay.width);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double y = cell_luma(png, lay, i, j);
      if (i == j) EXPECT_LT(y, kDark) << i << "," << j;
      else EXPECT_GT(y, kLight) << i << "," << j;
    }
  std::filesystem::remove(path);
}

TEST(VizHeatmap, StridedViewIsReadThroughItsStrides) {
  // The transpose of an upper-triangular ones matrix: dark exactly where i >= j.
  const int64_t n = 5;
  Tensor up({n, n});
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = i; j < n; ++j) up.data()[i * n + j] = 1.f;
  const std::string path = temp_path("strided.png");
  HeatmapLayout lay = write_heatmap_png(path, up.view().transpose(0, 1), tokens(n));
  Png png = read_png(path);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < n; ++j) EXPECT_EQ(cell_luma(png, lay, i, j) < kDark, i >= j) << i << "," << j;
  std::filesystem::remove(path);
}

TEST(VizHeatmap, LongInputIsCappedByMaxPooling) {
  const int64_t L = 1500, S = 1300;
  Tensor w({L, S});
  w.data()[1234 * S + 77] = 1.f;  // one peak must survive pooling
  const std::string path = temp_path("long.png");
  HeatmapOptions opt;
  opt.max_px = 512;
  HeatmapLayout lay = write_heatmap_png(path, w, tokens(L), tokens(S, "k"), opt);
  Png png = read_png(path);
  EXPECT_EQ(png.width, lay.width);
  EXPECT_EQ(png.height, lay.height);
  const int64_t pool = (L + opt.max_px - 1) / opt.max_px;  // 3 tokens per drawn cell
  EXPECT_EQ(lay.rows, (L + pool - 1) / pool);
  EXPECT_EQ(lay.cols, (S + pool - 1) / pool);
  EXPECT_LE(std::max(lay.rows, lay.cols) * lay.cell, opt.max_px);
  // labels of every few tokens add at most a few hundred pixels to the matrix
  EXPECT_LT(png.width, opt.max_px + 400);
  EXPECT_LT(png.height, opt.max_px + 400);
  EXPECT_LT(cell_luma(png, lay, 1234 / pool, 77 / pool), kDark);
  EXPECT_GT(cell_luma(png, lay, 0, 0), kLight);
  std::filesystem::remove(path);
}

TEST(VizHeatmap, HeadsGridShowsEachHeadInItsPanel) {
  const int64_t H = 5, L = 4, S = 6;
  Tensor w({H, L, S});  // head h puts all weight on key h
  for (int64_t h = 0; h < H; ++h)
    for (int64_t i = 0; i < L; ++i) w.data()[(h * L + i) * S + h] = 1.f;
  const std::string path = temp_path("grid.png");
  HeatmapLayout lay = write_heads_png(path, w, tokens(L), tokens(S, "k"), {.title = "layer 1 · all heads"});
  Png png = read_png(path);
  ASSERT_EQ(lay.panels.size(), size_t(H));
  EXPECT_EQ(png.width, lay.width);
  EXPECT_EQ(png.height, lay.height);
  for (int64_t h = 0; h < H; ++h)
    for (int64_t i = 0; i < L; ++i)
      for (int64_t j = 0; j < S; ++j) {
        double y = cell_luma(png, lay, i, j, h);
        if (j == h) EXPECT_LT(y, kDark) << h << ":" << i << "," << j;
        else EXPECT_GT(y, kLight) << h << ":" << i << "," << j;
      }
  std::filesystem::remove(path);
}

TEST(VizHeatmap, BadArgumentsNameTheShapes) {
  Tensor w({3, 5});
  const std::string path = temp_path("bad.png");
  try {
    write_heatmap_png(path, w, tokens(3));  // self-attention needs L == S
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("(3, 5)"), std::string::npos) << e.what();
  }
  EXPECT_THROW(write_heatmap_png(path, w, tokens(2), tokens(5)), Error);
  EXPECT_THROW(write_heatmap_png(path, Tensor({2, 3, 5}), tokens(3), tokens(5)), Error);
  EXPECT_THROW(write_heatmap_png("/nonexistent-dir/x.png", w, tokens(3), tokens(5)), Error);
  EXPECT_FALSE(std::filesystem::exists(path));
}

TEST(VizHtml, EmbedsExactlyTheWeightsGiven) {
  const int64_t L = 4, S = 6;  // cross-attention, layers with different head counts
  Tensor l0 = softmax_weights({2, L, S}, 7), l1 = softmax_weights({3, L, S}, 8);
  l1.data()[5] = 1e-30f;  // tiny and exact values survive as written
  l1.data()[6] = 0.1f;
  AttentionRecord rec{tokens(L, "q"), tokens(S, "k"), {l0, l1}, {}};
  json data = json::parse(embedded_json(render_html(rec, {.title = "cross"})));
  EXPECT_EQ(data["L"], L);
  EXPECT_EQ(data["S"], S);
  EXPECT_EQ(data["self"], false);
  EXPECT_TRUE(data["top_k"].is_null());
  EXPECT_EQ(data["query_tokens"], json(tokens(L, "q")));
  EXPECT_EQ(data["key_tokens"], json(tokens(S, "k")));
  EXPECT_EQ(data["layer_names"], json({"layer 0", "layer 1"}));
  const Tensor* layers[] = {&l0, &l1};
  ASSERT_EQ(data["layers"].size(), 2u);
  for (int l = 0; l < 2; ++l) {
    const Tensor& t = *layers[l];
    ASSERT_EQ(data["layers"][l].size(), size_t(t.size(0)));
    for (int64_t h = 0; h < t.size(0); ++h) {
      const json& head = data["layers"][l][h];
      EXPECT_FALSE(head.contains("k"));
      for (int64_t i = 0; i < L; ++i)
        for (int64_t j = 0; j < S; ++j)  // bit-exact: the shortest text that reads back as the same float
          EXPECT_EQ(head["w"][i][j].get<float>(), t.data()[(h * L + i) * S + j]) << l << h << i << j;
    }
  }
}

TEST(VizHtml, TopKKeepsTheLargestWeightsOfEachRowAndSaysSo) {
  const int64_t H = 2, L = 5, S = 100;  // S > 64: auto top_k = 16
  Tensor w = softmax_weights({H, L, S}, 3);
  w.data()[10] = w.data()[11] = 0.5f;  // a tie: both must be kept (they are the row's largest)
  AttentionRecord rec{tokens(L), tokens(S, "k"), {w}, {"decoder 0 · cross"}};
  json data = json::parse(embedded_json(render_html(rec)));
  ASSERT_EQ(data["top_k"], 16);
  EXPECT_EQ(data["layer_names"][0], "decoder 0 · cross");
  double kept_total = 0;
  for (int64_t h = 0; h < H; ++h)
    for (int64_t i = 0; i < L; ++i) {
      const float* row = w.data() + (h * L + i) * S;
      std::vector<int64_t> order(S);
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return row[a] > row[b]; });
      std::vector<int64_t> want(order.begin(), order.begin() + 16);
      std::sort(want.begin(), want.end());
      const json& head = data["layers"][0][h];
      EXPECT_EQ(head["k"][i].get<std::vector<int64_t>>(), want) << h << "," << i;
      double kept = 0, all = 0;
      for (int64_t t = 0; t < 16; ++t) {
        EXPECT_EQ(head["w"][i][t].get<float>(), row[want[t]]);
        kept += row[want[t]];
      }
      for (int64_t j = 0; j < S; ++j) all += row[j];
      kept_total += kept / all;
    }
  // kept_mass is written as a float: compare at float precision
  EXPECT_NEAR(data["kept_mass"].get<double>(), kept_total / (H * L), 1e-6);
  // an explicit top_k, and 0 for all
  EXPECT_EQ(json::parse(embedded_json(render_html(rec, {.top_k = 3})))["layers"][0][0]["k"][0].size(), 3u);
  EXPECT_TRUE(json::parse(embedded_json(render_html(rec, {.top_k = 0})))["top_k"].is_null());
}

// Rollout on numbers worked by hand: one head of 2 tokens per layer, so the mean is the head.
// Layer 0 A = [[1, 0], [0.5, 0.5]] -> Â = [[1, 0], [0.25, 0.75]]; layer 1 A = [[0, 1], [1, 0]] ->
// Â = [[0.5, 0.5], [0.5, 0.5]]; R_1 = Â_1 · Â_0 = [[0.625, 0.375], [0.625, 0.375]].
TEST(VizRollout, IsTheProductOfTheLayersWithTheResidual) {
  Tensor a0({1, 2, 2}), a1({1, 2, 2});
  const float w0[] = {1, 0, 0.5f, 0.5f}, w1[] = {0, 1, 1, 0};
  std::copy(w0, w0 + 4, a0.data());
  std::copy(w1, w1 + 4, a1.data());
  const std::vector<Tensor> r = attention_rollout({a0.view(), a1.view()});
  ASSERT_EQ(r.size(), 2u);
  const float want0[] = {1, 0, 0.25f, 0.75f}, want1[] = {0.625f, 0.375f, 0.625f, 0.375f};
  for (int k = 0; k < 4; ++k) {
    EXPECT_EQ(r[0].data()[k], want0[k]) << k;  // exact in binary
    EXPECT_EQ(r[1].data()[k], want1[k]) << k;
  }
  // heads are averaged first, and rows of random weights stay distributions through 3 layers
  Tensor h = softmax_weights({4, 5, 5}, 3);
  const std::vector<Tensor> r3 = attention_rollout({h.view(), h.view(), softmax_weights({2, 5, 5}, 4).view()});
  for (const Tensor& t : r3)
    for (int64_t i = 0; i < 5; ++i) {
      double sum = 0;
      for (int64_t j = 0; j < 5; ++j) sum += t.data()[i * 5 + j];
      EXPECT_NEAR(sum, 1.0, 1e-6);
    }
  Tensor mean({1, 5, 5});
  for (int64_t k = 0; k < 25; ++k)
    mean.data()[k] = (h.data()[k] + h.data()[25 + k] + h.data()[50 + k] + h.data()[75 + k]) / 4;
  const std::vector<Tensor> one = attention_rollout({mean.view()});
  for (int64_t k = 0; k < 25; ++k) EXPECT_NEAR(r3[0].data()[k], one[0].data()[k], 1e-6) << k;
  // cross-attention or mismatched layers cannot be rolled out
  EXPECT_NE(test::error_of([&] { attention_rollout({softmax_weights({2, 3, 4}, 1).view()}); }).find("(H, T, T)"),
            std::string::npos);
  EXPECT_THROW(attention_rollout({h.view(), softmax_weights({2, 4, 4}, 1).view()}), Error);
}

TEST(VizHtml, SaysItsScaleAndRollsOutSelfAttentionOnly) {
  Tensor w = softmax_weights({2, 3, 3}, 9);
  json self = json::parse(embedded_json(render_html({tokens(3), {}, {w, w}, {}})));
  EXPECT_EQ(self["scale"], "row");
  ASSERT_EQ(self["rollout"].size(), 2u);
  const std::vector<Tensor> r = attention_rollout({w.view(), w.view()});
  for (int l = 0; l < 2; ++l)
    for (int64_t i = 0; i < 3; ++i)
      for (int64_t j = 0; j < 3; ++j) EXPECT_EQ(self["rollout"][l]["w"][i][j].get<float>(), r[l].data()[i * 3 + j]);
  json abs = json::parse(embedded_json(render_html({tokens(3), {}, {w}, {}}, {.scale = "absolute"})));
  EXPECT_EQ(abs["scale"], "absolute");
  Tensor c = softmax_weights({2, 3, 4}, 9);
  EXPECT_TRUE(json::parse(embedded_json(render_html({tokens(3), tokens(4), {c}, {}})))["rollout"].is_null());
  EXPECT_THROW(render_html({tokens(3), {}, {w}, {}}, {.scale = "log"}), Error);
}

TEST(VizHtml, NamesNoUrlAndIsOneFile) {
  Tensor w = softmax_weights({3, 4, 4}, 5);
  std::string html = lower(render_html({tokens(4), {}, {w}, {}}));
  for (const char* bad : {"http://", "https://", "//cdn", "<link", "src=\"http", "src=", "@import", "url("})
    EXPECT_EQ(html.find(bad), std::string::npos) << bad;
  EXPECT_EQ(count(html, "<script"), 2u);  // the JSON data and the inline code
  EXPECT_EQ(count(html, "</script"), 2u);
  EXPECT_NE(html.find("content-security-policy"), std::string::npos);
}

TEST(VizHtml, HostileTokensStayData) {
  const std::vector<std::string> hostile = {"</script><script>alert(1)</script>", "\"quoted\"", "a\nb",
                                            "<!--", "&amp;", "back\\slash", "\xFF", "\u2028", "'", "<b>"};
  const int64_t n = static_cast<int64_t>(hostile.size());
  Tensor w = softmax_weights({1, n, n}, 9);
  const std::string path = temp_path("hostile.html");
  write_html(path, {hostile, {}, {w}, {"</title>"}}, {.title = "<title>&\"x\"</title>"});
  std::ifstream f(path, std::ios::binary);
  std::string html((std::istreambuf_iterator<char>(f)), {});
  std::filesystem::remove(path);
  std::string low = lower(html);
  EXPECT_EQ(count(low, "</script"), 2u) << "a token closed a script element";
  EXPECT_EQ(count(low, "<!--"), 0u);
  EXPECT_EQ(count(low, "<title>"), 1u);
  EXPECT_NE(html.find("<title>&lt;title&gt;&amp;&quot;x&quot;&lt;/title&gt;</title>"), std::string::npos);
  const std::string js = embedded_json(html);
  EXPECT_EQ(js.find('<'), std::string::npos);
  EXPECT_EQ(js.find('\n'), std::string::npos);
  json data = json::parse(js);  // throws on invalid JSON or UTF-8
  for (int64_t i = 0; i < n; ++i) EXPECT_EQ(data["query_tokens"][i].get<std::string>(), valid_utf8(hostile[i]));
  EXPECT_EQ(data["title"], "<title>&\"x\"</title>");
  EXPECT_EQ(data["layer_names"][0], "</title>");
}

TEST(VizHtml, BadRecordsNameTheShapes) {
  Tensor w({2, 3, 5});
  try {
    render_html({tokens(3), tokens(4), {w}, {}});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("(2, 3, 5)"), std::string::npos) << e.what();
  }
  EXPECT_THROW(render_html({tokens(3), tokens(5), {}, {}}), Error);                   // no layers
  EXPECT_THROW(render_html({tokens(3), tokens(5), {w}, {"a", "b"}}), Error);          // names != layers
  EXPECT_THROW(render_html({tokens(3), tokens(5), {w}, {}}, {.top_k = -2}), Error);
  EXPECT_THROW(write_html("/nonexistent-dir/x.html", {tokens(3), tokens(5), {w}, {}}), Error);
}

TEST(VizNonFinite, NanAndInfFlowThroughWithoutCrashing) {
  Tensor w = softmax_weights({1, 3, 3}, 11);
  w.data()[1] = NAN;
  w.data()[5] = std::numeric_limits<float>::infinity();
  const std::string path = temp_path("nan.png");
  HeatmapLayout lay = write_heatmap_png(path, w.view().select(0, 0), tokens(3));
  Png png = read_png(path);
  const size_t x = size_t(lay.panels[0].x + 1.5 * lay.cell), y = size_t(lay.panels[0].y + 0.5 * lay.cell);
  uint32_t nan_px = png.px[y * png.width + x];  // cell (0, 1)
  EXPECT_GT((nan_px >> 16) & 255, (nan_px & 255) + 40) << "NaN is drawn in red, off the blue scale";
  std::filesystem::remove(path);
  json data = json::parse(embedded_json(render_html({tokens(3), {}, {w}, {}}, {.top_k = 2})));
  json dense = json::parse(embedded_json(render_html({tokens(3), {}, {w}, {}})));
  EXPECT_TRUE(dense["layers"][0][0]["w"][0][1].is_null());
  EXPECT_TRUE(dense["layers"][0][0]["w"][1][2].is_null());
  // top-k ranks NaN last and +Inf first
  EXPECT_EQ(data["layers"][0][0]["k"][0].get<std::vector<int>>(), (std::vector<int>{0, 2}));
  EXPECT_TRUE(data["layers"][0][0]["w"][1][1].is_null());
}
