// Attention heatmaps as PNG with Cairo: one head (L, S), or all heads of a layer in a grid.
// Not a plotting library: one fixed layout (title, token labels, cells as rectangles, colour bar)
// and one colour scale (colormap.h). Text uses Cairo's toy API, fonts from fontconfig (DejaVu Sans).
#include <cairo.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <memory>
#include <vector>

#include "attn/file.h"
#include "attn/viz.h"
#include "colormap.h"

namespace attn::viz {
namespace {

constexpr const char* kFont = "DejaVu Sans";
constexpr double kMargin = 16, kGap = 20, kBarWidth = 14, kTitleSize = 15, kSmallSize = 11;

using Surface = std::unique_ptr<cairo_surface_t, decltype(&cairo_surface_destroy)>;
using Context = std::unique_ptr<cairo_t, decltype(&cairo_destroy)>;

struct Rgb { double r, g, b; };

// t in [0, 1] -> colour on the scale; NaN -> a red that is on no scale.
Rgb colour_at(float t) {
  if (std::isnan(t)) return {0.85, 0.35, 0.35};
  double x = std::clamp(static_cast<double>(t), 0.0, 1.0) * (kNumStops - 1);
  int k = std::min(static_cast<int>(x), kNumStops - 2);
  double a = x - k;
  const uint8_t* lo = kColourStops[k];
  const uint8_t* hi = kColourStops[k + 1];
  return {((1 - a) * lo[0] + a * hi[0]) / 255, ((1 - a) * lo[1] + a * hi[1]) / 255,
          ((1 - a) * lo[2] + a * hi[2]) / 255};
}

void set_font(cairo_t* cr, double size, bool bold = false) {
  cairo_select_font_face(cr, kFont, CAIRO_FONT_SLANT_NORMAL,
                         bold ? CAIRO_FONT_WEIGHT_BOLD : CAIRO_FONT_WEIGHT_NORMAL);
  cairo_set_font_size(cr, size);
}

double text_width(cairo_t* cr, const std::string& s) {
  cairo_text_extents_t e;
  cairo_text_extents(cr, s.c_str(), &e);
  return e.x_advance;
}

std::string format_tick(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g", v);
  return buf;
}

// Round tick values 0, step, 2 step, ... <= vmax, step in {1, 2, 2.5, 5} x 10^k, 3 to 6 ticks.
std::vector<double> ticks(double vmax) {
  const double raw = vmax / 5, decade = std::pow(10.0, std::floor(std::log10(raw)));
  double step = 10 * decade;
  for (double m : {1.0, 2.0, 2.5, 5.0})
    if (m * decade >= raw) {
      step = m * decade;
      break;
    }
  std::vector<double> out;
  for (int k = 0; k * step <= vmax * (1 + 1e-9); ++k) out.push_back(k * step);
  return out;
}

// Everything measured before drawing: sizes depend on the text widths.
struct Plan {
  View<const float> w;     // (H, L, S)
  int64_t H, L, S;
  int64_t pool;            // tokens per drawn cell side (1 unless the input is long)
  int rows, cols;          // drawn cells per panel
  int columns, grid_rows;  // panels per row, rows of panels
  double cell, per_token, label_size;
  int64_t label_step;      // label every label_step-th token
  bool rotate_keys;
  std::vector<std::string> q_labels, k_labels;  // per token; empty: not drawn
  double left_w, top_h, panel_title_h, panel_w, panel_h, title_h, bar_h, tick_w;
  float vmax;
  bool per_row;  // colour = weight / its row's largest (vmax 1); else weight / vmax
  std::string title, subtitle;
  HeatmapLayout layout;
};

// A colour bar tick: the weight, or with the per-row rule its share of the row's largest, in percent.
std::string tick_text(const Plan& p, double t) { return p.per_row ? format_tick(100 * t) + "%" : format_tick(t); }

Plan make_plan(cairo_t* cr, View<const float> w, const std::vector<std::string>& query_tokens,
               const std::vector<std::string>& key_tokens, const HeatmapOptions& opt, bool grid) {
  Plan p;
  p.w = w;
  p.H = w.size(0), p.L = w.size(1), p.S = w.size(2);
  p.columns = grid ? (opt.columns > 0 ? opt.columns : static_cast<int>(std::ceil(std::sqrt(double(p.H))))) : 1;
  p.columns = static_cast<int>(std::min<int64_t>(p.columns, p.H));
  p.grid_rows = static_cast<int>((p.H + p.columns - 1) / p.columns);
  // A grid shares the pixel budget a little: panels of a wide grid get smaller.
  const int panel_max = grid ? std::max(128, opt.max_px * 3 / (2 * p.columns)) : opt.max_px;
  const int64_t longest = std::max(p.L, p.S);
  p.pool = (longest + panel_max - 1) / panel_max;
  p.rows = static_cast<int>((p.L + p.pool - 1) / p.pool);
  p.cols = static_cast<int>((p.S + p.pool - 1) / p.pool);
  p.cell = std::clamp(panel_max / std::max(p.rows, p.cols), 1, std::max(1, opt.max_cell));
  p.per_token = p.cell / double(p.pool);
  p.label_size = std::clamp(p.per_token * 0.72, 8.0, 12.0);
  p.label_step = static_cast<int64_t>(std::ceil((p.label_size + 2) / p.per_token));

  set_font(cr, p.label_size);
  const auto& keys = key_tokens.empty() ? query_tokens : key_tokens;
  auto labels = [&](const std::vector<std::string>& tokens, double& widest) {
    std::vector<std::string> out(tokens.size());
    widest = 0;
    for (size_t t = 0; t < tokens.size(); t += p.label_step) {
      out[t] = display_token(tokens[t]);
      if (p.label_step > 1) out[t] = std::to_string(t) + " " + out[t];  // positions are no longer obvious
      widest = std::max(widest, text_width(cr, out[t]));
    }
    return out;
  };
  double q_widest, k_widest;
  p.q_labels = labels(query_tokens, q_widest);
  p.k_labels = labels(keys, k_widest);
  p.rotate_keys = p.label_step > 1 || k_widest > p.per_token - 2;
  p.left_w = std::ceil(q_widest + 8);
  p.top_h = std::ceil((p.rotate_keys ? k_widest : p.label_size) + 8);
  p.panel_title_h = grid ? 18 : 0;
  p.panel_w = p.left_w + p.cols * p.cell;
  p.panel_h = p.panel_title_h + p.top_h + p.rows * p.cell;
  p.title_h = kTitleSize + 6 + kSmallSize + 12;
  p.bar_h = std::clamp(p.rows * p.cell, 120.0, 480.0);

  p.per_row = !(opt.vmax > 0);
  p.vmax = p.per_row ? 1.f : opt.vmax;
  set_font(cr, kSmallSize - 1);
  p.tick_w = 0;
  for (double t : ticks(p.vmax)) p.tick_w = std::max(p.tick_w, text_width(cr, tick_text(p, t)));

  p.title = !opt.title.empty() ? valid_utf8(opt.title) : grid ? "all heads" : "attention";
  p.subtitle = "queries \u2193 " + std::to_string(p.L) + "  \u00b7  keys \u2192 " + std::to_string(p.S);
  if (grid) p.subtitle += "  \u00b7  " + std::to_string(p.H) + " heads";
  if (p.pool > 1)
    p.subtitle += "  \u00b7  each cell: max of " + std::to_string(p.pool) + "\u00d7" + std::to_string(p.pool);
  if (p.per_row) p.subtitle += "  \u00b7  colour: each row relative to its largest weight (100%)";

  const double grid_w = p.columns * p.panel_w + (p.columns - 1) * kGap;
  const double grid_h = p.grid_rows * p.panel_h + (p.grid_rows - 1) * kGap;
  p.layout.width = static_cast<int>(std::ceil(kMargin + grid_w + kGap + kBarWidth + 6 + p.tick_w + kMargin));
  p.layout.height = static_cast<int>(std::ceil(
      kMargin + p.title_h + std::max(grid_h, p.panel_title_h + p.top_h + p.bar_h) + kMargin));
  // Title wider than the picture (short inputs, long titles): widen the picture.
  set_font(cr, kTitleSize, true);
  p.layout.width = std::max<int>(p.layout.width, std::ceil(2 * kMargin + text_width(cr, p.title)));
  set_font(cr, kSmallSize);
  p.layout.width = std::max<int>(p.layout.width, std::ceil(2 * kMargin + text_width(cr, p.subtitle)));
  p.layout.cell = p.cell;
  p.layout.rows = p.rows;
  p.layout.cols = p.cols;
  for (int64_t h = 0; h < p.H; ++h) {
    double x = kMargin + (h % p.columns) * (p.panel_w + kGap);
    double y = kMargin + p.title_h + (h / p.columns) * (p.panel_h + kGap);
    p.layout.panels.push_back({x + p.left_w, y + p.panel_title_h + p.top_h});
  }
  return p;
}

// Cells of head h: drawn cell (r, c) shows the max over its pool x pool block (NaN if any is NaN), of
// the weights relative to their row's largest (per_row) or of the weights.
void draw_cells(cairo_t* cr, const Plan& p, int64_t h, double x0, double y0) {
  const float* base = p.w.data + h * p.w.strides[0];
  std::vector<float> top(size_t(p.L), 1.f);  // (L,) what each row's weights are divided by
  if (p.per_row)
    for (int64_t i = 0; i < p.L; ++i) {
      float m = 0.f;
      for (int64_t j = 0; j < p.S; ++j) {
        const float x = base[i * p.w.strides[1] + j * p.w.strides[2]];
        if (std::isfinite(x)) m = std::max(m, x);
      }
      top[size_t(i)] = m > 0 ? m : 1.f;  // a fully masked row (all 0) stays 0
    }
  cairo_set_antialias(cr, CAIRO_ANTIALIAS_NONE);  // integer-aligned cells: crisp edges
  for (int r = 0; r < p.rows; ++r)
    for (int c = 0; c < p.cols; ++c) {
      float v = -std::numeric_limits<float>::infinity();
      for (int64_t i = r * p.pool; i < std::min(p.L, (r + 1) * p.pool); ++i)
        for (int64_t j = c * p.pool; j < std::min(p.S, (c + 1) * p.pool); ++j) {
          float x = base[i * p.w.strides[1] + j * p.w.strides[2]] / top[size_t(i)];
          v = std::isnan(x) || std::isnan(v) ? NAN : std::max(v, x);
        }
      Rgb col = colour_at(v / p.vmax);
      cairo_set_source_rgb(cr, col.r, col.g, col.b);
      cairo_rectangle(cr, x0 + c * p.cell, y0 + r * p.cell, p.cell, p.cell);
      cairo_fill(cr);
    }
  cairo_set_antialias(cr, CAIRO_ANTIALIAS_DEFAULT);
  cairo_set_line_width(cr, 1);
  if (p.cell >= 10) {  // hairlines between the cells of short inputs
    cairo_set_source_rgba(cr, 1, 1, 1, 0.7);
    for (int c = 1; c < p.cols; ++c) {
      cairo_move_to(cr, x0 + c * p.cell + 0.5, y0);
      cairo_line_to(cr, x0 + c * p.cell + 0.5, y0 + p.rows * p.cell);
    }
    for (int r = 1; r < p.rows; ++r) {
      cairo_move_to(cr, x0, y0 + r * p.cell + 0.5);
      cairo_line_to(cr, x0 + p.cols * p.cell, y0 + r * p.cell + 0.5);
    }
    cairo_stroke(cr);
  }
  cairo_set_source_rgb(cr, 0.55, 0.55, 0.55);
  cairo_set_line_width(cr, 1);
  cairo_rectangle(cr, x0 - 0.5, y0 - 0.5, p.cols * p.cell + 1, p.rows * p.cell + 1);
  cairo_stroke(cr);
}

void draw_labels(cairo_t* cr, const Plan& p, double x0, double y0) {
  set_font(cr, p.label_size);
  cairo_set_source_rgb(cr, 0.15, 0.15, 0.15);
  const double centre_to_baseline = p.label_size * 0.36;
  for (size_t t = 0; t < p.q_labels.size(); ++t) {
    if (p.q_labels[t].empty()) continue;
    double y = y0 + (t + 0.5) * p.per_token + centre_to_baseline;
    cairo_move_to(cr, x0 - 5 - text_width(cr, p.q_labels[t]), y);
    cairo_show_text(cr, p.q_labels[t].c_str());
  }
  for (size_t t = 0; t < p.k_labels.size(); ++t) {
    if (p.k_labels[t].empty()) continue;
    double x = x0 + (t + 0.5) * p.per_token;
    cairo_save(cr);
    if (p.rotate_keys) {  // reads bottom to top, ending just above its column
      cairo_move_to(cr, x + centre_to_baseline, y0 - 5);
      cairo_rotate(cr, -M_PI / 2);
    } else {
      cairo_move_to(cr, x - text_width(cr, p.k_labels[t]) / 2, y0 - 5);
    }
    cairo_show_text(cr, p.k_labels[t].c_str());
    cairo_restore(cr);
  }
}

void draw_colour_bar(cairo_t* cr, const Plan& p, double x, double y) {
  cairo_pattern_t* grad = cairo_pattern_create_linear(0, y + p.bar_h, 0, y);  // bottom = 0, top = vmax
  for (int k = 0; k < kNumStops; ++k)
    cairo_pattern_add_color_stop_rgb(grad, double(k) / (kNumStops - 1), kColourStops[k][0] / 255.0,
                                     kColourStops[k][1] / 255.0, kColourStops[k][2] / 255.0);
  cairo_rectangle(cr, x, y, kBarWidth, p.bar_h);
  cairo_set_source(cr, grad);
  cairo_fill(cr);
  cairo_pattern_destroy(grad);
  cairo_set_source_rgb(cr, 0.55, 0.55, 0.55);
  cairo_set_line_width(cr, 1);
  cairo_rectangle(cr, x - 0.5, y - 0.5, kBarWidth + 1, p.bar_h + 1);
  cairo_stroke(cr);
  set_font(cr, kSmallSize - 1);
  cairo_set_source_rgb(cr, 0.15, 0.15, 0.15);
  for (double t : ticks(p.vmax)) {
    double ty = std::round(y + p.bar_h * (1 - t / p.vmax)) + 0.5;
    cairo_move_to(cr, x + kBarWidth, ty);
    cairo_line_to(cr, x + kBarWidth + 4, ty);
    cairo_stroke(cr);
    cairo_move_to(cr, x + kBarWidth + 6, ty + (kSmallSize - 1) * 0.36);
    cairo_show_text(cr, tick_text(p, t).c_str());
  }
}

void check_tokens(View<const float> w, const std::vector<std::string>& q, const std::vector<std::string>& k) {
  const int64_t L = w.size(-2), S = w.size(-1);
  ATTN_CHECK(L > 0 && S > 0, "Expected weights with L, S >= 1, but got ", to_string(w.shape), " instead");
  ATTN_CHECK(static_cast<int64_t>(q.size()) == L, "Expected ", L, " query_tokens for weights ",
             to_string(w.shape), ", but got ", q.size(), " instead");
  ATTN_CHECK(k.empty() ? L == S : static_cast<int64_t>(k.size()) == S, "Expected ", S, " key_tokens for weights ",
             to_string(w.shape), k.empty() ? " (none given: self-attention needs L == S)" : "", ", but got ",
             k.size(), " instead");
}

HeatmapLayout write_png(const std::string& path, View<const float> w, const std::vector<std::string>& q,
                        const std::vector<std::string>& k, const HeatmapOptions& opt, bool grid) {
  ATTN_CHECK(opt.max_px >= 16, "Expected options.max_px >= 16, but got ", opt.max_px, " instead");
  Surface scratch(cairo_image_surface_create(CAIRO_FORMAT_RGB24, 1, 1), cairo_surface_destroy);
  Context measure(cairo_create(scratch.get()), cairo_destroy);
  Plan p = make_plan(measure.get(), w, q, k, opt, grid);

  Surface surface(cairo_image_surface_create(CAIRO_FORMAT_RGB24, p.layout.width, p.layout.height),
                  cairo_surface_destroy);
  ATTN_CHECK(cairo_surface_status(surface.get()) == CAIRO_STATUS_SUCCESS, "Expected a drawable image size, but got ",
             p.layout.width, "x", p.layout.height, " pixels instead");
  Context ctx(cairo_create(surface.get()), cairo_destroy);
  cairo_t* cr = ctx.get();
  cairo_set_source_rgb(cr, 1, 1, 1);
  cairo_paint(cr);

  cairo_set_source_rgb(cr, 0.1, 0.1, 0.1);
  set_font(cr, kTitleSize, true);
  cairo_move_to(cr, kMargin, kMargin + kTitleSize);
  cairo_show_text(cr, p.title.c_str());
  cairo_set_source_rgb(cr, 0.42, 0.42, 0.42);
  set_font(cr, kSmallSize);
  cairo_move_to(cr, kMargin, kMargin + kTitleSize + 6 + kSmallSize);
  cairo_show_text(cr, p.subtitle.c_str());

  for (int64_t h = 0; h < p.H; ++h) {
    auto [x0, y0] = p.layout.panels[h];
    if (grid) {
      cairo_set_source_rgb(cr, 0.1, 0.1, 0.1);
      set_font(cr, 12, true);
      cairo_move_to(cr, x0, y0 - p.top_h - 6);
      cairo_show_text(cr, ("head " + std::to_string(h)).c_str());
    }
    draw_cells(cr, p, h, x0, y0);
    draw_labels(cr, p, x0, y0);
  }
  const double bar_x = kMargin + p.columns * p.panel_w + (p.columns - 1) * kGap + kGap;
  draw_colour_bar(cr, p, bar_x, p.layout.panels[0].y);

  ATTN_CHECK(cairo_status(cr) == CAIRO_STATUS_SUCCESS, "Expected drawing to succeed, but got Cairo error '",
             cairo_status_to_string(cairo_status(cr)), "' instead");
  cairo_surface_flush(surface.get());
  check_path(path, "the PNG path");
  cairo_status_t st = cairo_surface_write_to_png(surface.get(), path.c_str());
  ATTN_CHECK(st == CAIRO_STATUS_SUCCESS, "Expected a writable PNG path, but got '", path, "' (",
             cairo_status_to_string(st), ") instead");
  return p.layout;
}

}  // namespace

HeatmapLayout write_heatmap_png(const std::string& path, View<const float> weights,
                                const std::vector<std::string>& query_tokens,
                                const std::vector<std::string>& key_tokens, const HeatmapOptions& options) {
  ATTN_CHECK(weights.rank() == 2, "Expected weights of shape (L, S), but got ", to_string(weights.shape), " instead");
  check_tokens(weights, query_tokens, key_tokens);
  View<const float> one(weights.data, {1, weights.shape[0], weights.shape[1]},
                        {0, weights.strides[0], weights.strides[1]});  // (1, L, S)
  return write_png(path, one, query_tokens, key_tokens, options, false);
}

HeatmapLayout write_heads_png(const std::string& path, View<const float> weights,
                              const std::vector<std::string>& query_tokens,
                              const std::vector<std::string>& key_tokens, const HeatmapOptions& options) {
  ATTN_CHECK(weights.rank() == 3 && weights.size(0) > 0, "Expected weights of shape (H, L, S) with H >= 1, but got ",
             to_string(weights.shape), " instead");
  check_tokens(weights, query_tokens, key_tokens);
  return write_png(path, weights, query_tokens, key_tokens, options, true);
}

}  // namespace attn::viz
